// `turnlog acp`: an Agent Client Protocol v1 agent over stdio, driven by the official client
// (@agentclientprotocol/sdk 2.4.0, unchanged). The core cases run in both modes: embedded
// (`--data-dir`) and bridge (`--server`, against a `turnlog serve` of the test's own); the
// bridge also gets cases for the server's other views and for API keys.
//
// The default agent's scripted model answers deterministically (DESIGN.md section 4):
// `hi` -> `echo: hi`; `/think T` thinks T first; `/tool NAME JSON` calls a tool, and once the
// calls are resolved it says `tool results: NAME=CONTENT; ...`; `/words N` + `/delay MS` is
// a slow reply; `/refuse`, `/max_tokens`, `/loop` end with those stop reasons.
//
// Every test also checks, through `withAgent`: the agent exits 0 within 5 s once its stdin
// closes; every stdout line is JSON-RPC 2.0; no update for a session arrives after its
// prompt/load was answered; and the SDK read every update exactly as it was written.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { performance } from "node:perf_hooks";
import {
  AcpClient,
  EVENT_ID,
  Lab,
  SESSION_ID,
  TEST,
  assertCleanExit,
  closeAndWait,
  commandsIn,
  comparable,
  contentText,
  deadline,
  defaultMaxTurnRequests,
  getJson,
  m,
  messageText,
  observeEvents,
  outline,
  rawAgent,
  show,
  showError,
  updatesIn,
  waitFor,
  withAgent,
} from "./helpers.mjs";

const CALC = '/tool calculator {"expression":"2*(3+4)"}';
const FETCH = '/tool fetch_url {"url":"http://example.com/"}';
const PERMISSION_KINDS = ["allow_always", "allow_once", "reject_always", "reject_once"];
/** A cancel must be answered this fast. */
const CANCEL_WITHIN_MS = 5_000;

/** The scripted model's `/words n` reply. */
function words(n) {
  return Array.from({ length: n }, (_, i) => `w${i + 1}`).join(" ");
}

/** An assertion message: what was checked, then what the prompt got. */
function about(what, turn) {
  return `${what}; the prompt's updates and permission requests: ${show(turn.events)}`;
}

/** The one tool call of a turn. */
function onlyToolCall(turn) {
  assert.equal(turn.toolCalls.length, 1, `expected one tool call: ${show(turn.updates)}`);
  return turn.toolCalls[0];
}

/** Starts a slow reply (5 s if left alone) and waits for its first chunk; `{slow}`: the prompt's promise (wrapped, so that awaiting this does not await it). */
async function slowReply(c, sessionId) {
  const from = c.transcript.length;
  const slow = c.prompt(sessionId, "/words 50\n/delay 100");
  slow.catch(() => {}); // awaited by the caller
  await c.waitForUpdate(sessionId, (u) => u.sessionUpdate === "agent_message_chunk", { from, what: "the slow reply's first chunk" });
  return { slow };
}

/** `actual` cut down to the keys of `shape` (recursively), to compare with deepEqual. */
function project(actual, shape) {
  if (!shape || typeof shape !== "object" || !actual || typeof actual !== "object") return actual;
  return Object.fromEntries(Object.keys(shape).map((k) => [k, project(actual[k], shape[k])]));
}

// ---------- the core cases, in both modes ----------

for (const mode of ["embedded", "bridge"]) {
  describe(`turnlog acp (${mode})`, () => {
    /** A fresh data dir (and server, in bridge mode) and a `turnlog acp` driven by `op`. */
    async function run(t, op) {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      return withAgent(lab, target.args, op);
    }

    test("initialize: protocol 1, loadSession, image and embedded-context prompts, no auth methods, agentInfo turnlog", TEST, async (t) => {
      await run(t, async (c) => {
        const init = await c.initialize();
        assert.equal(init.protocolVersion, 1, `protocolVersion: ${show(init)}`);
        assert.equal(init.agentCapabilities?.loadSession, true, `agentCapabilities.loadSession: ${show(init)}`);
        assert.equal(init.agentCapabilities?.promptCapabilities?.image, true, `promptCapabilities.image: ${show(init)}`);
        assert.equal(init.agentCapabilities?.promptCapabilities?.embeddedContext, true, `promptCapabilities.embeddedContext: ${show(init)}`);
        assert.deepEqual(init.authMethods, [], `authMethods: ${show(init)}`);
        assert.equal(init.agentInfo?.name, "turnlog", `agentInfo.name: ${show(init)}`);
      });
    });

    test("a plain prompt: `hi` is answered `echo: hi` with end_turn; nothing arrives after the answer", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        const turn = await c.prompt(sessionId, "hi");
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.equal(turn.text, "echo: hi", about("reply text", turn));
        assert.equal(turn.toolCalls.length, 0, about("number of tool calls", turn));

        // The next request (a second session): nothing for the first one arrives before its answer.
        const other = await c.ok(m.agent.session.new, c.newSessionParams());
        assert.match(other.sessionId, SESSION_ID);
        assert.notEqual(other.sessionId, sessionId, "session/new gave the same id twice");
        const late = updatesIn(c.transcript.slice(turn.answerIndex + 1), sessionId);
        assert.deepEqual(late, [], "updates after the prompt's answer");
      });
    });

    test("a slow reply streams word by word: several agent_message_chunks of one messageId", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        // 60 ms between tokens: longer than the engine's delta coalescing window (25 ms).
        const turn = await c.prompt(sessionId, "stream me word by word\n/delay 60");
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.equal(turn.text, "echo: stream me word by word", about("reply text", turn));
        const chunks = turn.chunks("agent_message_chunk");
        assert.ok(chunks.length >= 2, `expected the reply in several chunks: ${show(chunks)}`);
        const ids = new Set(chunks.map((u) => u.messageId));
        assert.equal(ids.size, 1, `the chunks of one message must share a messageId: ${show(chunks)}`);
      });
    });

    test("thinking: `/think pondering` streams agent_thought_chunks before the reply", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        const turn = await c.prompt(sessionId, "/think pondering\nhello");
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.equal(turn.thought, "pondering", about("thought text", turn));
        assert.equal(turn.text, "echo: hello", about("reply text", turn));
        const kinds = turn.updates.map((u) => u.sessionUpdate);
        const lastThought = kinds.lastIndexOf("agent_thought_chunk");
        const firstText = kinds.indexOf("agent_message_chunk");
        assert.ok(lastThought < firstText, `thought chunks must come before the reply: ${show(kinds)}`);
        const thoughtIds = new Set(turn.chunks("agent_thought_chunk").map((u) => u.messageId));
        assert.equal(thoughtIds.size, 1, `the thought's chunks must share a messageId: ${show(turn.updates)}`);
      });
    });

    test("a trusted tool (calculator) runs without asking: pending, in_progress, completed `14`; reply `tool results: calculator=14`", TEST, async (t) => {
      await run(t, async (c) => {
        c.permissionPolicy = "allow_once"; // none is expected; a request would be recorded and fail below
        const sessionId = await c.openSession();
        const turn = await c.prompt(sessionId, CALC);
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.deepEqual(turn.permissions, [], "calculator is trusted: no permission request");
        const call = onlyToolCall(turn);
        assert.ok(typeof call.toolCallId === "string" && call.toolCallId.length > 0, `toolCallId: ${show(call)}`);
        assert.ok(typeof call.title === "string" && call.title.length > 0, `tool_call title: ${show(call)}`);
        assert.deepEqual(call.rawInput, { expression: "2*(3+4)" }, `tool_call rawInput: ${show(call)}`);
        assert.deepEqual(call.statuses, ["pending", "in_progress", "completed"], about("the tool call's statuses", turn));
        assert.deepEqual(call.content, [{ type: "content", content: { type: "text", text: "14" } }], about("the completed call's content", turn));
        assert.equal(turn.text, "tool results: calculator=14", about("reply text", turn));
      });
    });

    test("an `ask` tool (fetch_url): a permission request for the same toolCallId with four options; allow_once runs it and it fails on the allow-list", TEST, async (t) => {
      await run(t, async (c) => {
        c.permissionPolicy = "allow_once";
        const sessionId = await c.openSession();
        const turn = await c.prompt(sessionId, FETCH);
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        const call = onlyToolCall(turn);
        assert.equal(call.toolKind, "fetch", `fetch_url's tool kind: ${show(call)}`);
        assert.deepEqual(call.rawInput, { url: "http://example.com/" }, `tool_call rawInput: ${show(call)}`);

        assert.equal(turn.permissions.length, 1, `one permission request: ${show(turn.events)}`);
        const [asked] = turn.permissions;
        assert.equal(asked.sessionId, sessionId);
        assert.equal(asked.toolCall?.toolCallId, call.toolCallId, `the request names the tool_call: ${show(asked)}`);
        assert.equal(asked.options.length, 4, `four options: ${show(asked.options)}`);
        assert.deepEqual(asked.options.map((o) => o.kind).sort(), PERMISSION_KINDS, `option kinds: ${show(asked.options)}`);
        for (const o of asked.options) {
          assert.ok(typeof o.optionId === "string" && o.optionId && typeof o.name === "string" && o.name, `option: ${show(o)}`);
        }
        assert.equal(new Set(asked.options.map((o) => o.optionId)).size, 4, `optionIds must differ: ${show(asked.options)}`);

        // Order: the pending tool_call, then the question, and only then in_progress.
        const created = turn.indexOf((e) => e.update?.sessionUpdate === "tool_call");
        const question = turn.indexOf((e) => e.permission);
        const running = turn.indexOf((e) => e.update?.status === "in_progress");
        assert.ok(created >= 0 && created < question && question < running, `tool_call, request_permission, in_progress: ${show(turn.events)}`);
        assert.deepEqual(call.statuses, ["pending", "in_progress", "failed"], about("the tool call's statuses", turn));
        assert.match(contentText(call.content), /allow-list/, `the failure says why: ${show(call)}`);
        assert.ok(turn.text.startsWith("tool results: fetch_url="), turn.text);
        assert.match(turn.text, /allow-list/, turn.text);
      });
    });

    test("allow_always: a later fetch_url in the same session is not asked again", TEST, async (t) => {
      await run(t, async (c) => {
        c.permissionPolicy = "allow_always";
        const sessionId = await c.openSession();
        const first = await c.prompt(sessionId, FETCH);
        assert.equal(first.permissions.length, 1, `the first call is asked: ${show(first.events)}`);
        assert.equal(onlyToolCall(first).status, "failed", about("the first call's final status", first));

        c.permissionPolicy = "cancelled"; // would cancel the call if the agent asked again
        const second = await c.prompt(sessionId, FETCH);
        assert.equal(second.stopReason, "end_turn", about("stop reason", second));
        assert.deepEqual(second.permissions, [], "no permission request after allow_always");
        const call = onlyToolCall(second);
        assert.notEqual(call.toolCallId, onlyToolCall(first).toolCallId, "a new call has a new toolCallId");
        assert.deepEqual(call.statuses, ["pending", "in_progress", "failed"], about("the second call's statuses", second));
        assert.match(contentText(call.content), /allow-list/, `the failure says why: ${show(call)}`);
      });
    });

    test("reject_once: the call fails with a denial and the turn goes on (`tool results: fetch_url=Tool call denied`)", TEST, async (t) => {
      await run(t, async (c) => {
        c.permissionPolicy = "reject_once";
        const sessionId = await c.openSession();
        const turn = await c.prompt(sessionId, FETCH);
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.equal(turn.permissions.length, 1, about("number of permission requests", turn));
        const call = onlyToolCall(turn);
        assert.equal(call.status, "failed", about("the rejected call's final status", turn));
        assert.ok(!call.statuses.includes("in_progress"), `a rejected call never runs: ${show(call.statuses)}`);
        assert.match(contentText(call.content), /denied/i, `the rejected call's content: ${show(call)}`);
        assert.equal(turn.text, "tool results: fetch_url=Tool call denied", about("reply text", turn));
      });
    });

    test("stop reasons: refusal, max_tokens (after some text), max_turn_requests; the session goes on", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        const refused = await c.prompt(sessionId, "/refuse");
        assert.equal(refused.stopReason, "refusal", about("stop reason", refused));

        const cut = await c.prompt(sessionId, "/max_tokens");
        assert.equal(cut.stopReason, "max_tokens", about("stop reason", cut));
        assert.ok(cut.text.length > 0, `max_tokens comes after some text: ${show(cut.updates)}`);

        const looped = await c.prompt(sessionId, "/loop");
        assert.equal(looped.stopReason, "max_turn_requests", about("stop reason", looped));
        const limit = defaultMaxTurnRequests();
        assert.equal(looped.toolCalls.length, limit, `one calculator call per model request, ${limit} requests: ${show(looped.updates)}`);
        for (const call of looped.toolCalls) assert.equal(call.status, "completed", `each loop call completes: ${show(call)}`);

        const after = await c.prompt(sessionId, "still there?");
        assert.equal(after.stopReason, "end_turn");
        assert.equal(after.text, "echo: still there?");
      });
    });

    test("session/cancel during a slow reply: the prompt answers `cancelled` within 5 s; the session takes a new prompt", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        const { slow } = await slowReply(c, sessionId);
        const cancelledAt = performance.now();
        await c.cancel(sessionId);
        const turn = await slow; // an error answer fails inside prompt()
        assert.equal(turn.stopReason, "cancelled", about("stop reason", turn));
        const took = turn.answeredAt - cancelledAt;
        assert.ok(took < CANCEL_WITHIN_MS, `cancel answered after ${Math.round(took)} ms`);
        const full = words(50);
        assert.ok(full.startsWith(turn.text) && turn.text.length < full.length, `a cut-off prefix of the reply: ${show(turn.text)}`);

        const next = await c.prompt(sessionId, "after cancel");
        assert.equal(next.stopReason, "end_turn", about("stop reason", next));
        assert.equal(next.text, "echo: after cancel");
      });
    });

    test("session/cancel while a permission request is pending: the client answers it cancelled; the prompt ends cancelled, the call failed", TEST, async (t) => {
      await run(t, async (c) => {
        c.permissionPolicy = "hold";
        const sessionId = await c.openSession();
        const asking = c.prompt(sessionId, FETCH);
        asking.catch(() => {}); // awaited below
        const held = await c.waitForHeldPermission();
        assert.equal(held.params.sessionId, sessionId);
        const cancelledAt = performance.now();
        await c.cancel(sessionId);
        held.answer("cancelled"); // as the spec says a client must, after session/cancel
        const turn = await asking;
        assert.equal(turn.stopReason, "cancelled", about("stop reason", turn));
        assert.ok(turn.answeredAt - cancelledAt < CANCEL_WITHIN_MS, `cancel answered after ${Math.round(turn.answeredAt - cancelledAt)} ms`);
        const call = onlyToolCall(turn);
        assert.equal(call.toolCallId, held.params.toolCall.toolCallId, about("the held request names the tool call", turn));
        assert.equal(call.status, "failed", `the cancelled call ends failed: ${show(turn.updates)}`);
        assert.ok(!call.statuses.includes("in_progress"), `it never ran: ${show(call.statuses)}`);

        c.permissionPolicy = "cancelled";
        const next = await c.prompt(sessionId, "after cancel");
        assert.equal(next.stopReason, "end_turn", about("stop reason", next));
        assert.equal(next.text, "echo: after cancel");
      });
    });

    test("a second session/prompt while one runs is refused with a JSON-RPC error; the first ends normally", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        const from = c.transcript.length;
        const first = c.prompt(sessionId, "/words 10\n/delay 100");
        first.catch(() => {}); // awaited below
        await c.waitForUpdate(sessionId, (u) => u.sessionUpdate === "agent_message_chunk", { from, what: "the first prompt's first chunk" });
        const refused = await c.fails(m.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: "second" }] });
        assert.equal(typeof refused.message, "string", `the error has a message: ${show(refused)}`);
        const turn = await first;
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.equal(turn.text, words(10), about("reply text", turn));
      });
    });

    test("bad requests: unknown session -32002 with data.sessionId, bad prompt params -32602, a prompt over the event size limit -32602, unknown method -32601; the agent keeps serving", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        const unknown = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"; // well formed, never created
        const notFound = await c.fails(m.agent.session.prompt, { sessionId: unknown, prompt: [{ type: "text", text: "hi" }] });
        assert.equal(notFound.code, -32002, `unknown session: ${showError(notFound)}`);
        assert.equal(notFound.data?.sessionId, unknown, `error data: ${show(notFound.data)}`);

        const badParams = [
          { sessionId }, // no prompt
          { sessionId, prompt: "hi" }, // not a list of blocks
          { sessionId, prompt: [{ type: "text" }] }, // a text block without text
          { prompt: [{ type: "text", text: "hi" }] }, // no session id
          { sessionId: 42, prompt: [{ type: "text", text: "hi" }] }, // not a string
        ];
        for (const params of badParams) {
          const error = await c.fails(m.agent.session.prompt, params);
          assert.equal(error.code, -32602, `session/prompt ${show(params)}: ${showError(error)}`);
        }

        // A prompt whose event would be over the limit (`limits.max_event_bytes`, 1 MiB) is
        // refused as the other views refuse it; the session goes on (below).
        const huge = await c.fails(m.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: "x".repeat(1 << 20) }] });
        assert.equal(huge.code, -32602, `an oversized prompt: ${showError(huge)}`);
        assert.match(String(huge.data), /^event 0 \(user\.message\) is \d+ bytes; the limit is 1048576$/, showError(huge));

        const noMethod = await c.fails("turnlog/no_such_method", {});
        assert.equal(noMethod.code, -32601, `unknown method: ${showError(noMethod)}`);

        const turn = await c.prompt(sessionId, "still serving");
        assert.equal(turn.stopReason, "end_turn");
        assert.equal(turn.text, "echo: still serving");
      });
    });

    test("a malformed JSON line gets {id: null, error -32700} and the agent keeps serving (raw stdio)", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const raw = rawAgent(lab, target.args);
      const parseError = (msg) => msg.id === null && msg.error?.code === -32700;

      raw.send("{this is not json");
      const first = await raw.waitForLine(parseError, { what: "a -32700 answer to the bad line" });
      assert.equal(first.msg.jsonrpc, "2.0", first.line);
      assert.equal(typeof first.msg.error.message, "string", first.line);

      let from = raw.lines.length;
      const init = { protocolVersion: 1, clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false } };
      raw.send(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: init }));
      const initialized = await raw.waitForLine((msg) => msg.id === 1, { from, what: "the initialize answer" });
      assert.equal(initialized.msg.result?.protocolVersion, 1, initialized.line);

      from = raw.lines.length;
      raw.send("][ still not json");
      await raw.waitForLine(parseError, { from, what: "a -32700 answer to the second bad line" });
      from = raw.lines.length;
      raw.send(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "session/new", params: { cwd: raw.child.cwd, mcpServers: [] } }));
      const created = await raw.waitForLine((msg) => msg.id === 2, { from, what: "the session/new answer" });
      assert.match(created.msg.result?.sessionId ?? "", SESSION_ID, created.line);

      const exit = await closeAndWait(raw.child);
      assertCleanExit(exit, raw.child);
      for (const line of raw.lines) {
        let msg;
        assert.doesNotThrow(() => (msg = JSON.parse(line)), `a stdout line that is not JSON: ${show(line)}`);
        assert.equal(msg.jsonrpc, "2.0", `not JSON-RPC 2.0: ${line}`);
      }
    });

    test("restart: the agent exits 0 soon after stdin closes; a new process loads the session, replays the whole conversation before answering, and takes a new prompt", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const prompts = ["hi", "/think pondering\nhello", `/think hmm\n${CALC}`, FETCH];

      const first = await withAgent(lab, target.args, async (c) => {
        c.permissionPolicy = "allow_once";
        const sessionId = await c.openSession();
        const turns = [];
        for (const prompt of prompts) turns.push(await c.prompt(sessionId, prompt));
        assert.deepEqual(turns.map((x) => x.stopReason), ["end_turn", "end_turn", "end_turn", "end_turn"]);
        assert.equal(turns[0].text, "echo: hi");
        assert.equal(turns[1].thought, "pondering");
        assert.equal(turns[2].text, "tool results: calculator=14");
        assert.equal(onlyToolCall(turns[3]).status, "failed");
        return { sessionId, turns };
      });
      // withAgent asserted exit code 0 within EXIT_WITHIN_MS of closing stdin
      t.diagnostic(`first agent exited ${first.exit.code} ${Math.round(first.exit.ms)} ms after its stdin closed`);
      const { sessionId, turns } = first.result;
      // What the live updates said, with each prompt (not echoed live) in front of its turn.
      const expected = turns.flatMap((turn, i) => [{ kind: "user", text: prompts[i] }, ...comparable(turn.items)]);

      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const startedIn = performance.now() - c.child.spawnedAt;
        t.diagnostic(`second agent answered initialize ${Math.round(startedIn)} ms after it was spawned`);
        assert.ok(startedIn < 5_000, `the new agent took ${Math.round(startedIn)} ms to answer initialize (is the old lock released?)`);

        const loaded = await c.load(sessionId);
        assert.deepEqual(Object.keys(loaded.wire ?? {}).sort(), ["configOptions", "modes"], `session/load answers the session's modes and config options only: ${show(loaded.wire)}`);
        assert.equal(loaded.wire.modes.currentModeId, "code", show(loaded.wire));
        const replay = loaded.updates;
        const allowed = ["user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call"];
        const info = replay.pop();
        assert.equal(info?.sessionUpdate, "session_info_update", `a replay ends with the session's info: ${show(info)}`);
        const strays = replay.filter((u) => !allowed.includes(u.sessionUpdate));
        assert.deepEqual(strays, [], "a replay is made of message chunks and tool_calls, then the session's info");
        for (const u of replay.filter((x) => x.sessionUpdate === "tool_call")) {
          assert.ok(["completed", "failed"].includes(u.status), `a replayed tool_call carries its final status: ${show(u)}`);
        }
        const items = outline(replay);
        const agentItems = items.filter((i) => i.kind === "agent" || i.kind === "thought").length;
        const agentChunks = replay.filter((u) => ["agent_message_chunk", "agent_thought_chunk"].includes(u.sessionUpdate) && u.content?.text).length;
        assert.equal(agentChunks, agentItems, `one chunk per agent message or thought: ${show(replay)}`);
        assert.deepEqual(comparable(items), expected, `the replay must say what the live prompts said; replay: ${show(replay)}`);

        const after = await c.prompt(sessionId, "after reload");
        assert.equal(after.stopReason, "end_turn", about("stop reason", after));
        assert.equal(after.text, "echo: after reload");
      });
    });

    test("an agent killed (SIGKILL) while it asks for a permission leaves nothing stuck: a new process loads the waiting call, and a new prompt closes it and goes on", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const child = lab.spawn(target.args);
      const doomed = new AcpClient(child);
      doomed.permissionPolicy = "hold";
      let sessionId;
      await doomed
        .app()
        .connectWith(doomed.stream(), async (agent) => {
          doomed.agent = agent;
          sessionId = await doomed.openSession();
          const prompt = agent.request(m.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: FETCH }] });
          prompt.catch(() => {}); // never answered: the agent dies first
          await waitFor(() => doomed.held.length > 0, 10_000, () => "the permission request");
          child.kill("SIGKILL");
          await deadline(child.exited, 5_000, "the killed agent to exit");
        })
        .catch(() => {}); // the connection dies with the agent
      assert.match(sessionId ?? "", SESSION_ID, "the session was made before the kill");

      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const before = outline((await c.load(sessionId)).updates).filter((i) => i.kind === "tool");
        assert.deepEqual(before.map((i) => i.status), ["pending"], `the call still waits: ${show(before)}`);
        const turn = await c.prompt(sessionId, "hi again");
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.equal(turn.text, "echo: hi again");
        const after = outline((await c.load(sessionId)).updates).filter((i) => i.kind === "tool");
        assert.deepEqual(after.map((i) => i.status), ["failed"], `the waiting call was closed: ${show(after)}`);
      });
    });

    test("session/list: this agent's ACP sessions newest first, with their cwd, filtered by cwd; a bad cursor is -32602", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      await withAgent(lab, target.args, async (c) => {
        const init = await c.initialize();
        assert.deepEqual(init.agentCapabilities?.sessionCapabilities?.list, {}, `list is offered: ${show(init)}`);
        const here = lab.tempDir("turnlog-cwd-a-");
        const there = lab.tempDir("turnlog-cwd-b-");
        const { sessionId: first } = await c.ok(m.agent.session.new, { cwd: here, mcpServers: [] });
        const { sessionId: second } = await c.ok(m.agent.session.new, { cwd: there, mcpServers: [] });
        const all = await c.ok(m.agent.session.list, {});
        assert.deepEqual(
          all.sessions.map((s) => [s.sessionId, s.cwd]),
          [[second, there], [first, here]],
          `newest first, each with its cwd: ${show(all)}`,
        );
        const inHere = await c.ok(m.agent.session.list, { cwd: here });
        assert.deepEqual(inHere.sessions.map((s) => s.sessionId), [first], `only the session made in ${here}: ${show(inHere)}`);
        const bad = await c.fails(m.agent.session.list, { cursor: "not-a-cursor" });
        assert.equal(bad.code, -32602, showError(bad));
      });
    });

    test("plans: each `update_plan` call that ran arrives as a `plan` update (after its tool call, kind think), in order; a new process's load replays them; the native event API has the calls", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const plans = [
        [{ content: "read the code", status: "in_progress", priority: "high" }, { content: "write the fix", status: "pending" }],
        [{ content: "read the code", status: "completed", priority: "high" }, { content: "write the fix", status: "in_progress", priority: "low" }],
      ];
      // As ACP says them: the priority is always given (medium unless the model said).
      const expected = plans.map((entries) => entries.map((e) => ({ content: e.content, priority: e.priority ?? "medium", status: e.status })));
      const first = await withAgent(lab, target.args, async (c) => {
        const sessionId = await c.openSession();
        const said = [];
        for (const entries of plans) {
          const turn = await c.prompt(sessionId, `/tool update_plan ${JSON.stringify({ entries })}`);
          const call = onlyToolCall(turn);
          assert.equal(call.toolKind, "think", `the planning tool is of kind think: ${show(call)}`);
          assert.equal(call.status, "completed", about("the plan tool ran", turn));
          const at = (kind) => turn.updates.findIndex((u) => u.sessionUpdate === kind);
          const planAt = at("plan");
          assert.ok(planAt > turn.updates.findIndex((u) => u.sessionUpdate === "tool_call_update" && u.status === "completed"), about("the plan comes once its call ran", turn));
          said.push(...turn.updates.filter((u) => u.sessionUpdate === "plan").map((u) => u.entries));
          assert.match(turn.text, /^tool results: update_plan=Plan updated, 2 steps: /, about("the model reads where the plan stands", turn));
        }
        assert.deepEqual(said, expected, "one plan update per call, in order");
        const wrong = await c.prompt(sessionId, '/tool update_plan {"entries":[{"content":"x","status":"done"}]}');
        assert.equal(onlyToolCall(wrong).status, "failed", about("a wrong plan fails its call", wrong));
        assert.deepEqual(wrong.updates.filter((u) => u.sessionUpdate === "plan"), [], about("and is not shown as the plan", wrong));
        return sessionId;
      });
      const sessionId = first.result;
      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const { updates } = await c.load(sessionId);
        assert.deepEqual(updates.filter((u) => u.sessionUpdate === "plan").map((u) => u.entries), expected, `the load replays the plans in order: ${show(updates)}`);
      });
      if (mode === "bridge") {
        const page = await getJson(`${target.server.url}/sessions/${sessionId}/events?limit=500`);
        const calls = page.data.filter((e) => e.type === "agent.tool_use" && e.name === "update_plan").map((e) => e.input.entries);
        assert.deepEqual(calls.slice(0, 2), plans, "the native event API has each plan as its call's input");
      }
    });

    test("modes: ask, code and plan from the agent's config (code at first); in `ask` the trusted calculator asks; in `plan` a tool the mode does not allow is refused, unasked, saying why; a change during a prompt arrives as current_mode_update; the mode is in the log", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const first = await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const created = await c.ok(m.agent.session.new, c.newSessionParams());
        const { sessionId, modes } = created;
        assert.equal(modes?.currentModeId, "code", `session/new answers the modes: ${show(created)}`);
        assert.deepEqual(modes.availableModes.map((x) => [x.id, x.name]), [["ask", "Ask"], ["code", "Code"], ["plan", "Plan"]]);
        assert.ok(modes.availableModes.every((x) => x.description), `each mode says what it does: ${show(modes)}`);

        await c.ok(m.agent.session.setMode, { sessionId, modeId: "ask" });
        c.permissionPolicy = "allow_once";
        const asked = await c.prompt(sessionId, CALC);
        assert.equal(asked.permissions.length, 1, about("in ask mode the trusted calculator asks", asked));
        assert.equal(asked.text, "tool results: calculator=14");

        await c.ok(m.agent.session.setMode, { sessionId, modeId: "plan" });
        const refused = await c.prompt(sessionId, FETCH);
        assert.equal(refused.permissions.length, 0, about("in plan mode fetch_url is not asked about", refused));
        assert.equal(onlyToolCall(refused).status, "failed", about("it is refused", refused));
        assert.match(refused.text, /fetch_url=Tool call denied: the session's mode \(plan\) does not allow "fetch_url"/, about("saying why", refused));
        const allowed = await c.prompt(sessionId, CALC);
        assert.equal(allowed.permissions.length, 0, about("plan mode allows the calculator, unasked", allowed));
        assert.equal(allowed.text, "tool results: calculator=14");

        const { slow } = await slowReply(c, sessionId);
        await c.ok(m.agent.session.setMode, { sessionId, modeId: "code" });
        const during = await slow;
        const changes = during.updates.filter((u) => u.sessionUpdate === "current_mode_update");
        assert.deepEqual(changes.map((u) => u.currentModeId), ["code"], about("the change arrives with the prompt running", during));

        const bad = await c.fails(m.agent.session.setMode, { sessionId, modeId: "yolo" });
        assert.equal(bad.code, -32602, showError(bad));
        assert.match(String(bad.data), /no mode "yolo"; it has: ask, code, plan/, showError(bad));
        return sessionId;
      });
      const sessionId = first.result;
      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const loaded = await c.load(sessionId);
        assert.equal(loaded.result.modes?.currentModeId, "code", `a new process loads the mode from the log: ${show(loaded.wire)}`);
      });
      if (mode === "bridge") {
        const page = await getJson(`${target.server.url}/sessions/${sessionId}/events?limit=500`);
        const changes = page.data.filter((e) => e.type === "session.updated").map((e) => e.mode);
        assert.deepEqual(changes, ["ask", "plan", "code"], "each change is in the log");
        const now = await getJson(`${target.server.url}/sessions/${sessionId}/mode`);
        assert.equal(now.mode, "code", show(now));
      }
    });

    test("models: config options offer the mode and the model (default, second); session/set_config_option changes the model in the log, the next prompt runs it (/whoami); a change during a prompt arrives as config_option_update; a new process loads it; an unknown value is -32602", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const option = (options, id) => options?.find((o) => o.id === id);
      const first = await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const created = await c.ok(m.agent.session.new, c.newSessionParams());
        const { sessionId, configOptions } = created;
        assert.deepEqual(configOptions?.map((o) => [o.id, o.category, o.type, o.currentValue]), [["mode", "mode", "select", "code"], ["model", "model", "select", "default"]], show(created));
        assert.deepEqual(option(configOptions, "model").options.map((o) => [o.value, o.name]), [["default", "scripted"], ["second", "scripted-second"]]);
        assert.equal((await c.prompt(sessionId, "/whoami")).text, "model: scripted");

        const changed = await c.ok(m.agent.session.setConfigOption, { sessionId, configId: "model", value: "second" });
        assert.equal(option(changed.configOptions, "model")?.currentValue, "second", show(changed));
        assert.equal((await c.prompt(sessionId, "/whoami")).text, "model: scripted-second", "the next prompt runs the chosen model");

        const { slow } = await slowReply(c, sessionId);
        await c.ok(m.agent.session.setConfigOption, { sessionId, configId: "mode", value: "ask" });
        await c.ok(m.agent.session.setConfigOption, { sessionId, configId: "model", value: "default" });
        await c.ok(m.agent.session.setConfigOption, { sessionId, configId: "model", value: "second" });
        const during = await slow;
        const updates = during.updates.filter((u) => u.sessionUpdate === "config_option_update");
        const values = updates.map((u) => [option(u.configOptions, "mode")?.currentValue, option(u.configOptions, "model")?.currentValue]);
        assert.deepEqual(values.at(-1), ["ask", "second"], about("each change arrives as config_option_update", during));
        assert.equal(updates.length, 3, about("one update per change", during));
        assert.deepEqual(during.updates.filter((u) => u.sessionUpdate === "current_mode_update").map((u) => u.currentModeId), ["ask"], "and as current_mode_update");

        const bad = await c.fails(m.agent.session.setConfigOption, { sessionId, configId: "model", value: "gpt-9" });
        assert.equal(bad.code, -32602, showError(bad));
        assert.match(String(bad.data), /offers no model "gpt-9"; it offers: default, second/, showError(bad));
        const unknown = await c.fails(m.agent.session.setConfigOption, { sessionId, configId: "temperature", value: "hot" });
        assert.equal(unknown.code, -32602, showError(unknown));
        return sessionId;
      });
      const sessionId = first.result;
      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const loaded = await c.load(sessionId);
        assert.equal(option(loaded.result.configOptions, "model")?.currentValue, "second", `a new process loads the model from the log: ${show(loaded.wire)}`);
        assert.equal(option(loaded.result.configOptions, "mode")?.currentValue, "ask", show(loaded.wire));
        assert.equal((await c.prompt(sessionId, "/whoami")).text, "model: scripted-second");
      });
      if (mode === "bridge") {
        const page = await getJson(`${target.server.url}/sessions/${sessionId}/events?limit=500`);
        const starts = page.data.filter((e) => e.type === "span.model_request_start").map((e) => e.model);
        assert.deepEqual(starts.slice(0, 2), ["scripted", "scripted-second"], "the log says which model answered");
        assert.deepEqual(page.data.filter((e) => e.type === "session.updated" && e.model).map((e) => e.model), ["second", "default", "second"]);
        const now = await getJson(`${target.server.url}/sessions/${sessionId}/model`);
        assert.deepEqual(now, { model: "second", models: [{ id: "default", name: "scripted" }, { id: "second", name: "scripted-second" }] });
      }
    });

    test("commands: available_commands_update lists /compact, /fork, /mode and /model (with their choices) once the client knows the session, and again on a load; /mode and /model change the session in the log; /fork makes a fork with the conversation so far; /compact summarises the conversation in a turn of its own, which a load shows; a command used wrongly says how", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const said = (turn) => [turn.stopReason, turn.text];
      const first = await withAgent(lab, target.args, async (c) => {
        const sessionId = await c.openSession();
        const listed = await waitFor(() => commandsIn(c.transcript, sessionId)[0], 5_000, () => "the session's commands");
        assert.deepEqual(
          listed.availableCommands.map((x) => [x.name, x.input?.hint]),
          [["compact", undefined], ["fork", undefined], ["mode", "ask, code, plan"], ["model", "default, second"]],
          show(listed),
        );
        assert.ok(listed.availableCommands.every((x) => x.description), show(listed));
        await c.prompt(sessionId, "hi");

        const moded = await c.prompt(sessionId, "/mode plan");
        assert.deepEqual(said(moded), ["end_turn", "The mode is plan from the next turn on."]);
        assert.deepEqual(moded.updates.filter((u) => u.sessionUpdate === "current_mode_update").map((u) => u.currentModeId), ["plan"], show(moded.updates));
        const modeled = await c.prompt(sessionId, "/model second");
        assert.deepEqual(said(modeled), ["end_turn", "The model is second from the next turn on."]);
        assert.equal((await c.prompt(sessionId, "/whoami")).text, "model: scripted-second");
        const wrong = await c.prompt(sessionId, "/mode");
        assert.deepEqual(said(wrong), ["end_turn", "/mode needs one of: ask, code, plan"]);
        const unknown = await c.prompt(sessionId, "/model gpt-9");
        assert.match(unknown.text, /^\/model: invalid field `model`: agent "default" offers no model "gpt-9"; it offers: default, second$/, unknown.text);

        const forked = await c.prompt(sessionId, "/fork");
        const fork = /^Forked this session as (sess_\w+): /.exec(forked.text)?.[1];
        assert.ok(fork, `the answer names the fork: ${forked.text}`);
        const listedSessions = await c.ok(m.agent.session.list, { cwd: c.child.cwd });
        assert.ok(listedSessions.sessions.some((x) => x.sessionId === fork), `the fork is in the session list: ${show(listedSessions)}`);

        const compacted = await c.prompt(sessionId, "/compact");
        assert.equal(compacted.stopReason, "end_turn", show(compacted.updates));
        assert.match(compacted.text, /^\[Conversation compacted: 4 earlier messages summarised, about \d+ → \d+ tokens\.\]$/, compacted.text);
        const nothing = await c.prompt(sessionId, "/compact");
        assert.deepEqual(said(nothing), ["end_turn", "Nothing to compact yet."], "a conversation of one summary is left as it is");
        assert.equal((await c.prompt(sessionId, "hello again")).text, "echo: hello again", "the session goes on from the summary");
        return { sessionId, fork };
      });
      const { sessionId, fork } = first.result;
      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const loaded = await c.load(fork);
        const texts = loaded.updates.filter((u) => u.sessionUpdate === "agent_message_chunk").map((u) => u.content.text);
        assert.deepEqual(texts, ["echo: hi", "model: scripted-second"], `the fork has the conversation so far (commands are not turns): ${show(loaded.updates)}`);
        assert.equal(loaded.result.modes.currentModeId, "plan", "and the source's mode");
        assert.equal(commandsIn(c.transcript, fork).length, 1, "a load lists the commands");
        const source = await c.load(sessionId);
        assert.equal(source.result.modes.currentModeId, "plan", "the mode is in the log");
        const replayed = source.updates.filter((u) => u.sessionUpdate === "agent_message_chunk").map((u) => u.content.text);
        assert.ok(replayed.some((text) => text.startsWith("[Conversation compacted: 4 earlier messages")), `a load shows the compaction where it was: ${show(replayed)}`);
      });
    });

    test("usage: with a known context window, each model request that ended well arrives as usage_update (its tokens, of the window); the context grows turn by turn; a load or a resume ends with the last one", TEST, async (t) => {
      const lab = new Lab(t);
      const config = path.join(lab.tempDir("turnlog-config-"), "config.toml");
      fs.writeFileSync(config, '[agents.windowed]\nmodel = { provider = "scripted", name = "scripted" }\ncontext = { window = 100000 }\n');
      const agent = ["--agent", "windowed"];
      const args =
        mode === "embedded"
          ? ["acp", "--data-dir", lab.tempDir("turnlog-data-"), "--config", config, ...agent]
          : ["acp", "--server", (await lab.startServer({ config })).url, ...agent];
      const first = await withAgent(lab, args, async (c) => {
        const sessionId = await c.openSession();
        const turns = [await c.prompt(sessionId, "hi"), await c.prompt(sessionId, "hello again, with a few more words")];
        const usages = turns.map((turn) => turn.updates.filter((u) => u.sessionUpdate === "usage_update"));
        for (const [i, u] of usages.entries()) {
          assert.equal(u.length, 1, about(`one model request, one usage_update (turn ${i})`, turns[i]));
          assert.equal(u[0].size, 100000, show(u[0]));
          assert.ok(u[0].used > 0, show(u[0]));
        }
        assert.ok(usages[1][0].used > usages[0][0].used, `the context grows: ${show(usages)}`);
        return { sessionId, last: usages[1][0] };
      });
      const { sessionId, last } = first.result;
      await withAgent(lab, args, async (c) => {
        await c.initialize();
        const { updates } = await c.load(sessionId);
        assert.deepEqual(updates.at(-1), last, `a load ends with the context's usage: ${show(updates.slice(-3))}`);
        const resumed = await c.call(m.agent.session.resume, { sessionId, cwd: c.child.cwd, mcpServers: [] });
        const kinds = updatesIn(resumed.window, sessionId);
        assert.deepEqual(kinds.map((u) => u.sessionUpdate), ["session_info_update", "usage_update"], show(kinds));
        assert.deepEqual(kinds[1], last);
      });
    });

    test("session/delete: the session leaves session/list and loads no more (-32002), its prompt cancelled first; the other goes on; an unknown session is -32002", TEST, async (t) => {
      await run(t, async (c) => {
        const init = await c.initialize();
        assert.deepEqual(init.agentCapabilities?.sessionCapabilities?.delete, {}, `delete is offered: ${show(init)}`);
        const { sessionId: kept } = await c.ok(m.agent.session.new, c.newSessionParams());
        const { sessionId: gone } = await c.ok(m.agent.session.new, c.newSessionParams());
        const { slow } = await slowReply(c, gone);
        const deleted = await c.call(m.agent.session.delete, { sessionId: gone });
        assert.equal(deleted.error, undefined, `session/delete: ${deleted.error && showError(deleted.error)}`);
        const turn = await slow;
        assert.equal(turn.stopReason, "cancelled", about("the deleted session's prompt", turn));
        assert.ok(turn.answerIndex < deleted.answerIndex, "the prompt is answered before the delete");

        const listed = await c.ok(m.agent.session.list, {});
        assert.deepEqual(listed.sessions.map((s) => s.sessionId), [kept], `only the kept session is listed: ${show(listed)}`);
        const load = await c.fails(m.agent.session.load, { sessionId: gone, cwd: c.child.cwd, mcpServers: [] });
        assert.equal(load.code, -32002, showError(load));
        // (The SDK hands its caller success for a `-32002` to a delete or a close, as ACP
        // recommends: the end state is the same. The agent's own answer is read from the wire.)
        const again = await c.call(m.agent.session.delete, { sessionId: gone });
        const refused = c.transcript[again.answerIndex].msg;
        assert.equal(refused.error?.code, -32002, `a second delete: ${show(refused)}`);
        assert.equal((await c.prompt(kept, "still here")).text, "echo: still here");
      });
    });

    test("session/resume: a new process reattaches without a replay (only the session's info: no title, its last change), and the next prompt goes on", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const first = await withAgent(lab, target.args, async (c) => {
        const sessionId = await c.openSession();
        assert.equal((await c.prompt(sessionId, "hi")).text, "echo: hi");
        return sessionId;
      });
      const sessionId = first.result;
      await withAgent(lab, target.args, async (c) => {
        const init = await c.initialize();
        const offered = init.agentCapabilities?.sessionCapabilities ?? {};
        for (const name of ["resume", "close", "fork"]) assert.deepEqual(offered[name], {}, `${name} is offered: ${show(init)}`);
        const params = { sessionId, cwd: c.child.cwd, mcpServers: [] };
        const reply = await c.call(m.agent.session.resume, params);
        assert.equal(reply.error, undefined, `session/resume: ${reply.error && showError(reply.error)}`);
        const updates = updatesIn(reply.window, sessionId);
        assert.deepEqual(updates.map((u) => u.sessionUpdate), ["session_info_update"], `no replay, only the session's info: ${show(updates)}`);
        assert.equal(updates[0].title, null, `an ACP session has no title until one is given: ${show(updates[0])}`);
        assert.ok(!Number.isNaN(Date.parse(updates[0].updatedAt)), `updatedAt is a time: ${show(updates[0])}`);
        const next = await c.prompt(sessionId, "after resume");
        assert.equal(next.text, "echo: after resume", about("the resumed session goes on", next));

        const unknown = await c.fails(m.agent.session.resume, { ...params, sessionId: "sess_01JD0000000000000000000000" });
        assert.equal(unknown.code, -32002, showError(unknown));
        const relative = await c.fails(m.agent.session.resume, { ...params, cwd: "relative/dir" });
        assert.equal(relative.code, -32602, showError(relative));
      });
    });

    test("session/close cancels the session's prompt (answered `cancelled` before the close); a prompt is then refused until the session is resumed", TEST, async (t) => {
      await run(t, async (c) => {
        const sessionId = await c.openSession();
        const { slow } = await slowReply(c, sessionId);
        const closed = await c.call(m.agent.session.close, { sessionId });
        assert.equal(closed.error, undefined, `session/close: ${closed.error && showError(closed.error)}`);
        const turn = await slow;
        assert.equal(turn.stopReason, "cancelled", about("the closed session's prompt", turn));
        assert.ok(turn.answerIndex < closed.answerIndex, "the prompt is answered before the close");

        const refused = await c.fails(m.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: "closed?" }] });
        assert.equal(refused.code, -32600, showError(refused));
        assert.match(String(refused.data), /closed/, showError(refused));

        await c.ok(m.agent.session.resume, { sessionId, cwd: c.child.cwd, mcpServers: [] });
        const next = await c.prompt(sessionId, "after close");
        assert.equal(next.text, "echo: after close", about("a resumed session takes prompts again", next));

        // A close and a resume sent together, the resume before the close is answered: the
        // session ends open, as the later request says.
        const params = { sessionId, cwd: c.child.cwd, mcpServers: [] };
        await Promise.all([c.ok(m.agent.session.close, { sessionId }), c.ok(m.agent.session.resume, params)]);
        const last = await c.prompt(sessionId, "after both");
        assert.equal(last.text, "echo: after both", about("the resume, sent last, holds", last));
      });
    });

    test("session/fork: a new session in the fork's cwd with the conversation so far (its load replays it); the two go on apart", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      await withAgent(lab, target.args, async (c) => {
        const sessionId = await c.openSession();
        const before = [await c.prompt(sessionId, "hi"), await c.prompt(sessionId, CALC)];
        const elsewhere = lab.tempDir("turnlog-cwd-fork-");
        const forked = await c.ok("session/fork", { sessionId, cwd: elsewhere, mcpServers: [] });
        assert.match(forked.sessionId, SESSION_ID, `session/fork: ${show(forked)}`);
        assert.notEqual(forked.sessionId, sessionId);

        const source = await c.load(sessionId);
        const fork = await c.load(forked.sessionId);
        const said = (updates) => comparable(outline(updates)).map(({ toolCallId, ...rest }) => rest);
        assert.deepEqual(said(fork.updates), said(source.updates), `the fork replays the source's conversation: ${show(fork.updates)}`);
        assert.ok(said(fork.updates).some((i) => i.kind === "tool" && i.text === "14"), `with its tool call: ${show(fork.updates)}`);
        assert.equal(before[1].text, "tool results: calculator=14");

        const onFork = await c.prompt(forked.sessionId, "on the fork");
        assert.equal(onFork.text, "echo: on the fork");
        const listed = await c.ok(m.agent.session.list, { cwd: elsewhere });
        assert.deepEqual(listed.sessions.map((s) => s.sessionId), [forked.sessionId], `the fork is listed in its cwd: ${show(listed)}`);
        const again = await c.load(sessionId);
        assert.deepEqual(said(again.updates), said(source.updates), "the source did not change");
      });
    });

    test("prompt blocks (text, resource_link, resource) are stored as given and replayed one user_message_chunk each", TEST, async (t) => {
      const lab = new Lab(t);
      const target = await lab.target(mode);
      const blocks = [
        { type: "text", text: "look" },
        { type: "resource_link", uri: "file:///tmp/a.txt", name: "a.txt" },
        { type: "resource", resource: { uri: "file:///tmp/b.py", mimeType: "text/x-python", text: "print(1)" } },
      ];
      const { result: sessionId } = await withAgent(lab, target.args, async (c) => {
        const id = await c.openSession();
        const turn = await c.prompt(id, blocks);
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.ok(turn.text.startsWith("echo: look"), `the reply reads the text block: ${show(turn.text)}`);
        return id;
      });
      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const { updates } = await c.load(sessionId);
        const user = updates.filter((u) => u.sessionUpdate === "user_message_chunk").map((u) => u.content);
        assert.equal(user.length, blocks.length, `one user_message_chunk per block: ${show(updates)}`);
        blocks.forEach((block, i) => assert.deepEqual(project(user[i], block), block, `block ${i}: ${show(user[i])}`));
      });
    });
  });
}

// ---------- embedded only: a turn outlives the agent's process ----------

describe("turnlog acp --data-dir: a turn outlives its process", () => {
  test("SIGKILL mid-reply: the next process resumes the turn by itself; session/load gives the whole reply once (replayed, or followed to its end) and no chunk of the cut message; the log retracts it; a new prompt goes on", TEST, async (t) => {
    const lab = new Lab(t);
    const target = await lab.target("embedded");
    const prompt = "/delay 60\n/words 80"; // 80 words, 60 ms apart: about 5 s
    const reply = words(80);
    const isChunk = (u) => u.sessionUpdate === "agent_message_chunk";

    // The first process streams a few words of the reply, and is killed.
    const child = lab.spawn(target.args);
    const doomed = new AcpClient(child);
    let sessionId;
    let killed = false;
    await doomed
      .app()
      .connectWith(doomed.stream(), async (agent) => {
        doomed.agent = agent;
        sessionId = await doomed.openSession();
        const from = doomed.transcript.length;
        const asked = agent.request(m.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: prompt }] });
        asked.catch(() => {}); // never answered: the agent dies first
        await waitFor(
          () => updatesIn(doomed.transcript.slice(from), sessionId).filter(isChunk).length >= 3,
          10_000,
          () => `three chunks of the reply; updates so far: ${show(updatesIn(doomed.transcript, sessionId))}`,
        );
        child.kill("SIGKILL");
        killed = true;
        await deadline(child.exited, 5_000, "the killed agent to exit");
      })
      .catch((error) => {
        if (!killed) throw error; // after the kill, the connection dies with the agent
      });
    assert.match(sessionId ?? "", SESSION_ID, "the session was made before the kill");
    const cutChunks = updatesIn(doomed.transcript, sessionId).filter(isChunk);
    const cutIds = [...new Set(cutChunks.map((u) => u.messageId))];
    assert.equal(cutIds.length, 1, `the cut reply's chunks share one messageId: ${show(cutChunks)}`);
    const [cutId] = cutIds;
    const cutText = cutChunks.map((u) => u.content?.text ?? "").join("");
    assert.ok(cutText.startsWith("w1") && reply.startsWith(cutText) && !cutText.includes("w80"), `cut mid-reply: ${show(cutText)}`);

    // The next process resumes the turn as it starts; the client loads the session.
    const { result: newId } = await withAgent(lab, target.args, async (c) => {
      c.loadsFollowRunningTurn.add(sessionId); // the updates after the load's answer are checked below
      await c.initialize();
      const from = c.transcript.length;
      const loaded = await c.load(sessionId);
      // The load's updates: its replay, then those of the turn if it still runs.
      const sinceLoad = (to = c.transcript.length) => updatesIn(c.transcript.slice(from, to), sessionId);
      const byMessage = (updates) => {
        const texts = new Map();
        for (const u of updates.filter(isChunk)) texts.set(u.messageId, (texts.get(u.messageId) ?? "") + (u.content?.text ?? ""));
        return texts;
      };
      // The reply's last word comes with its final event (a follow-up holds a message's
      // deltas until the event after them says whether they stand), which the turn's end
      // follows at once; a prompt sent while the turn still ran would be refused (busy).
      await waitFor(
        () => [...byMessage(sinceLoad()).values()].some((text) => text.includes("w80")),
        20_000,
        () => `the resumed reply's last word; the load's updates: ${show(sinceLoad())}`,
      );
      const promptAt = c.transcript.length;
      const turn = await c.prompt(sessionId, "hi");
      const loadUpdates = sinceLoad(promptAt);
      const replayed = loaded.updates;
      const followed = loadUpdates.slice(replayed.length);
      t.diagnostic(
        `the load replayed ${replayed.filter(isChunk).length} agent chunk(s) and ${followed.length} update(s) followed its answer: ` +
          `the resumed turn was ${replayed.some(isChunk) ? "finished" : "still running"} when it was loaded`,
      );

      assert.equal(replayed.at(-1)?.sessionUpdate, "session_info_update", `the replay ends with the session's info: ${show(replayed)}`);
      const kinds = [...new Set(loadUpdates.filter((u) => u !== replayed.at(-1)).map((u) => u.sessionUpdate))].sort();
      assert.deepEqual(kinds, ["agent_message_chunk", "user_message_chunk"], `the load says the prompt and the reply: ${show(loadUpdates)}`);
      const cutAgain = updatesIn(c.transcript, sessionId).filter((u) => isChunk(u) && u.messageId === cutId);
      assert.deepEqual(cutAgain, [], `no chunk of the cut message (${cutId}) from the new process`);
      const messages = byMessage(loadUpdates);
      assert.equal(messages.size, 1, `one agent message for the turn: ${show([...messages])}`);
      const [[id, text]] = [...messages];
      assert.notEqual(id, cutId, "the resumed reply is a new message");
      assert.equal(text, reply, `the whole reply, once: ${show(loadUpdates)}`);
      assert.deepEqual(
        comparable(outline(loadUpdates)),
        [{ kind: "user", text: prompt }, { kind: "agent", text: reply }],
        `the conversation as the load gave it: ${show(loadUpdates)}`,
      );
      assert.ok(followed.every((u) => isChunk(u) && u.messageId === id), `after the load's answer, only the reply's chunks: ${show(followed)}`);

      assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
      assert.equal(turn.text, "echo: hi", about("reply text", turn));
      return id;
    });

    // The log, read through a server on the same data dir.
    const server = await lab.startServer({ dataDir: target.dataDir });
    const log = [];
    for (let after = null; ; ) {
      const page = await getJson(`${server.url}/sessions/${sessionId}/events?limit=500${after ? `&after_id=${after}` : ""}`);
      log.push(...page.data);
      if (!page.has_more) break;
      after = page.last_id;
    }
    const ofType = (type) => log.filter((e) => e.type === type);
    const types = show(log.filter((e) => !e.type.endsWith(".delta")).map((e) => e.type));
    const resumed = ofType("turn.resumed");
    assert.equal(resumed.length, 1, `one turn.resumed: ${types}`);
    assert.deepEqual(resumed[0].discarded, [cutId], `turn.resumed discards the cut message: ${show(resumed[0])}`);
    assert.ok(ofType("agent.message.delta").some((d) => d.message_id === cutId), `the cut message's deltas are in the log: ${types}`);
    const said = ofType("agent.message").map((e) => [e.message_id, (e.content ?? []).map((b) => b.text ?? "").join("")]);
    assert.equal(said.filter(([, text]) => text === reply).length, 1, `one agent.message with the whole reply: ${show(said)}`);
    assert.deepEqual(said.map(([, text]) => text), [reply, "echo: hi"], `the agent's messages: ${show(said)}`);
    assert.equal(said[0][0], newId, "the reply's message id is the one the load gave");
    assert.deepEqual(ofType("session.error"), [], `no session.error: ${types}`);
    const idle = ofType("session.status_idle");
    assert.deepEqual(idle.map((e) => e.stop_reason?.type), ["end_turn", "end_turn"], `the resumed turn and the new one end end_turn: ${types}`);
    assert.equal(idle[0].turn_id, resumed[0].turn_id, `the first end is the resumed turn's: ${show(idle[0])}`);
  });
});

// ---------- bridge only: the server's own views, and API keys ----------

describe("turnlog acp --server: the session lives in the server's log", () => {
  test("a native SSE observer sees the ACP turns live (deltas before the answer, then status_idle end_turn); AAP history has them", TEST, async (t) => {
    const lab = new Lab(t);
    const target = await lab.target("bridge");
    const { url } = target.server;
    await withAgent(lab, target.args, async (c) => {
      const sessionId = await c.openSession();
      const observer = await observeEvents(lab, `${url}/sessions/${sessionId}/events/stream`);
      await waitFor(() => observer.frames.length > 0, 10_000, () => `no frame on the session's event stream (${show(observer.error?.message)})`);
      const cases = [
        { prompt: "/words 20\n/delay 50", reply: words(20) },
        { prompt: `${CALC}\n/delay 50`, reply: "tool results: calculator=14", tool: { name: "calculator", input: { expression: "2*(3+4)" } } },
      ];
      for (const { prompt, reply, tool } of cases) {
        const seen = observer.frames.length;
        const turn = await c.prompt(sessionId, prompt);
        assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
        assert.equal(turn.text, reply, about("reply text", turn));
        const frames = () => observer.frames.slice(seen);
        const types = () => show(frames().map((f) => f.data.type));

        const firstDelta = frames().find((f) => f.data.type === "agent.message.delta");
        assert.ok(firstDelta, `no agent.message.delta reached the observer before the prompt's answer: ${types()}`);
        assert.ok(firstDelta.at < turn.answeredAt, "the first delta must reach the observer before the prompt's answer");
        const idle = await waitFor(() => frames().find((f) => f.data.type === "session.status_idle"), 5_000, () => `session.status_idle; saw ${types()}`);
        t.diagnostic(`${show(prompt)}: status_idle reached the observer ${(idle.at - turn.answeredAt).toFixed(1)} ms after the ACP answer (negative: before)`);
        assert.equal(idle.data.stop_reason?.type, "end_turn", `status_idle stop_reason: ${show(idle.data)}`);

        const turnFrames = frames().slice(0, frames().indexOf(idle) + 1);
        for (const f of turnFrames) {
          assert.match(f.id ?? "", EVENT_ID, `frame id: ${show(f)}`);
          assert.equal(f.data.id, f.id, `the frame's id is its event's: ${show(f)}`);
          assert.equal(f.event, f.data.type, `the frame's event is its type: ${show(f)}`);
        }
        const ofType = (type) => turnFrames.filter((f) => f.data.type === type).map((f) => f.data);
        const user = ofType("user.message");
        assert.equal(user.length, 1, `one user.message: ${types()}`);
        assert.equal(user[0].content.map((b) => b.text).join(""), prompt, `user.message content: ${show(user[0])}`);
        assert.equal(ofType("agent.message.delta").map((d) => d.delta).join(""), reply, `deltas: ${types()}`);
        const messages = ofType("agent.message").map((d) => d.content.map((b) => b.text ?? "").join("")).filter(Boolean);
        assert.deepEqual(messages, [reply], `agent.message: ${types()}`);
        if (tool) {
          const [use] = ofType("agent.tool_use");
          assert.equal(use?.name, tool.name, types());
          assert.deepEqual(use.input, tool.input, `agent.tool_use input: ${show(use)}`);
          const [result] = ofType("agent.tool_result");
          assert.equal(result?.tool_use_id, turnFrames.find((f) => f.data === use).id, `agent.tool_result names its tool_use: ${show(result)}`);
          assert.equal(result.content.map((b) => b.text).join(""), "14", `agent.tool_result content: ${show(result)}`);
        }
      }
      assert.deepEqual(observer.bad, [], "every data: line is JSON");
      observer.close();

      const body = await getJson(`${url}/sessions/${sessionId}/history`);
      const history = body.history?.compacted ?? body.history?.full;
      assert.ok(Array.isArray(history), `history: ${show(body)}`);
      const said = history.map((msg) => [msg.role, messageText(msg)]);
      for (const { prompt, reply } of cases) {
        assert.ok(said.some(([role, text]) => role === "user" && text === prompt), `the user message ${show(prompt)} in ${show(said)}`);
        assert.ok(said.some(([role, text]) => role === "assistant" && text === reply), `the reply ${show(reply)} in ${show(said)}`);
      }
    });
  });

  test("a session made through another view (the AAP turn API) loads: its conversation replays, then an ACP prompt goes on", TEST, async (t) => {
    const lab = new Lab(t);
    const target = await lab.target("bridge");
    const { url } = target.server;
    const post = async (route, body) => {
      const res = await deadline(
        fetch(`${url}${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }),
        10_000,
        `POST ${route}`,
      );
      const text = await res.text();
      assert.ok(res.ok, `POST ${route}: ${res.status} ${text}`);
      return JSON.parse(text);
    };
    const { sessionId } = await post("/sessions", { agent: { name: "default", tools: [{ name: "calculator", trust: true }] } });
    for (const content of ["hi from AAP", CALC]) {
      await post(`/sessions/${sessionId}/turns`, { stream: "none", messages: [{ role: "user", content }] });
    }
    await withAgent(lab, target.args, async (c) => {
      await c.initialize();
      const { updates } = await c.load(sessionId);
      assert.deepEqual(
        comparable(outline(updates)).map((item) => [item.kind, item.kind === "tool" ? `${item.status} ${item.text}` : item.text]),
        [
          ["user", "hi from AAP"],
          ["agent", "echo: hi from AAP"],
          ["user", CALC],
          ["tool", "completed 14"],
          ["agent", "tool results: calculator=14"],
        ],
        `the AAP session's replay: ${show(updates)}`,
      );
      const turn = await c.prompt(sessionId, "and from the editor");
      assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
      assert.equal(turn.text, "echo: and from the editor");
    });
  });

  test("API keys: `--api-key KEY` works (the session is alice's), a wrong key makes session/new fail with a JSON-RPC error", TEST, async (t) => {
    const lab = new Lab(t);
    const key = `acp-test-${randomBytes(12).toString("hex")}`;
    const sha256 = createHash("sha256").update(key).digest("hex");
    const config = path.join(lab.tempDir("turnlog-config-"), "keys.toml");
    fs.writeFileSync(config, `[[auth.keys]]\nsubject = "alice"\nsha256 = "${sha256}"\nadmin = false\n`);
    const server = await lab.startServer({ config });
    const anonymous = await fetch(`${server.url}/sessions`);
    assert.equal(anonymous.status, 401, "the server must want a key");

    await withAgent(lab, ["acp", "--server", server.url, "--api-key", key, "--agent", "default"], async (c) => {
      const sessionId = await c.openSession();
      const turn = await c.prompt(sessionId, "hi");
      assert.equal(turn.stopReason, "end_turn", about("stop reason", turn));
      assert.equal(turn.text, "echo: hi");
      const body = await getJson(`${server.url}/sessions/${sessionId}/history`, { authorization: `Bearer ${key}` });
      const said = (body.history?.compacted ?? [])
        .filter((msg) => msg.role === "user" || msg.role === "assistant")
        .map((msg) => [msg.role, messageText(msg)]);
      assert.deepEqual(said, [["user", "hi"], ["assistant", "echo: hi"]], "alice reads the conversation with her key");
    });

    await withAgent(lab, ["acp", "--server", server.url, "--api-key", "not-the-key"], async (c) => {
      // initialize may succeed (no call to the server yet) or fail already; either way it answers.
      const init = await c.call(m.agent.initialize, c.initializeParams());
      t.diagnostic(`with a wrong key, initialize ${init.error ? `failed (${init.error.code} ${init.error.message})` : "succeeded"}`);
      const refused = await c.fails(m.agent.session.new, c.newSessionParams());
      assert.equal(typeof refused.message, "string", `the error has a message: ${show(refused)}`);
      t.diagnostic(`with a wrong key, session/new failed: ${refused.code} ${refused.message}`);
    });
  });
});

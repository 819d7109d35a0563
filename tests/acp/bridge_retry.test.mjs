// `turnlog acp --server URL` (the bridge) while the server it talks to is SIGKILLed and
// started again on the same address and data dir: a prompt is stored exactly once.
//
// Every write the ACP view makes carries an idempotency key (a prompt's: `acp-<connection
// ulid>-<JSON-RPC request id>`, src/acp/door.rs `write_key`); the bridge's HTTP client sends
// it again with that key for up to 60 s while the server cannot be reached or answers
// 502/503/504 (src/client/mod.rs `keyed`), and the server answers a write sent again with
// what its first copy stored (docs/idempotency.md).
//
// - A: the server is down when the prompt is sent; it comes back once the bridge has
//   logged a retry. The prompt is answered `end_turn` with `echo: hello once`, and the log
//   holds its user.message and turn.started once, the turn.started marked with the key.
// - B: the server is killed after the prompt's write: as soon as its user.message is in the
//   log ("stored"), or once the client has three chunks of the reply ("mid-reply"); the
//   restarted server resumes the turn (docs/durable-turns.md) and the bridge's follow
//   reconnects. The prompt is answered `end_turn`, its last message is the whole reply, and
//   the log holds the user.message once. (The cut attempt's chunks may have reached the
//   client already: ACP cannot take them back, and docs/durable-turns.md says so.)
// - D: the server dies after answering the prompt's write, before the bridge has opened the
//   session's event stream: the bridge opens it again (as it sends a keyed write again)
//   once the restarted server answers, and the prompt ends with the resumed turn.
// - C: the answer is lost: the bridge talks to the server through a proxy of the test's own,
//   which, once the server has answered the prompt's write (stored), SIGKILLs the server and
//   drops the bridge's connection without passing the answer on; while the server is down it
//   answers 502. The bridge sends the write again with its key; the restarted server answers
//   it with the events the first copy stored, and stores nothing twice.
//
// The bridge runs with `RUST_LOG=info,turnlog::client=debug`, so it logs each keyed write it
// sends again ("a keyed request was not answered; sending it again", with the key): case A
// waits for that line instead of sleeping.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { performance } from "node:perf_hooks";
import { stdoutLines } from "../common/lines.mjs";
import { Lab, SESSION_ID, TEST, Turn, deadline, getJson, m, show, showError, updatesIn, waitFor, withAgent } from "./helpers.mjs";

/** What the bridge logs (at debug, `turnlog::client`) each time it sends a keyed write again. */
const RETRY_LINE = "a keyed request was not answered; sending it again";
/** The bridge's log filter: its retries at debug, the rest at info. */
const BRIDGE_LOG = "info,turnlog::client=debug";
/** A prompt through a server restart: the bridge's retries back off to 2 s, its follow reconnects a second apart. */
const PROMPT_WITHIN_MS = 25_000;
const PROMPT_KEY = /^acp-([0-9A-HJKMNP-TV-Z]{26})-(.+)$/;

/** The scripted model's `/words n` reply. */
function words(n) {
  return Array.from({ length: n }, (_, i) => `w${i + 1}`).join(" ");
}

/**
 * A `turnlog serve` that can be SIGKILLed and started again on the same address and data
 * dir (the bridge was started with its URL). The first start takes a free port (port 0);
 * restarts bind that port. `processes` keeps every process, for the failure report.
 */
class RestartableServer {
  constructor(lab) {
    this.lab = lab;
    this.dataDir = lab.tempDir("turnlog-data-");
    this.processes = [];
  }

  async start() {
    const addr = this.url ? this.url.replace(/^http:\/\//, "") : "127.0.0.1:0";
    const child = this.lab.spawn(["serve", "--addr", addr, "--data-dir", this.dataDir]);
    this.processes.push(child);
    const lines = stdoutLines(child);
    await Promise.race([
      waitFor(() => lines.length > 0, 15_000, () => `turnlog serve --addr ${addr} printed nothing; stderr: ${child.stderrText}`),
      child.exited.then((e) => assert.fail(`turnlog serve --addr ${addr} exited (${show(e)}) before listening: ${child.stderrText}`)),
    ]);
    const found = /^listening on (http:\/\/127\.0\.0\.1:\d+)$/.exec(lines[0]);
    assert.ok(found, `turnlog serve's first stdout line: ${show(lines[0])}`);
    if (this.url) assert.equal(found[1], this.url, "the restarted server listens where the first one did");
    this.url = found[1];
    this.child = child;
    return this;
  }

  /** SIGKILLs the running server and waits until it is gone (its port and data dir free). */
  async kill() {
    const child = this.child;
    assert.ok(child && child.exitCode === null && child.signalCode === null, "a server runs to be killed");
    child.kill("SIGKILL");
    const exit = await deadline(child.exited, 5_000, "the SIGKILLed server to exit");
    assert.equal(exit.signal, "SIGKILL", `the server died of SIGKILL: ${show(exit)}`);
    this.child = undefined;
  }

  /** Every server process's stderr (its log), for a failure report. */
  logs() {
    return this.processes
      .map((p, i) => `--- server process ${i + 1} (turnlog ${p.args.join(" ")}; exit ${p.exitCode ?? p.signalCode ?? "running"}) stderr tail:\n${p.stderrText.slice(-6_000)}`)
      .join("\n");
  }
}

/**
 * A reverse proxy to `server` (its URL read per request, so it follows a restart) that
 * records every request (method, path, Idempotency-Key, status or error) and answers 502
 * while the server cannot be reached. `cut(req, body)` picks a request whose answer is lost:
 * once the server has answered it in full, `onCut(answer)` runs (the test kills the server
 * there), then the bridge's connection is dropped without the answer.
 */
async function startProxy(lab, server, { cut, onCut }) {
  const proxy = { requests: [], cutAnswers: [] };
  const listener = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const seen = { method: req.method, path: req.url, key: req.headers["idempotency-key"], at: performance.now() };
      proxy.requests.push(seen);
      // A request the test picks (`proxy.refuse`) is not passed on: `proxy.onRefuse()` runs
      // (the test kills the server there), then the bridge's connection is dropped.
      if (proxy.refuse?.(req)) {
        seen.refused = true;
        Promise.resolve(proxy.onRefuse()).finally(() => req.socket.destroy());
        return;
      }
      const target = new URL(req.url, server.url);
      const upstream = http.request(target, { method: req.method, headers: req.headers, agent: false }, (answer) => {
        seen.status = answer.statusCode;
        if (!cut(req, body)) {
          res.writeHead(answer.statusCode, answer.headers);
          answer.pipe(res);
          res.on("close", () => answer.destroy()); // a stream the bridge left
          return;
        }
        const parts = [];
        answer.on("data", (c) => parts.push(c));
        answer.on("end", async () => {
          seen.cut = true;
          const lost = { status: answer.statusCode, body: Buffer.concat(parts).toString("utf8"), key: seen.key };
          proxy.cutAnswers.push(lost);
          try {
            await onCut(lost);
          } finally {
            req.socket.destroy(); // the bridge never hears the answer
          }
        });
      });
      upstream.on("error", (error) => {
        seen.error = error.code ?? error.message;
        if (!res.headersSent) {
          seen.status = 502;
          res.writeHead(502, { "content-type": "text/plain" });
          res.end(`proxy: the server is unreachable (${seen.error})`);
        } else {
          res.destroy();
        }
      });
      upstream.end(body);
    });
  });
  await new Promise((resolve) => listener.listen(0, "127.0.0.1", resolve));
  lab.onCleanup(
    () =>
      new Promise((resolve) => {
        listener.closeAllConnections();
        listener.close(resolve);
      }),
  );
  proxy.url = `http://127.0.0.1:${listener.address().port}`;
  return proxy;
}

/** `withAgent` for `turnlog acp --server URL`, spawned with RUST_LOG = BRIDGE_LOG. */
function withBridge(lab, url, op) {
  // Lab.spawn copies process.env when it runs, which withAgent does before its first await.
  const saved = process.env.RUST_LOG;
  process.env.RUST_LOG = BRIDGE_LOG;
  try {
    return withAgent(lab, ["acp", "--server", url], op);
  } finally {
    if (saved === undefined) delete process.env.RUST_LOG;
    else process.env.RUST_LOG = saved;
  }
}

/** The keys of the writes the bridge logged it sent again. */
function retriedKeys(bridge) {
  return bridge.stderrText
    .split("\n")
    .filter((line) => line.includes(RETRY_LINE))
    .map((line) => /key="?([^"\s]+)"?/.exec(line)?.[1] ?? `(no key in: ${line})`);
}

/** Every event of the session (deltas too), through the native API, 100 a page. */
async function allEvents(url, sessionId) {
  const log = [];
  for (let after = null; ; ) {
    const page = await getJson(`${url}/sessions/${sessionId}/events?limit=100${after ? `&after_id=${after}` : ""}`);
    log.push(...page.data);
    if (!page.has_more) return log;
    after = page.last_id;
  }
}

const textOf = (event) => (event.content ?? []).map((b) => b.text ?? "").join("");
/** The log in short, for assertion messages: each event's type (messages with their text), no deltas. */
const outlineLog = (log) =>
  show(log.filter((e) => !e.type.endsWith(".delta")).map((e) => (e.type.endsWith("message") ? `${e.type}: ${textOf(e)}` : e.type)));

/**
 * What the log must hold for one prompt written once: its user.message once, one turn.started
 * for that turn, and that turn.started (the write's first event) marked with the prompt's key
 * (`acp-<connection>-<JSON-RPC id>`); no other event carries that key. Returns the turn's id
 * and the key.
 */
function assertStoredOnce(log, text, jsonRpcId) {
  const types = outlineLog(log);
  const users = log.filter((e) => e.type === "user.message" && textOf(e) === text);
  assert.equal(users.length, 1, `exactly one user.message ${show(text)} in the log: ${types}`);
  const [user] = users;
  assert.equal(log.filter((e) => e.type === "user.message").length, 1, `no other user.message: ${types}`);
  const started = log.filter((e) => e.type === "turn.started");
  assert.equal(started.length, 1, `exactly one turn.started: ${types}`);
  assert.equal(started[0].turn_id, user.turn_id, `the turn.started is the user.message's turn: ${show([started[0], user])}`);
  // The write's first event: the turn.started, stored in the same append as the user.message.
  const first = log[log.indexOf(user) - 1];
  assert.equal(first?.id, started[0].id, `the event before the user.message is its turn.started: ${show(first)}`);
  const key = first.request?.idempotency_key;
  assert.equal(typeof key, "string", `the prompt's write is marked with its key: ${show(first)}`);
  const parts = PROMPT_KEY.exec(key);
  assert.ok(parts, `the prompt's key is acp-<connection ulid>-<request id>: ${show(first.request)}`);
  assert.equal(parts[2], String(jsonRpcId), `the key names the session/prompt request's JSON-RPC id (${jsonRpcId}): ${key}`);
  const marked = log.filter((e) => e.request?.idempotency_key === key);
  assert.deepEqual(marked.map((e) => e.id), [first.id], `only the write's first event carries its key: ${show(marked)}`);
  return { turnId: user.turn_id, key, request: first.request };
}

/** The JSON-RPC id the client gave the `session/prompt` request whose params are `params`, once it is written. */
async function requestId(client, params) {
  const sent = await waitFor(
    () => client.transcript.find((e) => e.dir === "out" && e.msg.method === m.agent.session.prompt && e.msg.params === params),
    5_000,
    () => "the session/prompt request to be written to the agent",
  );
  return sent.msg.id;
}

/** Runs `op(lab, server)`; on failure notes every server process's log. */
async function withRestartableServer(t, op) {
  const lab = new Lab(t);
  const server = await new RestartableServer(lab).start();
  try {
    await op(lab, server);
  } catch (error) {
    lab.note(server.logs());
    throw error;
  }
}

describe("turnlog acp --server: a prompt is stored once when the server is SIGKILLed and restarted", () => {
  test("A: the server is down when the prompt is sent; the bridge sends it again with its key until the restarted server takes it: end_turn `echo: hello once`, one user.message, one turn", TEST, async (t) => {
    await withRestartableServer(t, async (lab, server) => {
      await withBridge(lab, server.url, async (c) => {
        const bridge = c.child;
        const sessionId = await c.openSession();
        await server.kill();

        const text = "hello once";
        const params = { sessionId, prompt: [{ type: "text", text }] };
        const from = c.transcript.length;
        const asked = c.call(m.agent.session.prompt, params, { timeoutMs: PROMPT_WITHIN_MS });
        asked.catch(() => {}); // awaited below; a failure meanwhile must not be unhandled
        const id = await requestId(c, params);

        // The bridge found no server and sends the prompt's write again.
        await waitFor(() => retriedKeys(bridge).length > 0, 10_000, () => `the bridge to log a retry (${RETRY_LINE}); its stderr: ${bridge.stderrText.slice(-3_000)}`);
        assert.deepEqual(updatesIn(c.transcript.slice(from), sessionId), [], "nothing streamed while the server is down");
        const restartedAt = performance.now();
        await server.start();

        const reply = await asked;
        if (reply.error) assert.fail(`session/prompt failed: ${showError(reply.error)}; bridge stderr: ${bridge.stderrText.slice(-3_000)}`);
        const turn = new Turn(sessionId, params.prompt, reply);
        turn.checkShape();
        assert.equal(turn.stopReason, "end_turn", `stop reason; updates: ${show(turn.updates)}`);
        assert.equal(turn.text, `echo: ${text}`, `reply text; updates: ${show(turn.updates)}`);

        const log = await allEvents(server.url, sessionId);
        const stored = assertStoredOnce(log, text, id);
        const retried = retriedKeys(bridge);
        assert.ok(retried.every((k) => k === stored.key), `every write the bridge sent again is the prompt's, with its key ${stored.key}: ${show(retried)}`);
        const idle = log.filter((e) => e.type === "session.status_idle" && e.turn_id === stored.turnId);
        assert.deepEqual(idle.map((e) => e.stop_reason?.type), ["end_turn"], `the turn ends once, end_turn: ${outlineLog(log)}`);
        assert.deepEqual(log.filter((e) => e.type === "turn.resumed"), [], `nothing to resume: ${outlineLog(log)}`);
        t.diagnostic(
          `the bridge sent the prompt again ${retried.length} time(s) with key ${stored.key} (request mark ${show(stored.request)}); ` +
            `answered ${(reply.answeredAt - restartedAt).toFixed(0)} ms after the restart began`,
        );
      });
    });
  });

  // B, at two points: as soon as the log holds the prompt (the bridge may not have its
  // answer yet, nor any chunk), and mid-reply (the client has three chunks of the reply).
  for (const when of ["stored", "mid-reply"]) {
    test(`B (${when}): the server is SIGKILLed ${when === "stored" ? "as soon as the prompt's user.message is in its log" : "once the client has three chunks of the reply"}; the restarted server resumes the turn and the bridge follows it to end_turn; one user.message`, TEST, async (t) => {
      await withRestartableServer(t, async (lab, server) => {
        await withBridge(lab, server.url, async (c) => {
          const bridge = c.child;
          const sessionId = await c.openSession();
          assert.match(sessionId, SESSION_ID);

          const text = "/words 30\n/delay 30"; // 30 words, 30 ms apart: about 1 s
          const reply = words(30);
          const params = { sessionId, prompt: [{ type: "text", text }] };
          const from = c.transcript.length;
          const asked = c.call(m.agent.session.prompt, params, { timeoutMs: PROMPT_WITHIN_MS });
          asked.catch(() => {});
          const id = await requestId(c, params);

          const streamed = () => updatesIn(c.transcript.slice(from), sessionId).filter((u) => u.sessionUpdate === "agent_message_chunk");
          if (when === "stored") {
            // As soon as the server's log holds the prompt, the server dies.
            const deadlineAt = performance.now() + 10_000;
            for (;;) {
              const log = await allEvents(server.url, sessionId);
              if (log.some((e) => e.type === "user.message" && textOf(e) === text)) break;
              if (performance.now() > deadlineAt) assert.fail(`the prompt's user.message in the log; it holds: ${outlineLog(log)}`);
              await new Promise((resolve) => setTimeout(resolve, 10));
            }
          } else {
            await waitFor(() => streamed().length >= 3, 10_000, () => `three chunks of the reply; updates so far: ${show(updatesIn(c.transcript, sessionId))}`);
          }
          const chunksBeforeKill = streamed();
          await server.kill();
          const retriesBefore = retriedKeys(bridge).length;
          await server.start();

          const answer = await asked;
          const turn = new Turn(sessionId, params.prompt, answer);
          const chunks = turn.chunks("agent_message_chunk");
          const byMessage = new Map();
          for (const u of chunks) byMessage.set(u.messageId, (byMessage.get(u.messageId) ?? "") + (u.content?.text ?? ""));
          const log = await allEvents(server.url, sessionId);
          t.diagnostic(
            `killed with ${chunksBeforeKill.length} chunk(s) streamed; the bridge sent a write again ${retriedKeys(bridge).length} time(s) ` +
              `(${retriesBefore} before the restart began): ${show(retriedKeys(bridge))}; ` +
              `the prompt ${answer.error ? `failed: ${showError(answer.error)}` : `answered ${show(answer.result)}`}; ` +
              `its agent messages: ${show([...byMessage])}; the log: ${outlineLog(log)}`,
          );
          if (answer.error) {
            assert.fail(`session/prompt failed: ${showError(answer.error)}; updates: ${show(turn.updates)}; bridge stderr: ${bridge.stderrText.slice(-4_000)}`);
          }
          turn.checkShape();
          assert.equal(turn.stopReason, "end_turn", `stop reason; updates: ${show(turn.updates)}`);

          const stored = assertStoredOnce(log, text, id);
          const retried = retriedKeys(bridge);
          assert.ok(retried.every((k) => k === stored.key), `every write the bridge sent again is the prompt's, with its key ${stored.key}: ${show(retried)}`);

          // The turn was resumed once, and ended once, with the whole reply said once.
          const resumed = log.filter((e) => e.type === "turn.resumed");
          assert.equal(resumed.length, 1, `one turn.resumed: ${outlineLog(log)}`);
          assert.equal(resumed[0].turn_id, stored.turnId, `the prompt's turn was resumed: ${show(resumed[0])}`);
          const said = log.filter((e) => e.type === "agent.message").map(textOf);
          assert.deepEqual(said, [reply], `one agent.message, the whole reply: ${outlineLog(log)}`);
          const idle = log.filter((e) => e.type === "session.status_idle");
          assert.deepEqual(idle.map((e) => [e.turn_id, e.stop_reason?.type]), [[stored.turnId, "end_turn"]], `the turn ends once, end_turn: ${outlineLog(log)}`);

          // What the client saw: the whole reply as its last message; before it, only the cut
          // attempt's chunks (a prefix of the reply, under another messageId), if any.
          const messages = [...byMessage];
          assert.ok(messages.length >= 1 && messages.length <= 2, `the reply, after at most one cut attempt: ${show(messages)}`);
          const [lastId, lastText] = messages.at(-1);
          assert.equal(lastText, reply, `the prompt's last agent message is the whole reply: ${show(messages)}`);
          const finalMessage = log.find((e) => e.type === "agent.message");
          assert.equal(lastId, finalMessage.message_id, "the client's last message is the log's agent.message");
          if (messages.length === 2) {
            const [cutId, cutText] = messages[0];
            assert.ok(reply.startsWith(cutText) && cutText !== reply, `the cut attempt's chunks are a prefix of the reply: ${show(cutText)}`);
            assert.deepEqual(resumed[0].discarded, [cutId], `turn.resumed retracts the message whose chunks were cut: ${show(resumed[0])}`);
          }
          if (when === "mid-reply") assert.equal(messages.length, 2, `killed mid-reply, the client got the cut attempt's chunks, then the reply: ${show(messages)}`);
        });
      });
    });
  }
  test("C: the answer is lost: the server is SIGKILLed once it has stored the prompt, before its answer reaches the bridge; the bridge sends the write again (502s while the server is down) and the restarted server answers it with what it stored: end_turn, one user.message", TEST, async (t) => {
    await withRestartableServer(t, async (lab, server) => {
      let sessionId;
      let killedAt;
      const isPromptWrite = (req) => req.method === "POST" && sessionId && req.url === `/sessions/${sessionId}/events`;
      const proxy = await startProxy(lab, server, {
        // Only the first copy of the prompt's write: its answers after the restart go through.
        cut: (req) => isPromptWrite(req) && proxy.cutAnswers.length === 0,
        onCut: async () => {
          await server.kill();
          killedAt = performance.now();
        },
      });
      await withBridge(lab, proxy.url, async (c) => {
        const bridge = c.child;
        sessionId = await c.openSession();

        const text = "/words 20\n/delay 30";
        const reply = words(20);
        const params = { sessionId, prompt: [{ type: "text", text }] };
        const from = c.transcript.length;
        const asked = c.call(m.agent.session.prompt, params, { timeoutMs: PROMPT_WITHIN_MS });
        asked.catch(() => {});
        const id = await requestId(c, params);

        // The server stored the write and answered; the proxy killed it and dropped the answer.
        await waitFor(() => killedAt !== undefined, 10_000, () => `the prompt's write to reach the server; the proxy saw ${show(proxy.requests)}`);
        const [lost] = proxy.cutAnswers;
        assert.equal(lost.status, 200, `the server stored the first copy: ${show(lost)}`);
        const lostEvents = JSON.parse(lost.body).data;
        // The bridge sends it again (the proxy answers 502: no server); then the server comes back.
        await waitFor(() => retriedKeys(bridge).length >= 2, 10_000, () => `the bridge to send the write again twice; its stderr: ${bridge.stderrText.slice(-3_000)}; the proxy saw ${show(proxy.requests)}`);
        assert.deepEqual(updatesIn(c.transcript.slice(from), sessionId), [], "nothing streamed before the write was answered");
        await server.start();

        const answer = await asked;
        const turn = new Turn(sessionId, params.prompt, answer);
        const writes = proxy.requests.filter((r) => r.method === "POST" && r.path === `/sessions/${sessionId}/events`);
        const chunks = turn.chunks("agent_message_chunk");
        const byMessage = new Map();
        for (const u of chunks) byMessage.set(u.messageId, (byMessage.get(u.messageId) ?? "") + (u.content?.text ?? ""));
        const log = await allEvents(server.url, sessionId);
        t.diagnostic(
          `the prompt's write went through the proxy ${writes.length} times: ${show(writes.map((w) => [w.key, w.cut ? "stored, answer dropped" : `${w.status}${w.error ? ` (${w.error})` : ""}`]))}; ` +
            `the prompt ${answer.error ? `failed: ${showError(answer.error)}` : `answered ${show(answer.result)}`}; ` +
            `its agent messages: ${show([...byMessage])}; the log: ${outlineLog(log)}`,
        );
        if (answer.error) {
          assert.fail(`session/prompt failed: ${showError(answer.error)}; updates: ${show(turn.updates)}; bridge stderr: ${bridge.stderrText.slice(-4_000)}`);
        }
        turn.checkShape();
        assert.equal(turn.stopReason, "end_turn", `stop reason; updates: ${show(turn.updates)}`);

        const stored = assertStoredOnce(log, text, id);
        assert.ok(writes.every((w) => w.key === stored.key), `every copy of the write carries the prompt's key ${stored.key}: ${show(writes)}`);
        assert.ok(writes.some((w) => w.status === 502), `some copy met the server down (502 from the proxy): ${show(writes)}`);
        assert.equal(writes.at(-1).status, 200, `the last copy was answered 200 by the restarted server: ${show(writes)}`);
        assert.ok(writes.length >= 3, `the first copy, at least one while the server was down, and one after: ${show(writes)}`);
        // The first copy's (lost) answer named the stored events: they are in the log, once.
        const lostUser = lostEvents.find((e) => e.type === "user.message");
        assert.ok(lostUser, `the lost answer holds the user.message: ${show(lostEvents)}`);
        assert.equal(log.filter((e) => e.type === "user.message")[0].id, lostUser.id, "the log's user.message is the one the first copy stored");

        const said = log.filter((e) => e.type === "agent.message").map(textOf);
        assert.deepEqual(said, [reply], `one agent.message, the whole reply: ${outlineLog(log)}`);
        const idle = log.filter((e) => e.type === "session.status_idle");
        assert.deepEqual(idle.map((e) => [e.turn_id, e.stop_reason?.type]), [[stored.turnId, "end_turn"]], `the turn ends once, end_turn: ${outlineLog(log)}`);
        const messages = [...byMessage];
        assert.ok(messages.length >= 1, `the reply reached the client: ${show(turn.updates)}`);
        assert.equal(messages.at(-1)[1], reply, `the prompt's last agent message is the whole reply: ${show(messages)}`);
      });
    });
  });

  test("D: the server dies after answering the prompt's write, before the bridge opens its stream; the bridge opens it again once the restarted server answers, and the resumed turn ends end_turn", TEST, async (t) => {
    await withRestartableServer(t, async (lab, server) => {
      let sessionId;
      let killedAt;
      const proxy = await startProxy(lab, server, { cut: () => false, onCut: async () => {} });
      let refusedOnce = false;
      proxy.refuse = (req) => {
        if (refusedOnce || !sessionId || req.method !== "GET" || !req.url.startsWith(`/sessions/${sessionId}/events/stream`)) return false;
        refusedOnce = true;
        return true;
      };
      proxy.onRefuse = async () => { await server.kill(); killedAt = performance.now(); };
      await withBridge(lab, proxy.url, async (c) => {
        const bridge = c.child;
        sessionId = await c.openSession();
        const text = "/words 20\n/delay 30";
        const params = { sessionId, prompt: [{ type: "text", text }] };
        const asked = c.call(m.agent.session.prompt, params, { timeoutMs: PROMPT_WITHIN_MS });
        asked.catch(() => {});
        await waitFor(() => killedAt !== undefined, 10_000, () => `kill; proxy saw ${show(proxy.requests)}`);
        await new Promise((r) => setTimeout(r, 500));
        await server.start();
        const answer = await asked;
        await new Promise((r) => setTimeout(r, 2000));
        const log = await allEvents(server.url, sessionId);
        t.diagnostic(`answer: ${answer.error ? showError(answer.error) : show(answer.result)}`);
        t.diagnostic(`proxy: ${show(proxy.requests.map((r) => [r.method, r.path, r.key, r.refused ? "killed+dropped" : r.status, r.error]))}`);
        t.diagnostic(`log: ${outlineLog(log)}`);
        t.diagnostic(`idle: ${show(log.filter((e) => e.type === "session.status_idle" || e.type === "user.interrupt" || e.type === "turn.resumed"))}`);
        t.diagnostic(`bridge stderr: ${bridge.stderrText}`);
        t.diagnostic(`updates: ${show(updatesIn(c.transcript, sessionId))}`);
      });
    });
  });
});

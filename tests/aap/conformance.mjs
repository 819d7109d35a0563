// AAP v3 conformance scenario for turnlog's Turn API, driven through ./client.mjs (a port of
// @agentapplicationprotocol/client 0.8.0). It relies on the default agent's scripted model
// (DESIGN.md §4): plain text -> "echo: <text>", "/tool <name> <json>" -> a tool call, and once
// the calls are resolved -> "tool results: <name>=<content>; ...".
//
//   TURNLOG_URL=http://127.0.0.1:PORT TURNLOG_KEY=k node --test conformance.mjs
//   (or: node conformance.mjs)
//
// The steps run in file order and share state; a step whose prerequisite failed fails too
// (never skipped), naming the dependency.

import test from "node:test";
import assert from "node:assert/strict";
import { Client, ClientError } from "./client.mjs";

const BASE_URL = process.env.TURNLOG_URL;
const API_KEY = process.env.TURNLOG_KEY ?? "turnlog-conformance";
if (!BASE_URL) {
  console.error("conformance.mjs: set TURNLOG_URL (e.g. http://127.0.0.1:8080)");
  process.exit(2);
}

const STEP = { timeout: 30_000 };
const WEATHER = {
  name: "get_weather",
  description: "Get weather",
  parameters: {
    type: "object",
    properties: { location: { type: "string" } },
    required: ["location"],
  },
};
const client = new Client({ baseUrl: BASE_URL, apiKey: API_KEY });

// Shared state between steps.
let sessionId; // main session (steps b-h, j)
let healthy = false; // the main session is idle with nothing pending (false after a failed step)
const toolMsgs = {}; // tool messages we expect in the full history, by step

// ---------- helpers ----------

function need(t, ...values) {
  if (values.some((v) => v === undefined || v === false)) {
    assert.fail("an earlier step this one depends on failed");
  }
  return true;
}

async function collect(stream) {
  assert.ok(stream, "expected an SSE stream, got undefined (404)");
  const events = [];
  for await (const e of stream) events.push(e);
  return events;
}

function names(events) {
  return events.map((e) => e.event);
}

// turn_start first, turn_stop last (and only there), nothing after it.
function checkFrame(events, stopReason) {
  assert.ok(events.length >= 2, `too few events: ${JSON.stringify(events)}`);
  assert.deepEqual(events[0], { event: "turn_start" }, `first event: ${JSON.stringify(events)}`);
  assert.deepEqual(
    events.at(-1),
    { event: "turn_stop", stopReason },
    `the last event must be turn_stop ${stopReason}, with nothing after it: ${JSON.stringify(events)}`,
  );
  const inner = events.slice(1, -1);
  for (const e of inner) {
    assert.ok(!["turn_start", "turn_stop"].includes(e.event), `stray ${e.event}: ${JSON.stringify(events)}`);
  }
  return inner;
}

// Assistant content as text: a string, or a single text block.
function assistantText(msg) {
  assert.equal(msg?.role, "assistant", `expected an assistant message: ${JSON.stringify(msg)}`);
  if (typeof msg.content === "string") return msg.content;
  assert.ok(Array.isArray(msg.content) && msg.content.length === 1, `content: ${JSON.stringify(msg.content)}`);
  assert.deepEqual(msg.content[0], { type: "text", text: msg.content[0].text });
  return msg.content[0].text;
}

function toolUses(msg) {
  return Array.isArray(msg?.content) ? msg.content.filter((b) => b.type === "tool_use") : [];
}

// A JSON (stream none) turn that must stop for one tool call `name`; returns its toolCallId.
async function expectToolUseStop(c, id, content, name, input) {
  const res = await c.postSessionTurn(id, { messages: [{ role: "user", content }] });
  assert.ok(res, "turn answered 404");
  assert.equal(res.stopReason, "tool_use");
  assert.equal(res.messages.length, 1, `messages: ${JSON.stringify(res.messages)}`);
  const uses = toolUses(res.messages[0]);
  assert.equal(res.messages[0].role, "assistant");
  assert.equal(uses.length, 1, `tool_use blocks: ${JSON.stringify(res.messages[0])}`);
  assert.equal(uses[0].name, name);
  assert.deepEqual(uses[0].input, input);
  assert.equal(typeof uses[0].toolCallId, "string");
  assert.ok(uses[0].toolCallId.length > 0);
  return uses[0].toolCallId;
}

// A JSON turn answering one permission; checks the returned [tool, assistant] exactly.
async function expectPermissionResult(id, permission, toolContent, reply) {
  const res = await client.postSessionTurn(id, { messages: [{ role: "tool_permission", ...permission }] });
  assert.ok(res, "turn answered 404");
  assert.equal(res.stopReason, "end_turn");
  assert.equal(res.messages.length, 2, `messages: ${JSON.stringify(res.messages)}`);
  const tool = { role: "tool", toolCallId: permission.toolCallId, content: toolContent };
  assert.deepEqual(res.messages[0], tool);
  assert.equal(assistantText(res.messages[1]), reply);
  assert.deepEqual(Object.keys(res.messages[1]).sort(), ["content", "role"]);
  return tool;
}

async function listAllSessions(c) {
  const all = [];
  let after;
  for (let page = 0; page < 1000; page++) {
    const res = await c.getSessions(after ? { after } : undefined);
    assert.ok(res && Array.isArray(res.sessions), `GET /sessions: ${JSON.stringify(res)}`);
    all.push(...res.sessions);
    if (!res.next) return all;
    assert.notEqual(res.next, after, "GET /sessions returned the same cursor twice");
    after = res.next;
  }
  assert.fail("GET /sessions did not stop paginating after 1000 pages");
}

// ---------- the scenario ----------

test("a. GET /meta: version 3, agent `default` with streams, histories and tools", STEP, async () => {
  const meta = await client.getMeta();
  assert.equal(meta.version, 3);
  assert.ok(Array.isArray(meta.agents), "agents must be an array");
  const agent = meta.agents.find((a) => a.name === "default");
  assert.ok(agent, `no agent named default in ${JSON.stringify(meta.agents.map((a) => a.name))}`);
  for (const mode of ["delta", "message", "none"]) {
    assert.ok(agent.capabilities?.stream?.[mode], `capabilities.stream.${mode} missing`);
  }
  for (const type of ["full", "compacted"]) {
    assert.ok(agent.capabilities?.history?.[type], `capabilities.history.${type} missing`);
  }
  const tools = (agent.tools ?? []).map((t) => t.name);
  assert.ok(tools.includes("calculator"), `tools: ${tools}`);
  assert.ok(tools.includes("current_time"), `tools: ${tools}`);
});

test("b. POST /sessions, GET /sessions/:id, GET /sessions", STEP, async () => {
  const res = await client.postSessions({
    agent: {
      name: "default",
      tools: [
        { name: "calculator", trust: false },
        { name: "current_time", trust: true },
      ],
    },
    tools: [WEATHER],
  });
  assert.equal(typeof res?.sessionId, "string", `POST /sessions: ${JSON.stringify(res)}`);
  assert.ok(res.sessionId.length > 0);

  const info = await client.getSession(res.sessionId);
  assert.ok(info, "GET /sessions/:id answered 404 for a new session");
  assert.equal(info.sessionId, res.sessionId);
  assert.equal(info.agent?.name, "default");

  const all = await listAllSessions(client);
  sessionId = res.sessionId;
  healthy = true;
  assert.ok(
    all.some((s) => s.sessionId === res.sessionId),
    `GET /sessions does not list ${res.sessionId}`,
  );
});

test("c. delta stream: turn_start, text_delta* = `echo: hello there`, turn_stop end_turn", STEP, async (t) => {
  if (!need(t, sessionId, healthy)) return;
  healthy = false;
  const events = await collect(
    await client.postSessionTurn(sessionId, {
      stream: "delta",
      messages: [{ role: "user", content: "hello there" }],
    }),
  );
  const inner = checkFrame(events, "end_turn");
  assert.ok(inner.length >= 1, "no text_delta events");
  for (const e of inner) {
    assert.equal(e.event, "text_delta", `unexpected event: ${JSON.stringify(e)}`);
    assert.deepEqual(Object.keys(e).sort(), ["delta", "event"]);
    assert.equal(typeof e.delta, "string");
  }
  assert.equal(inner.map((e) => e.delta).join(""), "echo: hello there");
  healthy = true;
});

test("d. message stream: client tool get_weather, then its result", STEP, async (t) => {
  if (!need(t, sessionId, healthy)) return;
  healthy = false;
  const events = await collect(
    await client.postSessionTurn(sessionId, {
      stream: "message",
      messages: [{ role: "user", content: '/tool get_weather {"location":"Tokyo"}' }],
    }),
  );
  assert.deepEqual(names(events), ["turn_start", "tool_call", "turn_stop"], JSON.stringify(events));
  checkFrame(events, "tool_use");
  const call = events[1];
  assert.equal(typeof call.toolCallId, "string");
  assert.ok(call.toolCallId.length > 0, "empty toolCallId");
  assert.deepEqual(call, {
    event: "tool_call",
    toolCallId: call.toolCallId,
    name: "get_weather",
    input: { location: "Tokyo" },
  });

  const tool = { role: "tool", toolCallId: call.toolCallId, content: "18C" };
  const after = await collect(
    await client.postSessionTurn(sessionId, { stream: "message", messages: [tool] }),
  );
  assert.deepEqual(names(after), ["turn_start", "text", "turn_stop"], JSON.stringify(after));
  checkFrame(after, "end_turn");
  assert.deepEqual(after[1], { event: "text", text: "tool results: get_weather=18C" });
  toolMsgs.d = tool;
  healthy = true;
});

test("e. stream none: untrusted calculator, permission granted", STEP, async (t) => {
  if (!need(t, sessionId, healthy)) return;
  healthy = false;
  const toolCallId = await expectToolUseStop(
    client,
    sessionId,
    '/tool calculator {"expression":"2*(3+4)"}',
    "calculator",
    { expression: "2*(3+4)" },
  );
  toolMsgs.e = await expectPermissionResult(
    sessionId,
    { toolCallId, granted: true },
    "14",
    "tool results: calculator=14",
  );
  healthy = true;
});

test("f. stream none: untrusted calculator, permission denied with a reason", STEP, async (t) => {
  if (!need(t, sessionId, healthy)) return;
  healthy = false;
  const toolCallId = await expectToolUseStop(
    client,
    sessionId,
    '/tool calculator {"expression":"2*(3+4)"}',
    "calculator",
    { expression: "2*(3+4)" },
  );
  toolMsgs.f = await expectPermissionResult(
    sessionId,
    { toolCallId, granted: false, reason: "User declined" },
    "Tool call denied: User declined",
    "tool results: calculator=Tool call denied: User declined",
  );
  healthy = true;
});

test("g. delta stream: trusted current_time runs inline, no stop", STEP, async (t) => {
  if (!need(t, sessionId, healthy)) return;
  healthy = false;
  const events = await collect(
    await client.postSessionTurn(sessionId, {
      stream: "delta",
      messages: [{ role: "user", content: "/tool current_time {}" }],
    }),
  );
  const inner = checkFrame(events, "end_turn");
  assert.ok(inner.length >= 3, JSON.stringify(events));
  const [call, result, ...deltas] = inner;
  assert.equal(call.event, "tool_call", JSON.stringify(events));
  assert.equal(call.name, "current_time");
  assert.deepEqual(call.input, {});
  assert.equal(typeof call.toolCallId, "string");
  assert.ok(call.toolCallId.length > 0);
  assert.equal(result.event, "tool_result", JSON.stringify(events));
  assert.equal(result.toolCallId, call.toolCallId);
  assert.ok(
    (typeof result.content === "string" || Array.isArray(result.content)) && result.content.length > 0,
    `tool_result content: ${JSON.stringify(result.content)}`,
  );
  assert.ok(deltas.length >= 1, "no text_delta after the tool result");
  for (const e of deltas) assert.equal(e.event, "text_delta", JSON.stringify(e));
  if (typeof result.content === "string") {
    assert.equal(deltas.map((e) => e.delta).join(""), `tool results: current_time=${result.content}`);
  }
  healthy = true;
});

test("h. GET /sessions/:id/history full and compacted", STEP, async (t) => {
  if (!need(t, sessionId, toolMsgs.d, toolMsgs.e, toolMsgs.f)) return;
  const res = await client.getSessionHistory(sessionId, "full");
  assert.ok(res, "history answered 404");
  const full = res.history?.full;
  assert.ok(Array.isArray(full), `history.full: ${JSON.stringify(res)}`);

  const first = full[0];
  assert.equal(first?.role, "user", `first message: ${JSON.stringify(first)}`);
  const firstText =
    typeof first.content === "string"
      ? first.content
      : first.content.length === 1 && first.content[0].type === "text"
        ? first.content[0].text
        : undefined;
  assert.equal(firstText, "hello there");

  for (const step of ["d", "e", "f"]) {
    assert.ok(
      full.some((m) => m.role === "tool" && m.toolCallId === toolMsgs[step].toolCallId && m.content === toolMsgs[step].content),
      `step ${step}'s tool message ${JSON.stringify(toolMsgs[step])} is not in the full history`,
    );
  }
  assert.ok(!full.some((m) => m.role === "tool_permission"), "tool_permission messages must never be stored");

  const toolIds = new Set(full.filter((m) => m.role === "tool").map((m) => m.toolCallId));
  for (const m of full) {
    for (const use of toolUses(m)) {
      assert.ok(toolIds.has(use.toolCallId), `tool_use ${use.toolCallId} (${use.name}) has no tool message`);
    }
  }

  const compacted = await client.getSessionHistory(sessionId, "compacted");
  assert.ok(compacted, "compacted history answered 404");
  assert.ok(Array.isArray(compacted.history?.compacted), `history.compacted: ${JSON.stringify(compacted)}`);
});

test("i. tool call resumption from history with a fresh client (seed 003)", STEP, async () => {
  const { sessionId: id } = await client.postSessions({
    agent: { name: "default" },
    tools: [WEATHER],
  });
  await expectToolUseStop(client, id, '/tool get_weather {"location":"Paris"}', "get_weather", { location: "Paris" });

  // A new client with no memory of the turn above.
  const fresh = new Client({ baseUrl: BASE_URL, apiKey: API_KEY });
  const info = await fresh.getSession(id);
  assert.ok(info, "GET /sessions/:id answered 404");
  const res = await fresh.getSessionHistory(id, "full");
  assert.ok(Array.isArray(res?.history?.full), `history: ${JSON.stringify(res)}`);
  const full = res.history.full;
  const lastAssistant = full.findLast((m) => m.role === "assistant");
  const resolved = new Set(full.filter((m) => m.role === "tool").map((m) => m.toolCallId));
  const pending = toolUses(lastAssistant).filter((u) => !resolved.has(u.toolCallId));
  assert.equal(pending.length, 1, `pending tool calls: ${JSON.stringify(pending)}`);
  assert.equal(pending[0].name, "get_weather");
  assert.deepEqual(pending[0].input, { location: "Paris" });
  // Client-side, by the names the session declares (when GET /sessions/:id reports them).
  if (info.tools !== undefined) {
    assert.ok(info.tools.some((tool) => tool.name === "get_weather"), `session tools: ${JSON.stringify(info.tools)}`);
  }

  const out = await fresh.postSessionTurn(id, {
    messages: [{ role: "tool", toolCallId: pending[0].toolCallId, content: "9C" }],
  });
  assert.ok(out, "turn answered 404");
  assert.equal(out.stopReason, "end_turn");
  assert.equal(assistantText(out.messages.at(-1)), "tool results: get_weather=9C");

  assert.equal(await fresh.deleteSession(id), undefined);
});

test("j. errors: 404s, a user message while a call is pending, delete", STEP, async () => {
  assert.equal(await client.getSession("sess_does_not_exist"), undefined);
  assert.equal(
    await client.postSessionTurn("sess_does_not_exist", { messages: [{ role: "user", content: "hi" }] }),
    undefined,
  );
  assert.equal(
    await client.postSessionTurn("sess_does_not_exist", {
      stream: "delta",
      messages: [{ role: "user", content: "hi" }],
    }),
    undefined,
  );

  // The main session when it is usable, else a session of its own (so one earlier failure
  // does not hide this check).
  let id = healthy ? sessionId : undefined;
  if (!id) {
    ({ sessionId: id } = await client.postSessions({ agent: { name: "default" }, tools: [WEATHER] }));
  }
  const pendingId = await expectToolUseStop(
    client,
    id,
    '/tool get_weather {"location":"Oslo"}',
    "get_weather",
    { location: "Oslo" },
  );
  for (const stream of [undefined, "delta"]) {
    const req = { messages: [{ role: "user", content: "are you there?" }] };
    if (stream) req.stream = stream;
    await assert.rejects(
      client.postSessionTurn(id, req),
      (err) => {
        assert.ok(err instanceof ClientError, `expected ClientError, got ${err}`);
        assert.ok([400, 409].includes(err.status), `status ${err.status}: ${err.text}`);
        assert.ok(err.text.includes(pendingId), `error text does not name ${pendingId}: ${err.text}`);
        return true;
      },
      `a user message with a pending call (stream ${stream ?? "none"}) must be refused`,
    );
  }

  for (const sid of new Set([id, sessionId].filter(Boolean))) {
    assert.equal(await client.deleteSession(sid), undefined);
    assert.equal(await client.getSession(sid), undefined, `GET /sessions/${sid} after DELETE`);
  }
});

test("k. stop reasons: only AAP's five, whatever ended the turn", STEP, async () => {
  const FIVE = ["end_turn", "tool_use", "max_tokens", "refusal", "error"];
  const { sessionId: id } = await client.postSessions({
    agent: { name: "default", tools: [{ name: "calculator", trust: true }] },
  });
  const stops = {};
  for (const [name, content] of [["max_tokens", "/max_tokens"], ["refusal", "/refuse"], ["loop", "/loop"], ["error", "/error model_overloaded_error"]]) {
    const res = await client.postSessionTurn(id, { messages: [{ role: "user", content }] });
    stops[name] = res.stopReason;
  }
  // An interrupt (through the native event API) while a delta stream runs.
  const stream = await client.postSessionTurn(id, {
    stream: "delta",
    messages: [{ role: "user", content: "/delay 50\n/words 100" }],
  });
  const events = [];
  for await (const e of stream) {
    events.push(e);
    if (e.event === "text_delta" && events.filter((x) => x.event === "text_delta").length === 2) {
      const res = await fetch(client.url(`/sessions/${id}/events`), {
        method: "POST",
        headers: client.headers,
        body: JSON.stringify({ events: [{ type: "user.interrupt" }] }),
      });
      assert.equal(res.status, 200, await res.text());
    }
  }
  stops.interrupted = checkFrame(events, "end_turn") && events.at(-1).stopReason;
  assert.deepEqual(stops, {
    max_tokens: "max_tokens",
    refusal: "refusal",
    loop: "max_tokens", // the agent's limit of model requests: cut short
    error: "error",
    interrupted: "end_turn", // the client's interrupt: the turn ended, the session goes on
  });
  assert.ok(Object.values(stops).every((s) => FIVE.includes(s)), JSON.stringify(stops));
  assert.equal(await client.deleteSession(id), undefined);
});

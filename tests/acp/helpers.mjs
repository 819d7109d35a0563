// Helpers for the `turnlog acp` integration tests: spawn the agent (and a server for the
// bridge mode), drive it with the official client (@agentclientprotocol/sdk 2.4.0, unchanged),
// keep a transcript of every JSON-RPC line each way, and cut it into per-prompt views.
//
// Why a transcript: the SDK hands our handlers zod-parsed params, which silently drop fields
// it cannot read (an invalid `status` becomes undefined, a bad content item disappears). So
// the assertions read the agent's own lines, and `AcpClient.checkTranscript()` checks that the
// SDK read every update and permission request exactly as the agent wrote it.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { Writable } from "node:stream";
import { StringDecoder } from "node:string_decoder";
import * as acp from "@agentclientprotocol/sdk";
import { stdoutLines } from "../common/lines.mjs";

export { acp };
export const m = acp.methods;

export const BIN = process.env.TURNLOG_BIN ?? new URL("../../target/debug/turnlog", import.meta.url).pathname;
export const TEST = { timeout: 60_000 };
/** How long the agent may take to exit after its stdin closes. */
export const EXIT_WITHIN_MS = 5_000;
/** How long any one request may take before the test fails (prompts here take ~1 s). */
export const CALL_TIMEOUT_MS = 20_000;
export const STOP_REASONS = ["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"];
export const SESSION_ID = /^sess_[0-9A-HJKMNP-TV-Z]{26}$/;
export const EVENT_ID = /^evt_[0-9A-HJKMNP-TV-Z]{26}$/;

// ---------- small utilities ----------

/** Compact JSON for assertion messages, cut so a failure stays readable. */
export function show(value, max = 6_000) {
  const text = JSON.stringify(value);
  return text === undefined ? String(value) : text.length > max ? `${text.slice(0, max)}…(${text.length} chars)` : text;
}

/** Lets queued microtasks and I/O callbacks run (the SDK dispatches through promise chains). */
export function settle() {
  return new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
}

/** Polls `check` every 10 ms until it returns a truthy value; fails after `ms` with `describe()`. */
export async function waitFor(check, ms, describe) {
  const deadline = performance.now() + ms;
  for (;;) {
    const value = check();
    if (value) return value;
    if (performance.now() > deadline) assert.fail(`timed out after ${ms} ms: ${describe()}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** `promise`, or a failure naming `what` if it has not settled within `ms`. */
export function deadline(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new assert.AssertionError({ message: `${what}: not done within ${ms} ms` })), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** The turnlog config's default agent's `max_turn_requests` (config/default.toml). */
export function defaultMaxTurnRequests() {
  const toml = fs.readFileSync(new URL("../../config/default.toml", import.meta.url), "utf8");
  const section = toml.split(/^\[agents\.default\]$/m)[1] ?? "";
  const found = /^max_turn_requests\s*=\s*(\d+)/m.exec(section);
  assert.ok(found, "config/default.toml: no max_turn_requests under [agents.default]");
  return Number(found[1]);
}

/** The text of a content block list as ACP tool content: `[{type:"content", content:{type:"text", text}}]`. */
export function contentText(content) {
  return (content ?? []).map((c) => (c?.type === "content" && c.content?.type === "text" ? c.content.text : "")).join("");
}

// Everything the SDK logs with console.error (it does so for notifications it could not
// parse, responses to unknown requests, invalid messages), so a test can fail on it.
const sdkErrors = [];
const consoleError = console.error;
console.error = (...args) => {
  sdkErrors.push(args.map((a) => (typeof a === "string" ? a : show(a, 500))).join(" "));
  consoleError(...args);
};

// ---------- processes and temp dirs ----------

/** One test's resources: temp dirs, child processes, open streams; all released in `after`. */
export class Lab {
  constructor(t) {
    this.t = t;
    this.dirs = [];
    this.children = [];
    this.cleanups = [];
    t.after(() => this.cleanup());
  }

  tempDir(prefix = "turnlog-acp-") {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
    this.dirs.push(dir);
    return dir;
  }

  onCleanup(fn) {
    this.cleanups.push(fn);
  }

  /** A line in the test's report (shown with its result). */
  note(message) {
    this.t.diagnostic(message);
  }

  /** Spawns the turnlog binary with `args`; records its stderr and when it exits. */
  spawn(args, { cwd } = {}) {
    // No TURNLOG__* settings or TURNLOG_API_KEY from the caller's shell: the test says what it wants.
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TURNLOG_")));
    const dir = cwd ?? this.tempDir("turnlog-cwd-");
    const child = spawn(BIN, args, { stdio: ["pipe", "pipe", "pipe"], env, cwd: dir });
    child.args = args;
    child.cwd = dir;
    child.spawnedAt = performance.now();
    child.stderrText = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (s) => {
      child.stderrText = (child.stderrText + s).slice(-20_000);
    });
    child.stdin.on("error", () => {}); // EPIPE once it has exited: the test sees that elsewhere
    child.exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => resolve({ code, signal, at: performance.now() }));
      child.once("error", (error) => {
        child.spawnError = error; // e.g. ENOENT: the binary is not built
        resolve({ code: null, signal: null, error, at: performance.now() });
      });
    });
    child.closed = new Promise((resolve) => child.once("close", resolve));
    this.children.push(child);
    return child;
  }

  /** Starts `turnlog serve` on a free loopback port; resolves once it printed its address. */
  async startServer({ dataDir = this.tempDir("turnlog-data-"), config } = {}) {
    const args = ["serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir];
    if (config) args.push("--config", config);
    const child = this.spawn(args);
    const lines = stdoutLines(child);
    const url = await Promise.race([
      waitFor(() => lines.length > 0, 15_000, () => `turnlog serve printed nothing; stderr: ${child.stderrText}`),
      child.exited.then((e) => assert.fail(`turnlog serve exited (${show(e)}) before listening: ${child.stderrText}`)),
    ]).then(() => {
      const found = /^listening on (http:\/\/127\.0\.0\.1:\d+)$/.exec(lines[0]);
      assert.ok(found, `turnlog serve's first stdout line: ${show(lines[0])}`);
      return found[1];
    });
    return { url, dataDir, child, stdoutLines: lines };
  }

  /** What `turnlog acp` runs against in `mode`: its own data dir, or a fresh server; with
   * `config` (a config file's text) for the engine, and `agent` for `--agent`. */
  async target(mode, { config, agent } = {}) {
    const dataDir = this.tempDir("turnlog-data-");
    let configFile;
    if (config !== undefined) {
      configFile = path.join(this.tempDir("turnlog-config-"), "turnlog.toml");
      fs.writeFileSync(configFile, config);
    }
    const agentArgs = agent ? ["--agent", agent] : [];
    if (mode === "embedded") {
      const configArgs = configFile ? ["--config", configFile] : [];
      return { mode, dataDir, args: ["acp", "--data-dir", dataDir, ...configArgs, ...agentArgs] };
    }
    assert.equal(mode, "bridge", `unknown mode ${mode}`);
    const server = await this.startServer({ dataDir, config: configFile });
    return { mode, dataDir, server, args: ["acp", "--server", server.url, ...agentArgs] };
  }

  async cleanup() {
    for (const fn of this.cleanups.splice(0)) {
      try {
        await fn();
      } catch {
        // best effort: the test already has its verdict
      }
    }
    for (const child of this.children) {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        const gone = await Promise.race([child.exited, new Promise((r) => setTimeout(() => r(false), 5_000))]);
        if (!gone) child.kill("SIGKILL");
      }
      await child.exited;
    }
    if (!process.env.TURNLOG_TEST_KEEP) {
      for (const dir of this.dirs) fs.rmSync(dir, { recursive: true, force: true });
    }
  }
}

/** Closes a child's stdin and waits for it to exit; returns its exit and how long it took. */
export async function closeAndWait(child, ms = EXIT_WITHIN_MS * 3) {
  const from = performance.now();
  child.stdin.end();
  const exit = await deadline(child.exited, ms, `${child.args.join(" ")} after its stdin closed`);
  await deadline(child.closed, 5_000, `${child.args.join(" ")}: its stdout to close after it exited`); // every byte read
  return { ...exit, ms: exit.at - from };
}

/** Asserts a clean, prompt exit after stdin closed. */
export function assertCleanExit(exit, child) {
  assert.equal(exit.signal, null, `turnlog ${child.args[0]} was killed by ${exit.signal}; stderr: ${child.stderrText}`);
  assert.equal(exit.code, 0, `turnlog ${child.args[0]} exited ${exit.code}; stderr: ${child.stderrText}`);
  assert.ok(exit.ms < EXIT_WITHIN_MS, `turnlog ${child.args[0]} took ${Math.round(exit.ms)} ms to exit after stdin closed`);
}

// ---------- the ACP client ----------

function isRequest(msg) {
  return msg && typeof msg.method === "string" && "id" in msg;
}
function isResponse(msg) {
  return msg && !("method" in msg) && "id" in msg;
}
function isUpdate(msg, sessionId) {
  return msg?.method === "session/update" && (sessionId === undefined || msg.params?.sessionId === sessionId);
}
function isPermission(msg, sessionId) {
  return msg?.method === "session/request_permission" && (sessionId === undefined || msg.params?.sessionId === sessionId);
}

/** Where the SDK read something other than what was written: dropped or changed fields. */
function drift(raw, parsed, at = "") {
  if (Object.is(raw, parsed)) return [];
  if (Array.isArray(raw)) {
    if (!Array.isArray(parsed) || parsed.length !== raw.length) return [`${at}: ${show(raw, 300)} read as ${show(parsed, 300)}`];
    return raw.flatMap((v, i) => drift(v, parsed[i], `${at}[${i}]`));
  }
  if (raw && typeof raw === "object") {
    if (!parsed || typeof parsed !== "object") return [`${at}: ${show(raw, 300)} read as ${show(parsed, 300)}`];
    // Keys the schema does not know are stripped (allowed); keys it knows must survive as sent.
    return Object.keys(raw).flatMap((k) => (k in parsed ? drift(raw[k], parsed[k], `${at}.${k}`) : []));
  }
  return [`${at}: ${show(raw, 300)} read as ${show(parsed, 300)}`];
}

/**
 * A `turnlog acp` process driven by the official client. `agent` is the SDK's ClientContext
 * (set inside `withAgent`); `transcript` holds every line each way, in the order we saw them.
 */
export class AcpClient {
  /** `editor`: an Editor (./editor.mjs) that serves `fs/*` and `terminal/*`, advertised at initialize. */
  constructor(child, { editor } = {}) {
    this.child = child;
    this.editor = editor;
    this.transcript = []; // {dir: "in"|"out", msg, line?, bad?, delivered?, at}
    this.sdkUpdates = []; // session/update params as the SDK's handler got them
    this.sdkPermissions = []; // session/request_permission params as the SDK's handler got them
    this.held = []; // permission requests waiting for the test: {params, answer(choice)}
    this.problems = []; // what the handlers could not do (a handler's throw would reach the agent, not the test)
    this.sdkErrorsFrom = sdkErrors.length;
    /** What to answer a permission request: an option kind, "cancelled", or "hold". */
    this.permissionPolicy = "cancelled";
    this.detached = false;
    /**
     * Sessions whose `session/load` may be followed by updates after its answer: a load of a
     * session whose turn still runs goes on streaming that turn until it ends. A test that
     * adds a session here checks those updates itself; `lateUpdates` leaves them out.
     */
    this.loadsFollowRunningTurn = new Set();
  }

  /** The SDK stream over the child's stdio, recording each line before the SDK sees it. */
  stream() {
    const child = this.child;
    const decoder = new StringDecoder("utf8");
    let pending = "";
    let controller;
    const readable = new ReadableStream({
      start: (c) => {
        controller = c;
      },
      cancel: () => {
        this.detached = true; // the SDK is done; we keep reading (and recording) until exit
      },
    });
    child.stdout.on("data", (chunk) => {
      const parts = (pending + decoder.write(chunk)).split("\n");
      pending = parts.pop();
      for (const line of parts) this.recordIn(line);
      if (!this.detached) controller.enqueue(new Uint8Array(chunk));
    });
    child.stdout.on("end", () => {
      if (pending) this.recordIn(pending, { unterminated: true });
      if (!this.detached) controller.close();
    });
    const inner = acp.ndJsonStream(Writable.toWeb(child.stdin), readable);
    const writable = new WritableStream({
      write: async (msg) => {
        this.transcript.push({ dir: "out", msg, at: performance.now() });
        const writer = inner.writable.getWriter();
        try {
          await writer.write(msg);
        } finally {
          writer.releaseLock();
        }
      },
    });
    return { readable: inner.readable, writable };
  }

  recordIn(line, { unterminated = false } = {}) {
    const entry = { dir: "in", line, at: performance.now(), delivered: !this.detached };
    if (unterminated) entry.bad = "the last line has no newline";
    if (line.trim() === "") entry.bad = "an empty line";
    else {
      try {
        entry.msg = JSON.parse(line);
      } catch (e) {
        entry.bad = `not JSON (${e.message})`;
      }
    }
    this.transcript.push(entry);
  }

  /** The client app: records what the SDK hands us and answers permissions by policy. */
  app() {
    const app = acp
      .client({ name: "turnlog-acp-test" })
      .onNotification(m.client.session.update, ({ params }) => {
        this.sdkUpdates.push(params);
      })
      .onRequest(m.client.session.requestPermission, ({ params }) => {
        this.sdkPermissions.push(params);
        if (this.permissionPolicy === "hold") {
          return new Promise((resolve) => {
            this.held.push({ params, answer: (choice) => resolve(this.permissionAnswer(params, choice)) });
          });
        }
        return this.permissionAnswer(params, this.permissionPolicy);
      });
    return this.editor ? this.editor.register(app) : app;
  }

  /** The answer choosing the option of kind `choice` (or "cancelled"). */
  permissionAnswer(params, choice) {
    if (choice === "cancelled") return { outcome: { outcome: "cancelled" } };
    const option = params.options?.find((o) => o.kind === choice);
    if (!option) {
      this.problems.push(`a permission request without a ${choice} option: ${show(params)}`);
      return { outcome: { outcome: "cancelled" } };
    }
    return { outcome: { outcome: "selected", optionId: option.optionId } };
  }

  // ----- requests -----

  /**
   * Sends a request; returns `{result}` or `{error}` (an acp.RequestError: `code`, `message`,
   * `data`) and `window`: the lines that arrived between the request and its response.
   */
  async call(method, params = {}, { timeoutMs = CALL_TIMEOUT_MS } = {}) {
    let result;
    let error;
    try {
      result = await deadline(this.agent.request(method, params), timeoutMs, `${method} ${show(params, 300)}`);
    } catch (e) {
      if (!(e instanceof acp.RequestError)) throw e;
      error = e;
    }
    const out = this.transcript.findIndex((e) => e.dir === "out" && e.msg.method === method && e.msg.params === params);
    assert.ok(out >= 0, `${method}: the request is not in the transcript`);
    const id = this.transcript[out].msg.id;
    const answer = this.transcript.findIndex((e, i) => i > out && e.dir === "in" && isResponse(e.msg) && e.msg.id === id);
    assert.ok(answer > out, `${method}: the response (id ${id}) is not in the transcript`);
    return { result, error, window: this.transcript.slice(out + 1, answer), answerIndex: answer, answeredAt: this.transcript[answer].at };
  }

  /** A request that must succeed; returns its result. */
  async ok(method, params = {}) {
    const { result, error } = await this.call(method, params);
    if (error) assert.fail(`${method} failed: ${showError(error)}`);
    return result;
  }

  /** A request that must fail; returns the RequestError. */
  async fails(method, params = {}) {
    const { result, error } = await this.call(method, params);
    assert.ok(error, `${method} ${show(params, 300)} should have failed, got ${show(result)}`);
    assert.equal(typeof error.code, "number", `error without a numeric code: ${show(error)}`);
    return error;
  }

  initializeParams() {
    return {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: this.editor?.capabilities() ?? { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      clientInfo: { name: "turnlog-acp-test", version: "0" },
    };
  }

  async initialize() {
    return this.ok(m.agent.initialize, this.initializeParams());
  }

  /** session/new params: the agent's working directory (absolute), no MCP servers. */
  newSessionParams(mcpServers = []) {
    return { cwd: this.child.cwd, mcpServers };
  }

  /** initialize + session/new; returns the session id. */
  async openSession() {
    await this.initialize();
    const { sessionId } = await this.ok(m.agent.session.new, this.newSessionParams());
    assert.match(sessionId, SESSION_ID, "session/new: the session id");
    return sessionId;
  }

  /** A prompt that must be answered with a stop reason; returns its Turn. */
  async prompt(sessionId, prompt) {
    const blocks = typeof prompt === "string" ? [{ type: "text", text: prompt }] : prompt;
    const reply = await this.call(m.agent.session.prompt, { sessionId, prompt: blocks });
    const turn = new Turn(sessionId, blocks, reply);
    if (reply.error) assert.fail(`session/prompt ${show(blocks, 300)} failed: ${showError(reply.error)}; its updates: ${show(turn.updates)}`);
    turn.checkShape();
    return turn;
  }

  /** session/load; returns its result (as the SDK gives it, and as sent) and the replayed updates (those that arrived before its response). */
  async load(sessionId, mcpServers = []) {
    const reply = await this.call(m.agent.session.load, { sessionId, cwd: this.child.cwd, mcpServers });
    if (reply.error) assert.fail(`session/load failed: ${showError(reply.error)}`);
    const wire = this.transcript[reply.answerIndex].msg.result; // the SDK turns null into {}
    return { result: reply.result, wire, updates: updatesIn(reply.window, sessionId) };
  }

  cancel(sessionId) {
    return this.agent.notify(m.agent.session.cancel, { sessionId });
  }

  // ----- waiting -----

  /** Waits for an update for `sessionId` matching `pred` that arrived after transcript index `from`. */
  waitForUpdate(sessionId, pred, { from = 0, ms = 10_000, what = "an update" } = {}) {
    return waitFor(
      () => this.transcript.find((e, i) => i >= from && isUpdate(e.msg, sessionId) && pred(e.msg.params.update)),
      ms,
      () => `${what} for ${sessionId}; updates so far: ${show(updatesIn(this.transcript, sessionId))}`,
    );
  }

  /** Waits for a permission request held by the "hold" policy; returns {params, answer}. */
  waitForHeldPermission(ms = 10_000) {
    return waitFor(() => this.held.shift(), ms, () => `a permission request; transcript tail: ${show(this.transcript.slice(-10))}`);
  }

  // ----- checks over the whole connection -----

  /** Failures that hold for any connection; run after the process exited. */
  checkTranscript() {
    assert.deepEqual(this.problems, [], "the client's handlers met requests they could not answer as told");
    const bad = this.transcript.filter((e) => e.dir === "in" && (e.bad || !isJsonRpc(e.msg)));
    assert.deepEqual(bad.map((e) => e.line), [], `stdout lines that are not JSON-RPC 2.0 messages: ${show(bad)}`);

    const late = this.lateUpdates();
    assert.deepEqual(late, [], `session/update after the prompt or load it belongs to was answered (before the next request): ${show(late)}`);

    const delivered = (pred) => this.transcript.filter((e) => e.dir === "in" && e.delivered && pred(e.msg)).map((e) => e.msg.params);
    for (const [name, raw, parsed] of [
      ["session/update", delivered((x) => isUpdate(x)), this.sdkUpdates],
      ["session/request_permission", delivered((x) => isPermission(x)), this.sdkPermissions],
    ]) {
      assert.equal(parsed.length, raw.length, `the SDK accepted ${parsed.length} of ${raw.length} ${name} messages (see its console.error output)`);
      const changed = raw.flatMap((params, i) => drift(params, parsed[i], `${name}#${i}`));
      assert.deepEqual(changed, [], `the SDK's schema read ${name} params differently from what the agent wrote`);
    }
    const logged = sdkErrors.slice(this.sdkErrorsFrom);
    assert.deepEqual(logged, [], "the SDK logged errors while talking to the agent");
  }

  /** Updates for a session that arrived after its prompt/load answer, before the next request
   * (but for the `available_commands_update` that adds the session's MCP servers' prompts,
   * which comes once they are listed). */
  lateUpdates() {
    const requests = new Map();
    const late = [];
    this.transcript.forEach((e, i) => {
      if (e.dir === "out" && isRequest(e.msg)) requests.set(e.msg.id, e.msg);
      if (e.dir !== "in" || !isResponse(e.msg) || !("result" in e.msg)) return;
      const request = requests.get(e.msg.id);
      if (!["session/prompt", "session/load"].includes(request?.method)) return;
      if (request.method === "session/load" && this.loadsFollowRunningTurn.has(request.params.sessionId)) return;
      for (const next of this.transcript.slice(i + 1)) {
        if (next.dir === "out" && isRequest(next.msg)) break;
        const update = next.msg?.params?.update;
        const commands = update?.sessionUpdate === "available_commands_update" && update.availableCommands.some((c) => c.name.startsWith("mcp:"));
        if (next.dir === "in" && isUpdate(next.msg, request.params.sessionId) && !commands) late.push({ after: request.method, update: next.msg.params.update });
      }
    });
    return late;
  }

  context() {
    const failed = this.child.spawnError ? `could not start ${BIN}: ${this.child.spawnError.message}; ` : "";
    const exit = this.child.exitCode ?? this.child.signalCode ?? "still running";
    return `${failed}turnlog ${this.child.args.join(" ")} (exit: ${exit}); stderr (tail): ${this.child.stderrText.slice(-3_000)}\nlast lines: ${show(this.transcript.slice(-8).map((e) => [e.dir, e.msg ?? e.line]), 3_000)}`;
  }
}

/** A JSON-RPC error as the SDK gives it (acp.RequestError: code, message, data). */
export function showError(error) {
  return show({ code: error.code, message: error.message, data: error.data });
}

function isJsonRpc(msg) {
  if (!msg || typeof msg !== "object" || Array.isArray(msg) || msg.jsonrpc !== "2.0") return false;
  if (typeof msg.method === "string") return true;
  return "id" in msg && ("result" in msg) !== ("error" in msg);
}

/**
 * The session/update payloads for `sessionId` in a list of transcript entries, but for the
 * session's commands (`available_commands_update`): sent once the client knows a session,
 * after session/new's answer, they may arrive in the next request's window. `commandsIn`
 * reads them.
 */
export function updatesIn(entries, sessionId) {
  return entries.filter((e) => e.dir === "in" && isUpdate(e.msg, sessionId)).map((e) => e.msg.params.update).filter((u) => u.sessionUpdate !== "available_commands_update");
}

/** The `available_commands_update`s for `sessionId` in a list of transcript entries. */
export function commandsIn(entries, sessionId) {
  return entries.filter((e) => e.dir === "in" && isUpdate(e.msg, sessionId) && e.msg.params.update.sessionUpdate === "available_commands_update").map((e) => e.msg.params.update);
}

/**
 * Runs `op(client)` against a fresh `turnlog acp ARGS` process driven by the SDK's
 * `connectWith`. Afterwards closes its stdin, asserts it exits 0 within EXIT_WITHIN_MS, and
 * runs `checkTranscript()`. Returns `{result, exit, client}`. `options`: `{editor, cwd}` (an
 * editor serving files and terminals, and the agent's working directory).
 */
export async function withAgent(lab, args, op, { editor, cwd } = {}) {
  const child = lab.spawn(args, { cwd });
  const client = new AcpClient(child, { editor });
  let result;
  try {
    result = await client.app().connectWith(client.stream(), async (agent) => {
      client.agent = agent;
      const value = await op(client);
      await settle(); // let the SDK dispatch what has arrived before connectWith closes
      return value;
    });
  } catch (error) {
    lab.note(client.context()); // stderr and the last lines: why a request failed or hung
    child.kill("SIGKILL");
    throw error;
  }
  const exit = await closeAndWait(child);
  assertCleanExit(exit, child);
  client.checkTranscript();
  return { result, exit, client };
}

// ---------- one prompt's updates ----------

/** One prompt: its stop reason and the updates and permission requests it got, in order. */
export class Turn {
  constructor(sessionId, prompt, reply) {
    this.sessionId = sessionId;
    this.prompt = prompt;
    this.result = reply.result;
    this.stopReason = reply.result?.stopReason;
    this.answeredAt = reply.answeredAt; // performance.now() when the answer line arrived
    this.answerIndex = reply.answerIndex; // its place in the client's transcript
    // updates and permission requests for this session, as they arrived
    // (Not the session's commands: see `updatesIn`.)
    this.events = reply.window
      .filter((e) => e.dir === "in" && (isUpdate(e.msg, sessionId) || isPermission(e.msg, sessionId)))
      .filter((e) => e.msg.params?.update?.sessionUpdate !== "available_commands_update")
      .map((e) => (isUpdate(e.msg) ? { update: e.msg.params.update, at: e.at } : { permission: e.msg.params, at: e.at }));
    this.updates = this.events.filter((e) => e.update).map((e) => e.update);
    this.permissions = this.events.filter((e) => e.permission).map((e) => e.permission);
    this.items = outline(this.updates);
  }

  chunks(kind) {
    return this.updates.filter((u) => u.sessionUpdate === kind);
  }
  get text() {
    return this.chunks("agent_message_chunk").map((u) => u.content?.text ?? "").join("");
  }
  get thought() {
    return this.chunks("agent_thought_chunk").map((u) => u.content?.text ?? "").join("");
  }
  get toolCalls() {
    return this.items.filter((i) => i.kind === "tool");
  }
  /** Position of the first event matching `pred` in `events` (-1 if none). */
  indexOf(pred) {
    return this.events.findIndex(pred);
  }

  /** What every prompt must look like, whatever it asked for. */
  checkShape() {
    const all = show(this.updates);
    assert.ok(STOP_REASONS.includes(this.stopReason), `stopReason ${show(this.result)} is not one of ${STOP_REASONS}`);
    assert.deepEqual(this.chunks("user_message_chunk"), [], `the prompt's own user message must not be echoed live: ${all}`);
    for (const u of [...this.chunks("agent_message_chunk"), ...this.chunks("agent_thought_chunk")]) {
      assert.equal(u.content?.type, "text", `chunk content: ${show(u)}`);
      assert.equal(typeof u.content.text, "string", `chunk text: ${show(u)}`);
      assert.ok(typeof u.messageId === "string" && u.messageId.length > 0, `chunk without a messageId: ${show(u)}`);
    }
    const orphans = this.items.filter((i) => i.kind === "orphan");
    assert.deepEqual(orphans, [], `tool_call_update for a toolCallId with no tool_call before it: ${all}`);
  }
}

/**
 * A conversation as a list of items: `{kind: "user"|"agent"|"thought", text, messageId}` (one
 * per message: consecutive chunks with the same messageId join) and `{kind: "tool", ...}` (a
 * tool_call folded with its tool_call_updates). Empty text chunks say nothing and are skipped.
 */
export function outline(updates) {
  const items = [];
  const tools = new Map();
  const chunkKinds = { user_message_chunk: "user", agent_message_chunk: "agent", agent_thought_chunk: "thought" };
  for (const u of updates) {
    const kind = chunkKinds[u.sessionUpdate];
    if (kind) {
      if (u.content?.type === "text" && u.content.text === "") continue;
      const last = items.at(-1);
      if (u.content?.type === "text" && last?.kind === kind && last.messageId === u.messageId && last.blocks.every((b) => b.type === "text")) {
        last.text += u.content.text;
        last.blocks.push(u.content);
      } else {
        items.push({ kind, messageId: u.messageId, text: u.content?.type === "text" ? u.content.text : undefined, blocks: [u.content] });
      }
    } else if (u.sessionUpdate === "tool_call") {
      // ACP: a tool_call without `status` is pending, without `kind` is other (the Rust
      // schema crate leaves defaults out of the JSON).
      const status = u.status ?? "pending";
      const call = { kind: "tool", toolCallId: u.toolCallId, title: u.title, toolKind: u.kind ?? "other", status, statuses: [status], rawInput: u.rawInput, content: u.content, rawOutput: u.rawOutput, locations: u.locations };
      tools.set(u.toolCallId, call);
      items.push(call);
    } else if (u.sessionUpdate === "tool_call_update") {
      const call = tools.get(u.toolCallId);
      if (!call) {
        items.push({ kind: "orphan", update: u });
        continue;
      }
      if (u.status != null) {
        call.status = u.status;
        call.statuses.push(u.status);
      }
      for (const [field, key] of [["title", "title"], ["kind", "toolKind"], ["content", "content"], ["rawInput", "rawInput"], ["rawOutput", "rawOutput"], ["locations", "locations"]]) {
        if (u[field] != null) call[key] = u[field];
      }
    } else {
      items.push({ kind: "other", update: u });
    }
  }
  return items;
}

/**
 * An outline in the terms a replay must reproduce: messages by kind and text, tool calls by
 * id, title, kind, final status and content text. Other updates (session info, usage...) are
 * left out; Turn.checkShape already fails on orphan tool_call_updates.
 */
export function comparable(items) {
  return items
    .filter((i) => i.kind !== "other" && i.kind !== "orphan")
    .map((i) =>
      i.kind === "tool"
        ? { kind: "tool", toolCallId: i.toolCallId, title: i.title, toolKind: i.toolKind, status: i.status, text: contentText(i.content) }
        : { kind: i.kind, text: i.text },
    );
}

// ---------- raw stdio (for malformed input only) ----------


/** A `turnlog acp` process spoken to with raw lines, no SDK. */
export function rawAgent(lab, args) {
  const child = lab.spawn(args);
  const lines = stdoutLines(child);
  return {
    child,
    lines,
    send(text) {
      child.stdin.write(text.endsWith("\n") ? text : `${text}\n`);
    },
    /** Waits for a stdout line (after index `from`) whose JSON matches `pred`. */
    async waitForLine(pred, { from = 0, ms = 10_000, what = "a line" } = {}) {
      return waitFor(
        () => {
          for (const line of lines.slice(from)) {
            try {
              const msg = JSON.parse(line);
              if (pred(msg)) return { msg, line };
            } catch {
              // checked separately: every line must parse
            }
          }
          return undefined;
        },
        ms,
        () => `${what}; stdout so far: ${show(lines)}; stderr: ${child.stderrText.slice(-2_000)}`,
      );
    },
  };
}

// ---------- the server's own views (bridge mode) ----------

/**
 * Opens `GET url` as server-sent events and collects its frames as they come:
 * `{id, event, data (parsed JSON), at}`. Closed by the lab's cleanup.
 */
export async function observeEvents(lab, url, headers = {}) {
  const abort = new AbortController();
  lab.onCleanup(() => abort.abort());
  const res = await deadline(fetch(url, { headers: { accept: "text/event-stream", ...headers }, signal: abort.signal }), 10_000, `GET ${url}`);
  if (res.status !== 200) assert.fail(`GET ${url}: ${res.status} ${await res.text()}`);
  assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/, `GET ${url}: content-type`);
  const observer = { frames: [], bad: [], error: undefined, ended: false, close: () => abort.abort() };
  (async () => {
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for await (const chunk of res.body) {
        buffer += decoder.decode(chunk, { stream: true }).replace(/\r\n/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = parseFrame(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          if (frame?.bad) observer.bad.push(frame);
          else if (frame) observer.frames.push({ ...frame, at: performance.now() });
        }
      }
      observer.ended = true;
    } catch (error) {
      if (!abort.signal.aborted) observer.error = error;
    }
  })();
  return observer;
}

/** One SSE frame: `id:`, `event:` and `data:` lines; comments (`: ping`) alone give null. */
function parseFrame(block) {
  const frame = { data: [] };
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "data") frame.data.push(value);
    else frame[field] = value;
  }
  if (frame.data.length === 0) return null;
  const raw = frame.data.join("\n");
  try {
    return { id: frame.id, event: frame.event, data: JSON.parse(raw) };
  } catch {
    return { bad: true, raw, id: frame.id };
  }
}

/** `GET url` as JSON (asserting 200). */
export async function getJson(url, headers = {}) {
  const res = await deadline(fetch(url, { headers: { accept: "application/json", ...headers } }), 10_000, `GET ${url}`);
  const body = await res.text();
  assert.equal(res.status, 200, `GET ${url}: ${res.status} ${body}`);
  return JSON.parse(body);
}

/** The text of an AAP history message's content (a string, or text blocks). */
export function messageText(message) {
  const c = message?.content;
  if (typeof c === "string") return c;
  return (c ?? []).filter((b) => b.type === "text").map((b) => b.text).join("");
}

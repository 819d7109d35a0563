// Helpers for the console's browser tests: start and restart `turnlog serve`, call its API
// with fetch, drive the system Chromium with playwright-core, and wait on conditions (never
// on a fixed sleep) with failures that say what did not happen and what the page showed.
//
// The page's DOM is used only through what the console contract names (ids, classes, data
// attributes and their states): see "The console contract" in README.md here. A change to
// the console that breaks one of those names breaks these tests; change both together.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { stdoutLines } from "../common/lines.mjs";

export const REPO = fileURLToPath(new URL("../../", import.meta.url));
export const BIN = process.env.TURNLOG_BIN ? path.resolve(process.env.TURNLOG_BIN) : path.join(REPO, "target/debug/turnlog");
/** Each test's screenshots and logs go to OUT_ROOT/<test name>/. */
export const OUT_ROOT = path.join(REPO, "target/console-tests");
export const TEST = { timeout: 120_000 };

const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

// ---------- small utilities ----------

/** Compact JSON for assertion messages, cut so a failure stays readable. */
export function show(value, max = 3_000) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text === undefined ? String(value) : text.length > max ? `${text.slice(0, max)}…(${text.length} chars)` : text;
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The scripted model's `/words n` reply: `w1 w2 ... wn`. */
export function words(n) {
  return Array.from({ length: n }, (_, i) => `w${i + 1}`).join(" ");
}

/** A fresh API key that is easy to find in a URL or a log. */
export function newKey(subject) {
  return `console-test-${subject}-${randomBytes(16).toString("hex")}`;
}

/**
 * Polls `check` (sync or async) every `interval` ms until it returns a truthy value, which it
 * returns. After `timeout` ms it fails with `what` (what did not happen) and, if given, the
 * result of `state()` (what there was instead).
 */
export async function until(check, { what, timeout = 10_000, interval = 50, state } = {}) {
  const deadline = performance.now() + timeout;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (performance.now() > deadline) {
      let seen = "";
      if (state) {
        try {
          seen = `; ${await state()}`;
        } catch (error) {
          seen = `; (could not describe the state: ${error.message})`;
        }
      }
      assert.fail(`${what}: did not happen within ${timeout} ms${seen}`);
    }
    await sleep(interval);
  }
}

function slug(name) {
  const head = name.split(":")[0];
  return head.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 60) || "test";
}

// ---------- the browser (one per test file; a fresh context per page) ----------

let browserPromise;

export function browser() {
  browserPromise ??= chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: CHROMIUM_ARGS,
  });
  return browserPromise;
}

/** For the test file's `after`. */
export async function closeBrowser() {
  if (!browserPromise) return;
  const b = await browserPromise.catch(() => undefined);
  browserPromise = undefined;
  await b?.close();
}

// ---------- one test's resources ----------

/** Every server still running, killed if the test process exits without cleaning up. */
const live = new Set();
process.on("exit", () => {
  for (const child of live) child.kill("SIGKILL");
});

/**
 * One test's resources: its output dir (target/console-tests/<name>/, emptied first), a temp
 * dir for data and config, its servers and browser contexts. `cleanup` runs after the test,
 * passed or failed: a last screenshot of every page, contexts closed, servers stopped (SIGTERM).
 */
export class Lab {
  constructor(t) {
    this.t = t;
    this.out = path.join(OUT_ROOT, slug(t.name));
    fs.rmSync(this.out, { recursive: true, force: true });
    fs.mkdirSync(this.out, { recursive: true });
    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), "turnlog-console-"));
    this.servers = [];
    this.views = [];
    this.shots = 0;
    t.after(() => this.cleanup());
  }

  note(message) {
    this.t.diagnostic(message);
  }

  /** A config file (TOML text) in the temp dir; returns its path. */
  writeConfig(text) {
    const file = path.join(this.tmp, "config.toml");
    fs.writeFileSync(file, text);
    return file;
  }

  /** A config file with one `[[auth.keys]]` block per `{subject: key}`; returns its path. */
  writeKeys(keys) {
    const blocks = Object.entries(keys).map(([subject, key]) => {
      const sha256 = createHash("sha256").update(key).digest("hex");
      return `[[auth.keys]]\nsubject = "${subject}"\nsha256 = "${sha256}"\nadmin = false\n`;
    });
    return this.writeConfig(blocks.join("\n"));
  }

  /** Starts `turnlog serve` on a fresh data dir (and `config` if given). */
  async startServer({ config } = {}) {
    const server = new Server(this, { dataDir: path.join(this.tmp, "data"), config });
    this.servers.push(server);
    await server.start();
    return server;
  }

  /**
   * A page in a fresh browser context, with what the tests check kept on the side: every
   * request (`requests`), every response (`responses`), and the session-list streams that
   * are open (`listStreams`). Console messages, page errors and failed requests go to
   * browser-N.log in the output dir.
   */
  async newPage() {
    const b = await browser();
    const context = await b.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    const view = { context, page, requests: [], responses: [], listStreams: new Set(), log: path.join(this.out, `browser-${this.views.length + 1}.log`) };
    this.views.push(view);
    const log = (line) => fs.appendFileSync(view.log, `${new Date().toISOString()} ${line}\n`);
    context.on("request", (request) => view.requests.push(request));
    context.on("response", (response) => {
      view.responses.push({ url: response.url(), status: response.status(), method: response.request().method() });
      if (new URL(response.url()).pathname === "/console/api/sessions/stream" && response.status() === 200) {
        view.listStreams.add(response.request());
      }
    });
    const closed = (request) => view.listStreams.delete(request);
    context.on("requestfinished", closed);
    context.on("requestfailed", (request) => {
      closed(request);
      log(`request failed: ${request.method()} ${request.url()}: ${request.failure()?.errorText}`);
    });
    page.on("console", (msg) => log(`console.${msg.type()}: ${msg.text()}`));
    page.on("pageerror", (error) => log(`page error: ${error.stack ?? error.message}`));
    return view;
  }

  /** Saves a full-page screenshot as NN-label.png in the output dir. */
  async screenshot(page, label) {
    this.shots += 1;
    const file = path.join(this.out, `${String(this.shots).padStart(2, "0")}-${label}.png`);
    await page.screenshot({ path: file, fullPage: true });
    return file;
  }

  async cleanup() {
    for (const view of this.views) {
      try {
        if (!view.page.isClosed()) await this.screenshot(view.page, "final");
      } catch {
        // best effort: the test already has its verdict
      }
      await view.context.close().catch(() => {});
    }
    for (const server of this.servers) await server.stop();
    if (!process.env.TURNLOG_TEST_KEEP) fs.rmSync(this.tmp, { recursive: true, force: true });
  }
}

// ---------- the server ----------

/**
 * `turnlog serve` on a data dir. Its stderr goes to server.log in the test's output dir (one
 * file across restarts, each start under a header line).
 */
export class Server {
  constructor(lab, { dataDir, config }) {
    this.lab = lab;
    this.dataDir = dataDir;
    this.config = config;
    this.logPath = path.join(lab.out, "server.log");
    this.child = undefined;
    this.url = undefined;
    this.port = undefined;
    this.starts = 0;
  }

  /**
   * Starts the server; with `port` (a restart), binds that port again, retrying for
   * `retryFor` ms while the bind fails (the port may be briefly busy).
   */
  async start({ port = 0, retryFor = 10_000 } = {}) {
    assert.ok(!this.running(), "the server is already running");
    const deadline = performance.now() + (port ? retryFor : 0);
    for (;;) {
      const failure = await this.tryStart(port);
      if (!failure) return this;
      if (performance.now() > deadline) assert.fail(failure);
      await sleep(250); // a retry of the bind, not a wait for a condition
    }
  }

  /** One start; undefined once it listens, or why it did not. */
  async tryStart(port) {
    this.starts += 1;
    const args = ["serve", "--addr", `127.0.0.1:${port}`, "--data-dir", this.dataDir];
    if (this.config) args.push("--config", this.config);
    fs.appendFileSync(this.logPath, `\n===== start ${this.starts}: ${BIN} ${args.join(" ")} =====\n`);
    // No TURNLOG_* settings from the caller's shell: the test says what it wants.
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TURNLOG_")));
    const stderr = fs.openSync(this.logPath, "a");
    let child;
    try {
      child = spawn(BIN, args, { stdio: ["ignore", "pipe", stderr], env, cwd: this.lab.tmp });
    } finally {
      fs.closeSync(stderr);
    }
    live.add(child);
    child.exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => {
        live.delete(child);
        resolve({ code, signal });
      });
      child.once("error", (error) => {
        live.delete(child);
        resolve({ code: null, signal: null, error });
      });
    });
    const lines = stdoutLines(child);

    let exit;
    child.exited.then((e) => {
      exit = e;
    });
    const printed = await until(() => lines.length > 0 || exit, { what: "turnlog serve to print its address", timeout: 20_000 }).then(
      () => lines.length > 0,
      () => false,
    );
    if (!printed) {
      if (!exit) child.kill("SIGKILL");
      const gone = await child.exited;
      if (gone.error?.code === "ENOENT") assert.fail(`${BIN} does not exist: build it first (cargo build) or set TURNLOG_BIN`);
      const why = exit ? `it exited (${show(gone)}) before listening` : "it printed nothing within 20 s";
      return `turnlog serve on port ${port || "any"}: ${why}; its log: ${show(this.log().slice(-2_000))}`;
    }
    const found = /^listening on (http:\/\/127\.0\.0\.1:(\d+))$/.exec(lines[0]);
    assert.ok(found, `turnlog serve's first stdout line: ${show(lines[0])}`);
    if (port) assert.equal(Number(found[2]), port, "the restarted server must listen on the same port");
    this.child = child;
    this.url = found[1];
    this.port = Number(found[2]);
    this.lab.note(`server start ${this.starts}: ${this.url}`);
    return undefined;
  }

  running() {
    return Boolean(this.child && this.child.exitCode === null && this.child.signalCode === null);
  }

  /** Everything the server wrote to stderr, all starts. */
  log() {
    return fs.existsSync(this.logPath) ? fs.readFileSync(this.logPath, "utf8") : "";
  }

  /** SIGKILL: no shutdown, a turn in progress is left as it was. */
  async kill() {
    assert.ok(this.running(), "the server is not running");
    this.child.kill("SIGKILL");
    await this.child.exited;
  }

  /** SIGTERM, then SIGKILL if it has not exited within 10 s. */
  async stop() {
    if (!this.running()) return;
    const child = this.child;
    child.kill("SIGTERM");
    const exited = await Promise.race([child.exited.then(() => true), sleep(10_000).then(() => false)]);
    if (!exited) {
      fs.appendFileSync(this.logPath, "\n===== no exit within 10 s of SIGTERM: SIGKILL =====\n");
      child.kill("SIGKILL");
      await child.exited;
    }
  }
}

// ---------- the API, with fetch ----------

/** The server's API as one caller: `key` (Bearer) or none (no keys configured: admin `local`). */
export class Api {
  constructor(server, key) {
    this.server = server;
    this.key = key;
  }

  /** `{status, body}` (body parsed as JSON when it is JSON). */
  async call(method, urlPath, body) {
    const headers = { accept: "application/json" };
    if (this.key) headers.authorization = `Bearer ${this.key}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    const res = await fetch(`${this.server.url}${urlPath}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(15_000),
    });
    const text = await res.text();
    let parsed = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // not JSON: keep the text
    }
    return { status: res.status, body: parsed };
  }

  /** `call`, asserting the status. */
  async ok(method, urlPath, body, status = 200) {
    const res = await this.call(method, urlPath, body);
    assert.equal(res.status, status, `${method} ${urlPath}: ${res.status} ${show(res.body)}`);
    return res.body;
  }

  /**
   * A new session of the default agent; its id. `tools` enables server tools for it:
   * `[{name, trust}]` (none if omitted).
   */
  async createSession({ tools } = {}) {
    const body = await this.ok("POST", "/sessions", { agent: { name: "default", tools } }, 201);
    assert.match(body?.sessionId ?? "", /^sess_/, `POST /sessions: ${show(body)}`);
    return body.sessionId;
  }

  /** Posts a user message (starts a turn). */
  postMessage(sessionId, text) {
    return this.ok("POST", `/sessions/${sessionId}/events`, { events: [{ type: "user.message", content: text }] });
  }

  /** The whole log, every page, oldest first. */
  async events(sessionId) {
    const all = [];
    let after;
    for (;;) {
      const query = `limit=1000&order=asc${after ? `&after_id=${after}` : ""}`;
      const page = await this.ok("GET", `/sessions/${sessionId}/events?${query}`);
      all.push(...page.data);
      if (!page.has_more) return all;
      assert.ok(page.last_id && page.last_id !== after, `the events page has has_more but no new last_id: ${show(page)}`);
      after = page.last_id;
    }
  }

  /** Polls the log until `done(events)` is truthy; returns the events. */
  async waitForLog(sessionId, done, what, timeout = 30_000) {
    let events = [];
    await until(
      async () => {
        events = await this.events(sessionId);
        return done(events);
      },
      { what, timeout, interval: 100, state: () => `the log's types: ${show(events.map((e) => e.type))}` },
    );
    return events;
  }

  /** Waits until the log holds `n` `session.status_idle` events (n turns done). */
  waitForIdle(sessionId, n, timeout = 30_000) {
    return this.waitForLog(sessionId, (events) => count(events, "session.status_idle") >= n, `${n} session.status_idle in ${sessionId}'s log`, timeout);
  }
}

export function count(events, type) {
  return events.filter((e) => e.type === type).length;
}

/** The text of a user.message or agent.message event. */
export function eventText(event) {
  const c = event?.content;
  if (typeof c === "string") return c;
  return (c ?? []).filter((b) => b.type === "text").map((b) => b.text).join("");
}

// ---------- the page ----------

/** What the page shows, for failure messages. */
export async function pageState(page) {
  try {
    return await page.evaluate(() => {
      const attr = (sel, name) => document.querySelector(sel)?.getAttribute(name) ?? "(none)";
      const rows = [...document.querySelectorAll("#events tbody tr[data-seq]")];
      const box = document.getElementById("events-box")?.dataset ?? {};
      const sessions = [...document.querySelectorAll("#sessions [data-session-id]")].map((r) => `${r.dataset.sessionId}:${r.dataset.status}`);
      const text = (document.body?.innerText ?? "").replace(/\s+/g, " ").trim();
      return [
        `page ${location.href}`,
        `#conn ${attr("#conn", "data-state")}`,
        `#session mode ${attr("#session", "data-mode")}`,
        `#events ${box.count} events, ${box.shown} shown, ${rows.length} rows drawn (${rows.slice(-5).map((r) => `${r.dataset.seq}:${r.dataset.type}`).join(", ")})`,
        `#sessions rows [${sessions.join(", ")}]`,
        `text: ${text.length > 800 ? `${text.slice(0, 800)}…` : text}`,
      ].join("; ");
    });
  } catch (error) {
    return `(page state unavailable: ${error.message})`;
  }
}

/**
 * Waits until `selector` matches an element in `state` ("attached", "visible", "hidden",
 * "detached"); fails naming `what` and what the page showed.
 */
export async function waitFor(page, selector, what, { state = "attached", timeout = 10_000 } = {}) {
  try {
    return await page.waitForSelector(selector, { state, timeout });
  } catch (error) {
    if (error.name !== "TimeoutError") throw error;
    assert.fail(`${what} (${selector} ${state}): did not happen within ${timeout} ms; ${await pageState(page)}`);
  }
}

/**
 * Evaluates `fn(arg)` in the page every `polling` ms until it returns a truthy value, which it
 * returns (as JSON); fails naming `what` and what the page showed.
 */
export async function waitInPage(page, fn, arg, what, { timeout = 10_000, polling = 50 } = {}) {
  try {
    const handle = await page.waitForFunction(fn, arg, { timeout, polling });
    return await handle.jsonValue();
  } catch (error) {
    if (error.name !== "TimeoutError") throw error;
    assert.fail(`${what}: did not happen within ${timeout} ms; ${await pageState(page)}`);
  }
}

/** Waits until some element matching `selector` shows `text` (whitespace collapsed). */
export function waitForText(page, selector, text, what, options) {
  return waitInPage(
    page,
    ({ selector, text }) =>
      [...document.querySelectorAll(selector)].some((el) => el.textContent.replace(/\s+/g, " ").trim() === text),
    { selector, text },
    `${what}: ${selector} with the text ${JSON.stringify(text)}`,
    options,
  );
}

/** The texts (whitespace collapsed) of the elements matching `selector`. */
export function texts(page, selector) {
  return page.$$eval(selector, (els) => els.map((el) => el.textContent.replace(/\s+/g, " ").trim()));
}

/**
 * Every row of `#events` as `{id, seq, type, shown}`: the table is windowed (only the rows
 * in view are in the page), so it is scrolled from top to bottom, a view at a time, and
 * scrolled back. Only the rows the type filter lets through are drawn (`shown` is true).
 */
export function eventRows(page) {
  return page.evaluate(async () => {
    const box = document.getElementById("events-box");
    const frame = () => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
    const seen = new Map();
    const back = box.scrollTop;
    box.scrollTop = 0;
    for (;;) {
      await frame();
      // Each view's rows must run in order, an event once; across views, a number is always the same event.
      let previous = 0;
      for (const tr of box.querySelectorAll("tbody tr[data-seq]")) {
        const row = { id: tr.dataset.eventId, seq: Number(tr.dataset.seq), type: tr.dataset.type, shown: !tr.hidden && getComputedStyle(tr).display !== "none" };
        const known = seen.get(row.seq);
        if (row.seq <= previous || (known && known.id !== row.id)) row.wrong = `row ${row.seq} (${row.id}) after ${previous}${known ? `, earlier ${known.id}` : ""}`;
        previous = row.seq;
        seen.set(row.seq, known?.wrong ? known : row);
      }
      if (box.scrollTop + box.clientHeight >= box.scrollHeight - 1) break;
      box.scrollTop += Math.max(box.clientHeight - 48, 24);
    }
    box.scrollTop = back;
    return [...seen.values()].sort((a, b) => a.seq - b.seq);
  });
}

/** The rows of `#events` that are shown (neither removed nor hidden). */
export async function shownRows(page) {
  return (await eventRows(page)).filter((r) => r.shown);
}

/** Waits until the table holds the log's event `id` (drawn or not: the table is windowed). */
export function waitForRow(page, id, what, options) {
  return waitFor(page, `#events-box[data-last-id="${id}"]`, what, options);
}

/** The session list's rows, top to bottom: `{id, status}`. */
export function sessionRows(page) {
  return page.$$eval("#sessions [data-session-id][data-status]", (els) => els.map((el) => ({ id: el.dataset.sessionId, status: el.dataset.status })));
}

/** The selector of a session's row in the list (with a status if given). */
export function rowSelector(sessionId, status) {
  return `#sessions [data-session-id="${sessionId}"]${status ? `[data-status="${status}"]` : "[data-status]"}`;
}

/** A session view opened straight from its URL, its stream live. */
export async function openSession(page, server, sessionId) {
  await page.goto(`${server.url}/console#/sessions/${sessionId}`);
  await waitFor(page, `#session[data-session-id="${sessionId}"]`, `the view of ${sessionId}`);
  await waitFor(page, "#conn[data-state=live]", "the session's stream to be live", { timeout: 15_000 });
}

/**
 * The rendered `#events` rows are the log: the same ids in the same order, none twice, none
 * missing, `data-seq` 1..N and `data-type` the event's type. Waits for the log's last event
 * first.
 */
export async function assertRowsMatchLog(page, log) {
  await waitForRow(page, log.at(-1).id, "the log's last event rendered", { timeout: 15_000 });
  const rows = await eventRows(page);
  assert.deepEqual(rows.filter((r) => r.wrong).map((r) => r.wrong), [], "rows drawn out of order, or twice");
  const ids = rows.map((r) => r.id);
  const logIds = log.map((e) => e.id);
  const twice = ids.filter((id, i) => ids.indexOf(id) !== i);
  const missing = logIds.filter((id) => !ids.includes(id));
  const extra = ids.filter((id) => !logIds.includes(id));
  assert.deepEqual(twice, [], "events rendered more than once");
  assert.deepEqual(ids, logIds, `the rendered event ids are the log's (missing ${show(missing)}, not in the log ${show(extra)})`);
  assert.deepEqual(
    rows.map((r) => r.seq),
    log.map((_, i) => i + 1),
    "data-seq runs 1..N",
  );
  assert.deepEqual(
    rows.map((r) => r.type),
    log.map((e) => e.type),
    "data-type is each event's type",
  );
}

/** Goes to a route of the console already open (`#/`, `#/sessions/<id>`) without reloading. */
export function route(page, hash) {
  return page.evaluate((h) => {
    location.hash = h;
  }, hash);
}

/** Waits until the page has a session-list stream (EventSource) open, answered 200. */
export function waitForListStream(view) {
  return until(() => view.listStreams.size > 0, {
    what: "the page to open GET /console/api/sessions/stream",
    state: () => pageState(view.page),
  });
}

/** Logs in through `#login` with `key`. */
export async function login(page, key) {
  await waitFor(page, "#login", "the login form", { state: "visible" });
  await page.fill("#key", key);
  await page.click("#login-submit");
}

/** `fetch` from the page (same origin: the browser sends the console cookie). */
export function pageFetch(page, urlPath, { method = "GET", headers = {}, body } = {}) {
  return page.evaluate(
    async ({ urlPath, method, headers, body }) => {
      const res = await fetch(urlPath, { method, headers, body });
      return { status: res.status, body: await res.text() };
    },
    { urlPath, method, headers, body },
  );
}

/** Every delta a log event of its own (the default merges a model's tokens 25 ms at a time). */
export const EVERY_DELTA = "[engine]\ndelta_coalesce_ms = 0\n";

/** Runs whole turns through the turn API (each answered once it ended) until the log holds at least `n` events. */
export async function fillSession(api, id, n) {
  for (let i = 1; ; i += 1) {
    let text = "/words 40";
    if (i % 5 === 0) text = `/tool calculator {"expression": "${i}*2"}`;
    else if (i % 7 === 0) text = `/think step ${i}\n/words 30`;
    const turn = await api.call("POST", `/sessions/${id}/turns`, { stream: "none", messages: [{ role: "user", content: text }] });
    assert.equal(turn.status, 200, `turn ${i}: ${show(turn.body)}`);
    if (i % 25 === 0) {
      const last = await api.ok("GET", `/sessions/${id}/events?limit=1&order=desc`);
      if (last.data[0].sequence_number >= n) return i;
    }
  }
}

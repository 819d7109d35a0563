// The observer console (`/console`) end to end: a `turnlog serve` of each test's own (fresh
// data dir), the system Chromium driven by playwright-core, and the server's API called with
// fetch to make things happen while the page watches. The page is used only through the DOM
// the console contract names (ids, classes, data attributes).
//
// The default agent's scripted model answers deterministically: `hi` -> `echo: hi`;
// `/words N` -> `w1 w2 ... wN`; a line `/delay MS` waits that long before each word.
//
// Each test writes screenshots, the server's log and the browser's console log to
// target/console-tests/<test>/.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import {
  Api,
  Lab,
  TEST,
  assertRowsMatchLog,
  closeBrowser,
  eventRows,
  eventText,
  login,
  newKey,
  openSession,
  pageFetch,
  pageState,
  rowSelector,
  route,
  sessionRows,
  show,
  shownRows,
  texts,
  until,
  waitFor,
  waitForListStream,
  waitForText,
  waitInPage,
  words,
} from "./helpers.mjs";

after(closeBrowser);

test("live: a session view streams a turn as it happens, the page sends a message, and the list follows new sessions and status changes without a reload", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);

  // The binary serves the console itself.
  const index = await fetch(`${server.url}/console`);
  await index.text();
  assert.equal(index.status, 200, "GET /console");
  assert.match(index.headers.get("content-type") ?? "", /^text\/html/, "GET /console: content-type");

  const view = await lab.newPage();
  const { page } = view;
  const a = await api.createSession();
  await openSession(page, server, a);
  assert.equal(await page.isVisible("#login"), false, "no keys are configured: no login form");

  // A slow turn posted through the API: the reply grows in a `.msg.agent.streaming`, sampled
  // every 10 ms in the page; its length must rise at least twice.
  const growth = waitInPage(
    page,
    () => {
      const seen = (window.__streamingLengths ??= []);
      const el = document.querySelector("#conversation .msg.agent.streaming");
      if (el && seen.at(-1) !== el.textContent.length) seen.push(el.textContent.length);
      const rises = seen.filter((n, i) => i > 0 && n > seen[i - 1]).length;
      return rises >= 2 ? seen : false;
    },
    null,
    "a .msg.agent.streaming whose text grows at least twice",
    { timeout: 15_000, polling: 10 },
  );
  growth.catch(() => {}); // awaited below; this keeps an early failure from going unhandled
  await api.postMessage(a, "/delay 30\n/words 30");
  const lengths = await growth;
  lab.note(`streaming text lengths seen: ${lengths.join(", ")}`);
  await lab.screenshot(page, "streaming");

  const reply = words(30);
  await waitForText(page, "#conversation .msg.agent:not(.streaming)", reply, "the final agent message", { timeout: 15_000 });
  assert.deepEqual(await texts(page, "#conversation .msg.agent"), [reply], "one agent message: the final text replaced the streaming one");
  assert.equal(await page.locator("#conversation .msg.agent.streaming").count(), 0, "nothing is left streaming");
  await waitFor(page, "#conversation .stop[data-stop=end_turn]", "the turn's stop reason (end_turn)");
  await waitFor(page, "#conversation .usage", "the turn's usage");
  await assertRowsMatchLog(page, await api.waitForIdle(a, 1));
  await lab.screenshot(page, "turn-done");

  // A message sent from the page.
  await page.fill("#message", "hello from the page");
  await page.click("#send");
  await waitForText(page, "#conversation .msg.user", "hello from the page", "the page's own message in the conversation");
  await waitForText(page, "#conversation .msg.agent", "echo: hello from the page", "the reply to the page's message", { timeout: 15_000 });
  const log = await api.waitForIdle(a, 2);
  assert.deepEqual(
    log.filter((e) => e.type === "user.message").map(eventText),
    ["/delay 30\n/words 30", "hello from the page"],
    "the page posted its message as a user.message",
  );
  const composeError = await page.$eval("#compose-error", (el) => el.textContent.trim()).catch(() => "");
  assert.equal(composeError, "", "#compose-error after a successful send");
  await assertRowsMatchLog(page, log);
  await lab.screenshot(page, "sent-from-page");

  // The list: the session's row, then a session created while the list is open, and its
  // status as a turn runs; all without a reload (a marker set in the page survives).
  await route(page, "#/");
  await waitFor(page, rowSelector(a, "idle"), "the session's row (idle) in the list", { state: "visible" });
  await waitFor(page, `${rowSelector(a)} a[href$="#/sessions/${a}"]`, "a link from the row to the session's view");
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await waitForListStream(view);
  const b = await api.createSession();
  await waitFor(page, rowSelector(b), "a session created while the list is open to appear", { state: "visible" });
  assert.equal((await sessionRows(page))[0]?.id, b, "the new session is inserted at the top");
  await api.postMessage(b, "/delay 100\n/words 20");
  await waitFor(page, rowSelector(b, "running"), "the new session's row to turn running");
  await lab.screenshot(page, "list-running");
  await waitFor(page, rowSelector(b, "idle"), "the new session's row to turn idle after its turn", { timeout: 20_000 });
  assert.equal(await page.evaluate(() => window.__sameDocument === true), true, "the list followed without reloading the page");
  assert.deepEqual(
    (await sessionRows(page)).map((r) => r.id),
    [b, a],
    "the list: the new session above the first",
  );
  await lab.screenshot(page, "list");

  // A session deleted while it is watched: its log ends with `terminated`, and the view
  // ends there (the state `ended`), and its row leaves the list.
  await route(page, `#/sessions/${b}`);
  await waitFor(page, "#conn[data-state=live]", "the second session's view to be live");
  const deleted = await api.call("DELETE", `/sessions/${b}`);
  assert.equal(deleted.status, 204, `DELETE: ${show(deleted.body)}`);
  await waitFor(page, "#conn[data-state=ended]", "the view to end at `terminated`");
  const last = (await eventRows(page)).at(-1);
  assert.equal(last.type, "terminated", "the last event drawn is `terminated`");
  await lab.screenshot(page, "ended");
  await route(page, "#/");
  await waitFor(page, rowSelector(a), "the first session's row", { state: "visible" });
  assert.deepEqual((await sessionRows(page)).map((r) => r.id), [a], "the deleted session is not listed");

  // A session made from the list: the form lists the agents (`GET /meta`), makes a session
  // of the one chosen and opens it, and the page talks to it.
  await waitFor(page, '#new-agent option[value="default"]', "the default agent in the new session form");
  await page.selectOption("#new-agent", "default");
  await page.click("#new-submit");
  let made = "";
  await until(
    async () => {
      made = /^#\/sessions\/(sess_\w+)$/.exec(await page.evaluate(() => location.hash))?.[1] ?? "";
      return made;
    },
    { what: "the new session's view to open" },
  );
  await waitFor(page, "#conn[data-state=live]", "the new session's stream to be live", { timeout: 15_000 });
  await page.fill("#message", "hi");
  await page.click("#send");
  await waitForText(page, "#conversation .msg.agent", "echo: hi", "the reply in the new session", { timeout: 15_000 });
  const madeLog = await api.waitForIdle(made, 1);
  assert.equal(madeLog[0].agent?.name, "default", "the new session is of the agent chosen");
  assert.equal(await page.$eval("#new-error", (el) => el.textContent.trim()), "", "#new-error after a session was made");

  // Nothing came from anywhere but the server.
  const foreign = view.requests.map((r) => r.url()).filter((u) => !u.startsWith(`${server.url}/`) && !/^(data|blob):/.test(u));
  assert.deepEqual(foreign, [], "requests to other origins");
});

test("restart: the session view survives a SIGKILL and restart of the server; every event of the log is rendered exactly once, in order", { timeout: 180_000 }, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession();
  const { page } = await lab.newPage();
  await openSession(page, server, id);

  // A 4-second turn; kill the server once a few deltas are on the page.
  await api.postMessage(id, "/delay 100\n/words 40");
  await until(async () => (await eventRows(page)).filter((r) => r.type === "agent.message.delta").length >= 3, {
    what: "3 agent.message.delta rows in #events",
    timeout: 15_000,
  });
  await lab.screenshot(page, "before-kill");
  await server.kill();
  await waitFor(page, "#conn[data-state=reconnecting]", "#conn to show the lost connection", { timeout: 15_000 });
  await lab.screenshot(page, "reconnecting");

  // Same port, same data dir: the page's own reconnection finds it.
  await server.start({ port: server.port });
  await waitFor(page, "#conn[data-state=live]", "the page to reconnect to the restarted server", { timeout: 30_000 });
  await until(
    async () => {
      const types = (await eventRows(page)).map((r) => r.type);
      const resumed = types.lastIndexOf("turn.resumed");
      return resumed >= 0 && types.indexOf("session.status_idle", resumed) > resumed;
    },
    { what: "a session.status_idle row after the turn.resumed", timeout: 20_000 },
  );
  await lab.screenshot(page, "resumed");

  // A new turn after the restart streams in as usual.
  await api.postMessage(id, "after restart");
  await waitForText(page, "#conversation .msg.agent", "echo: after restart", "the reply after the restart", { timeout: 15_000 });
  const log = await api.waitForLog(
    id,
    (events) => {
      const asked = events.findLastIndex((e) => e.type === "user.message" && eventText(e) === "after restart");
      return asked >= 0 && events.slice(asked).some((e) => e.type === "session.status_idle");
    },
    "the turn after the restart to end in the log",
  );
  const types = log.map((e) => e.type);
  assert.equal(types.filter((type) => type === "turn.resumed").length, 1, `one resume: ${show(types)}`);
  assert.ok(!types.includes("session.error"), `the cut turn went on, nothing closed it: ${show(types)}`);
  await assertRowsMatchLog(page, log);
  await lab.screenshot(page, "after-restart");
});

/** How long a replay of `log` takes at speed 1: the created_at gaps, each cut to 2 s. */
function replayDuration(log) {
  let ms = 0;
  for (let i = 1; i < log.length; i += 1) {
    const gap = Date.parse(log[i].created_at) - Date.parse(log[i - 1].created_at);
    assert.ok(Number.isFinite(gap), `created_at of ${show(log[i - 1])} and ${show(log[i])}`);
    ms += Math.min(Math.max(gap, 0), 2_000);
  }
  return ms;
}

/** Moves `#replay-scrub` to `k` as a user would (input and change events). */
async function scrub(page, k) {
  const value = await page.$eval(
    "#replay-scrub",
    (el, k) => {
      el.value = String(k);
      el.dispatchEvent(new Event("input", { bubbles: true }));
      el.dispatchEvent(new Event("change", { bubbles: true }));
      return el.value;
    },
    k,
  );
  assert.equal(value, String(k), `#replay-scrub took the value ${k}`);
}

/** Waits until the table holds exactly `k` events, all shown (those past the position are gone). */
function waitForShownRows(page, k, what) {
  return waitInPage(
    page,
    (k) => {
      const box = document.getElementById("events-box").dataset;
      return box.count === String(k) && box.shown === String(k);
    },
    k,
    `${what}: exactly ${k} rows shown in #events`,
  );
}

/** Waits until `#replay-position` reads `k / n`. */
function waitForPosition(page, k, n) {
  return waitInPage(
    page,
    ({ k, n }) => new RegExp(`^\\s*${k}\\s*/\\s*${n}\\s*$`).test(document.querySelector("#replay-position")?.textContent ?? ""),
    { k, n },
    `#replay-position to read "${k} / ${n}"`,
  );
}

test("replay: the scrub shows the session up to a position; playing at speed 10 takes the log's time / 10; exit returns to live", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession();
  await api.postMessage(id, "hello replay");
  await api.waitForIdle(id, 1);
  await api.postMessage(id, "/delay 100\n/words 10");
  const log = await api.waitForIdle(id, 2);
  const n = log.length;
  const expectedMs = replayDuration(log) / 10;
  lab.note(`${n} events; a replay at speed 10 should take about ${Math.round(expectedMs)} ms`);

  const { page } = await lab.newPage();
  await openSession(page, server, id);
  await assertRowsMatchLog(page, log);

  await page.click("#replay-start");
  await waitFor(page, "#session[data-mode=replay]", "replay mode");
  await waitInPage(page, (n) => Number(document.querySelector("#replay-scrub")?.max) === n, n, `#replay-scrub's max to be the number of events (${n})`);

  // Position 0: nothing.
  await scrub(page, 0);
  await waitForShownRows(page, 0, "scrubbed to 0");
  await waitForPosition(page, 0, n);
  await waitInPage(page, () => document.querySelectorAll("#conversation .msg").length === 0, null, "no message in #conversation at position 0");

  // The middle: exactly the first k events.
  const k = Math.floor(n / 2);
  await scrub(page, k);
  await waitForShownRows(page, k, `scrubbed to ${k}`);
  await waitForPosition(page, k, n);
  assert.deepEqual(
    (await shownRows(page)).map((r) => r.id),
    log.slice(0, k).map((e) => e.id),
    `the rows shown at position ${k} are the log's first ${k}`,
  );
  await lab.screenshot(page, "replay-middle");

  // Play from the start at speed 10.
  await scrub(page, 0);
  await waitForShownRows(page, 0, "scrubbed back to 0");
  assert.notEqual(await page.getAttribute("#replay", "data-done"), "true", "#replay is not done at position 0");
  await page.selectOption("#replay-speed", "10");
  const started = performance.now();
  await page.click("#replay-play");
  await waitFor(page, '#replay[data-done="true"]', "the replay to play to the end", { timeout: 3 * expectedMs + 30_000 });
  const elapsed = performance.now() - started;
  lab.note(`the replay took ${Math.round(elapsed)} ms (expected about ${Math.round(expectedMs)} ms)`);
  assert.ok(
    elapsed >= 0.3 * expectedMs && elapsed <= 3 * expectedMs + 1_500,
    `the replay at speed 10 took ${Math.round(elapsed)} ms; expected ${Math.round(expectedMs)} ms (between ${Math.round(0.3 * expectedMs)} and ${Math.round(3 * expectedMs + 1_500)})`,
  );
  await waitForShownRows(page, n, "played to the end");
  await waitForPosition(page, n, n);
  await waitForText(page, "#conversation .msg.agent", words(10), "the replayed second reply");
  await waitForText(page, "#conversation .msg.agent", "echo: hello replay", "the replayed first reply");
  await lab.screenshot(page, "replay-done");

  // Back to live.
  await page.click("#replay-exit");
  await waitFor(page, "#session[data-mode=live]", "live mode after #replay-exit");
  await waitFor(page, "#conn[data-state=live]", "the live stream after the replay", { timeout: 15_000 });
  await waitForShownRows(page, n, "back to live");
});

test("auth: login with a key, each caller sees only their sessions, an HttpOnly SameSite=Strict cookie that is not the key, the CSRF header, logout", TEST, async (t) => {
  const lab = new Lab(t);
  const keys = { alice: newKey("alice"), bob: newKey("bob") };
  const server = await lab.startServer({ config: lab.writeKeys(keys) });
  const alice = new Api(server, keys.alice);
  const bob = new Api(server, keys.bob);
  assert.equal((await new Api(server).call("GET", "/console/api/whoami")).status, 401, "whoami without a cookie");

  // Not logged in: the login form; a wrong key is refused with a message.
  const av = await lab.newPage();
  const { page } = av;
  await page.goto(`${server.url}/console`);
  await waitFor(page, "#login", "the login form", { state: "visible" });
  assert.equal((await pageFetch(page, "/console/api/whoami")).status, 401, "whoami from the page before login");
  await lab.screenshot(page, "login");
  await login(page, `wrong-${randomBytes(8).toString("hex")}`);
  await waitFor(page, "#login-error", "the error of a wrong key", { state: "visible" });
  await waitInPage(page, () => document.querySelector("#login-error")?.textContent.trim().length > 0, null, "#login-error to say why");
  assert.deepEqual(await av.context.cookies(), [], "a failed login sets no cookie");
  await lab.screenshot(page, "login-error");

  // Alice logs in.
  await login(page, keys.alice);
  await waitInPage(page, () => document.querySelector("#whoami")?.textContent.includes("alice"), null, "#whoami to show alice");
  await waitFor(page, "#login", "the login form to go away", { state: "hidden" });
  const whoami = await pageFetch(page, "/console/api/whoami");
  assert.equal(whoami.status, 200, `whoami after login: ${show(whoami)}`);
  assert.equal(JSON.parse(whoami.body).subject, "alice", `whoami after login: ${whoami.body}`);

  const cookies = await av.context.cookies();
  assert.ok(cookies.length > 0, "login sets a cookie");
  for (const c of cookies) {
    assert.equal(c.httpOnly, true, `cookie ${c.name} is HttpOnly: ${show(c)}`);
    assert.equal(c.sameSite, "Strict", `cookie ${c.name} is SameSite=Strict: ${show(c)}`);
    assert.ok(!c.value.includes(keys.alice), `cookie ${c.name} holds the key`);
  }
  const cookieNames = cookies.map((c) => c.name);
  assert.equal(await page.evaluate(() => document.cookie), "", "the page cannot read its cookie");
  const stored = await page.evaluate(() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)]));
  assert.ok(!stored.includes(keys.alice), "the page keeps the key in web storage");

  // Each caller's sessions; alice's list has only hers, also as sessions are created while it is open.
  const a1 = await alice.createSession();
  const b1 = await bob.createSession();
  await route(page, "#/");
  await page.reload();
  await waitFor(page, rowSelector(a1), "alice's session in her list", { state: "visible" });
  assert.deepEqual(
    (await sessionRows(page)).map((r) => r.id),
    [a1],
    "alice's list shows only her session",
  );
  await waitForListStream(av);
  const b2 = await bob.createSession();
  const a2 = await alice.createSession();
  await waitFor(page, rowSelector(a2), "alice's session created while her list is open", { state: "visible" });
  assert.deepEqual(
    (await sessionRows(page)).map((r) => r.id),
    [a2, a1],
    "bob's session created meanwhile does not reach alice's list",
  );
  await lab.screenshot(page, "alice-list");

  // A cookie-authenticated write needs the X-Turnlog-Console header.
  const post = (content, headers) =>
    pageFetch(page, `/sessions/${a1}/events`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ events: [{ type: "user.message", content }] }),
    });
  const refused = await post("without the console header", {});
  assert.ok(refused.status >= 400 && refused.status < 500, `a cookie write without X-Turnlog-Console is refused: ${show(refused)}`);
  const accepted = await post("with the console header", { "X-Turnlog-Console": "1" });
  assert.equal(accepted.status, 200, `a cookie write with X-Turnlog-Console: ${show(accepted)}`);
  const aliceLog = await alice.waitForIdle(a1, 1);
  assert.deepEqual(
    aliceLog.filter((e) => e.type === "user.message").map(eventText),
    ["with the console header"],
    "only the write with the header reached the log",
  );

  // Bob's session, opened by URL in alice's page: refused, none of its events shown.
  const bobLog = await bob.events(b1);
  const from = av.responses.length;
  await route(page, `#/sessions/${b1}`);
  await until(() => av.responses.slice(from).some((r) => r.url.includes(b1)), {
    what: "the page to ask the server for bob's session",
    state: () => pageState(page),
  });
  const answers = av.responses.slice(from).filter((r) => r.url.includes(b1));
  assert.ok(
    answers.every((r) => r.status >= 400 && r.status < 500),
    `the server refuses alice's requests for bob's session: ${show(answers)}`,
  );
  await waitInPage(
    page,
    () => {
      const fatal = document.getElementById("fatal");
      return !fatal.hidden && /^Session not found/.test(fatal.textContent);
    },
    null,
    "#fatal says bob's session is not found",
  );
  assert.equal(await page.locator("#conn").getAttribute("data-state"), "ended", "the view of bob's session ends");
  assert.equal(await page.getAttribute("#events-box", "data-count"), "0", "no event rows for bob's session");
  const html = await page.content();
  assert.deepEqual(
    bobLog.map((e) => e.id).filter((id) => html.includes(id)),
    [],
    "bob's events in alice's page",
  );
  await lab.screenshot(page, "bob-session-refused");

  // Bob, in a browser context of his own, sees only his sessions.
  const bv = await lab.newPage();
  await bv.page.goto(`${server.url}/console#/`);
  await login(bv.page, keys.bob);
  await waitInPage(bv.page, () => document.querySelector("#whoami")?.textContent.includes("bob"), null, "#whoami to show bob");
  await waitFor(bv.page, rowSelector(b1), "bob's first session in his list", { state: "visible" });
  await waitFor(bv.page, rowSelector(b2), "bob's second session in his list", { state: "visible" });
  assert.deepEqual(
    (await sessionRows(bv.page)).map((r) => r.id).sort(),
    [b1, b2].sort(),
    "bob's list shows only his sessions",
  );
  await lab.screenshot(bv.page, "bob-list");

  // Alice logs out: the login form, whoami 401, the cookie gone; bob is still logged in.
  await route(page, "#/");
  await page.click("#logout");
  await waitFor(page, "#login", "the login form after logout", { state: "visible" });
  assert.equal((await pageFetch(page, "/console/api/whoami")).status, 401, "whoami after logout");
  const left = (await av.context.cookies()).filter((c) => cookieNames.includes(c.name) && c.value !== "");
  assert.deepEqual(left, [], "logout clears the cookie");
  assert.equal((await pageFetch(bv.page, "/console/api/whoami")).status, 200, "bob's login is his own");
  await lab.screenshot(page, "logged-out");

  // The keys travelled only in the login requests' bodies; never in a URL, a header, or the log.
  const requests = [...av.requests, ...bv.requests];
  const logins = requests.filter((r) => new URL(r.url()).pathname === "/console/api/login");
  assert.ok(logins.length >= 3, `the page logged in through POST /console/api/login (wrong key, alice, bob): ${logins.length}`);
  for (const r of requests) {
    const url = r.url();
    const headers = JSON.stringify(r.headers());
    for (const [subject, key] of Object.entries(keys)) {
      assert.ok(!url.includes(key), `${subject}'s key in a request URL: ${url}`);
      assert.ok(!headers.includes(key), `${subject}'s key in the headers of ${r.method()} ${url}`);
      if (!logins.includes(r)) assert.ok(!(r.postData() ?? "").includes(key), `${subject}'s key in the body of ${r.method()} ${url}`);
    }
    // Every write the page itself sends carries the CSRF header (the probe above deliberately does not).
    const probe = (r.postData() ?? "").includes("without the console header");
    if (r.method() !== "GET" && r.method() !== "HEAD" && !probe) {
      assert.equal(r.headers()["x-turnlog-console"], "1", `X-Turnlog-Console on ${r.method()} ${url}`);
    }
  }
  const serverLog = server.log();
  for (const [subject, key] of Object.entries(keys)) assert.ok(!serverLog.includes(key), `${subject}'s key in the server's log`);
});

test("filter: with the status filter on running, a session's row appears while its turn runs and leaves once it is idle", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession();
  const view = await lab.newPage();
  const { page } = view;
  await page.goto(`${server.url}/console#/`);
  await waitFor(page, rowSelector(id, "idle"), "the idle session's row with no filter", { state: "visible" });

  await page.selectOption("#filter-status", "running");
  await waitFor(page, rowSelector(id), "the idle session's row to go once only running sessions are listed", { state: "hidden" });
  await waitForListStream(view);
  await lab.screenshot(page, "filter-none-running");

  await api.postMessage(id, "/delay 100\n/words 30");
  await waitFor(page, rowSelector(id, "running"), "the session's row to appear while its turn runs", { state: "visible" });
  await lab.screenshot(page, "filter-running");
  await waitFor(page, rowSelector(id), "the session's row to leave once it is idle", { state: "hidden", timeout: 20_000 });
  const log = await api.events(id);
  assert.equal(
    log.filter((e) => e.type === "session.status_idle").length,
    1,
    `the row left only once the turn had ended: ${show(log.map((e) => e.type))}`,
  );
  assert.equal(await page.inputValue("#filter-status"), "running", "the filter is still on running");

  await page.selectOption("#filter-status", "");
  await waitFor(page, rowSelector(id, "idle"), "the session's row back, idle, once the filter is cleared", { state: "visible" });
  await lab.screenshot(page, "filter-cleared");
});

test("paging and filters: the list pages with More, newest first, and filters by agent and creator", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  // One more than a page (50), oldest first.
  const ids = [];
  for (let i = 0; i < 51; i += 1) ids.push(await api.createSession());
  const newestFirst = [...ids].reverse();
  const view = await lab.newPage();
  const { page } = view;
  await page.goto(`${server.url}/console#/`);
  await until(async () => (await sessionRows(page)).length === 50, { what: "a first page of 50 rows", state: async () => (await sessionRows(page)).length });
  assert.deepEqual((await sessionRows(page)).map((r) => r.id), newestFirst.slice(0, 50), "newest first");
  await waitFor(page, "#more", "the More button, since a session is left", { state: "visible" });
  await page.click("#more");
  await until(async () => (await sessionRows(page)).length === 51, { what: "the 51st row after More", state: async () => (await sessionRows(page)).length });
  assert.deepEqual((await sessionRows(page)).map((r) => r.id), newestFirst, "every session once, in order");
  await waitFor(page, "#more", "no More button once all are listed", { state: "hidden" });
  await lab.screenshot(page, "paged");

  await page.fill("#filter-agent", "no-such-agent");
  await until(async () => (await sessionRows(page)).length === 0, { what: "no rows for an agent nobody uses", state: async () => (await sessionRows(page)).length });
  await page.fill("#filter-agent", "default");
  await until(async () => (await sessionRows(page)).length === 50, { what: "a page of the default agent's sessions", state: async () => (await sessionRows(page)).length });
  await page.fill("#filter-creator", "someone-else");
  await until(async () => (await sessionRows(page)).length === 0, { what: "no rows for another creator", state: async () => (await sessionRows(page)).length });
  await page.fill("#filter-creator", "local");
  await until(async () => (await sessionRows(page)).length === 50, { what: "the local creator's sessions again", state: async () => (await sessionRows(page)).length });
  await lab.screenshot(page, "filtered");
});

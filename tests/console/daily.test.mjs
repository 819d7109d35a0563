// The console as people who watch agents all day use it: dropped connections, a list that
// must not miss a session, replays, the keyboard, narrow screens (long sessions are
// long.test.mjs's). Each test starts its own server (`turnlog serve`, temp data dir) and
// drives Debian's Chromium through playwright-core.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import {
  Api,
  EVERY_DELTA,
  Lab,
  TEST,
  assertRowsMatchLog,
  closeBrowser,
  fillSession,
  openSession,
  pageState,
  rowSelector,
  show,
  until,
  waitFor,
  waitForListStream,
  waitForRow,
  waitInPage,
} from "./helpers.mjs";

after(closeBrowser);

test("keyboard: Tab reaches the events table; the arrows, Page Down, Home and End move along its rows; Enter shows an event; c copies its id", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer({ config: lab.writeConfig(EVERY_DELTA) });
  const api = new Api(server);
  const id = await api.createSession();
  for (const text of ["/words 30", "/words 30"]) {
    const turn = await api.call("POST", `/sessions/${id}/turns`, { stream: "none", messages: [{ role: "user", content: text }] });
    assert.equal(turn.status, 200, show(turn.body));
  }
  const log = await api.events(id);
  assert.ok(log.length > 60, `more rows than the table shows at once: ${log.length}`);
  const { page, context } = await lab.newPage();
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.url });
  await openSession(page, server, id);
  await waitForRow(page, log.at(-1).id, "the whole log in the table");
  const active = () => page.evaluate(() => {
    const row = document.activeElement?.closest?.("#events tr[data-seq]");
    if (!row) return null;
    // In view: in the table's box below its sticky header, and in the window.
    const box = document.getElementById("events-box").getBoundingClientRect();
    const head = document.querySelector("#events th").getBoundingClientRect(); // (the sticky cells)
    const at = row.getBoundingClientRect();
    const inView = at.top >= Math.max(box.top, head.bottom, 0) - 1 && at.bottom <= Math.min(box.bottom, window.innerHeight) + 1;
    return { seq: Number(row.dataset.seq), id: row.dataset.eventId, inView };
  });
  const on = async (seq, what) => {
    const row = await until(async () => { const r = await active(); return r?.seq === seq ? r : null; }, { what, state: async () => show(await active()) });
    assert.ok(row.inView, `${what}: the row is in view`);
    assert.equal(row.id, log[seq - 1].id, `${what}: the row is the log's event ${seq}`);
  };

  await page.focus("#type-filter");
  await page.keyboard.press("Tab");
  await on(1, "Tab from the type filter: the first row");
  await page.keyboard.press("End");
  await on(log.length, "End: the last row");
  await page.keyboard.press("Home");
  await on(1, "Home: the first row again");
  for (let i = 0; i < 3; i += 1) await page.keyboard.press("ArrowDown");
  await on(4, "three rows down");
  await page.keyboard.press("ArrowUp");
  await on(3, "one up");
  await page.keyboard.press("Enter");
  await waitFor(page, "#event-detail:not([hidden])", "Enter shows the row's event", { state: "visible" });
  assert.match(await page.textContent("#event-detail .detail-head"), new RegExp(`^#3 · ${log[2].id} · ${log[2].type}$`));
  await on(3, "the row keeps the keyboard once its event shows");
  await page.keyboard.press("Enter");
  await waitFor(page, "#event-detail", "Enter again hides it", { state: "hidden" });
  await page.keyboard.press("c");
  await waitFor(page, `#events tr[data-seq="3"][data-copied="true"]`, "c marks the row's id copied");
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), log[2].id, "c copies the row's event id");
  await page.keyboard.press("PageDown");
  const paged = await until(async () => { const r = await active(); return r && r.seq > 3 ? r : null; }, { what: "Page Down moves a page of rows" });
  assert.ok(paged.seq >= 3 + 10 && paged.inView, `a page down, in view: ${show(paged)}`);
  await lab.screenshot(page, "keyboard-row");
  // A window too short for the table: the page scrolls too, so the row stays in sight.
  await page.setViewportSize({ width: 1000, height: 420 });
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.keyboard.press("End");
  await on(log.length, "End in a short window: the last row, in the window");
  await page.keyboard.press("Home");
  await on(1, "Home in a short window: the first row, in the window");
});

test("list race: a session made while the list's stream is still opening is listed once it opens", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const before = await api.createSession();
  const view = await lab.newPage();
  const { page } = view;
  // The list's stream is held 1.5 s on its way (a slow proxy): the first page of the list
  // is read before it subscribes.
  let made = null;
  await page.route("**/console/api/sessions/stream", async (route) => {
    if (!made) made = api.createSession(); // made while the stream is held
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    await route.continue();
  });
  await page.goto(`${server.url}/console#/`);
  await waitFor(page, rowSelector(before), "the session made before the page", { state: "visible" });
  await waitForListStream(view);
  const during = await made;
  await waitFor(page, rowSelector(during), "the session made while the stream was opening", { state: "visible", timeout: 10_000 });
  const later = await api.createSession();
  await waitFor(page, rowSelector(later), "a session made once the stream is open", { state: "visible" });
});

test("replay at max: the view follows the end of the replay, and ends there", { timeout: 180_000 }, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer({ config: lab.writeConfig(EVERY_DELTA) });
  const api = new Api(server);
  const id = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  await fillSession(api, id, 2_000);
  const log = await api.events(id);
  const { page } = await lab.newPage();
  await openSession(page, server, id);
  await waitForRow(page, log.at(-1).id, "the log drawn live", { timeout: 60_000 });
  await page.click("#replay-start");
  await waitFor(page, "#replay-play:not([disabled])", "the replay loaded");
  await page.selectOption("#replay-speed", "max");
  await page.click("#replay-play");
  await waitFor(page, '#replay[data-done="true"]', "the replay at its end", { timeout: 120_000 });
  assert.equal(await page.textContent("#replay-position"), `${log.length} / ${log.length}`);
  const gap = await waitInPage(
    page,
    () => {
      const box = document.getElementById("conversation");
      const gap = box.scrollHeight - box.scrollTop - box.clientHeight;
      return gap < 60 ? String(gap) : false;
    },
    null,
    "the conversation scrolled to its end",
    { timeout: 5_000 },
  );
  lab.note(`${log.length} events replayed at max; ${gap} px from the end`);
  await lab.screenshot(page, "replayed-at-max");
});

test("stale error: a send that cannot reach the server says so, and the message goes once the server is back and the stream live", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession();
  const { page } = await lab.newPage();
  await openSession(page, server, id);
  await server.kill();
  await waitFor(page, "#conn[data-state=reconnecting]", "the lost connection shown");
  assert.match(await page.textContent("#conn-note"), /Reconnecting/, "what the page does about it, in words");
  await page.fill("#message", "are you there?");
  await page.click("#send");
  await waitInPage(page, () => /cannot reach the server/.test(document.getElementById("compose-error").textContent), null, "the send's failure shown");
  await server.start({ port: server.port });
  await waitFor(page, "#conn[data-state=live]", "the stream live again", { timeout: 30_000 });
  assert.equal(await page.textContent("#compose-error"), "", "the failure to reach the server is gone once it is back");
  assert.equal(await page.isHidden("#conn-note"), true, "no connection note while live");
  assert.equal(await page.inputValue("#message"), "are you there?", "the message not sent is kept");
  await page.click("#send");
  await waitInPage(page, () => [...document.querySelectorAll("#conversation .msg.agent")].some((el) => el.textContent === "echo: are you there?"), null, "the reply");
});

test("cursor after a 502: once the page reopened its stream with after_id, a later drop resumes from the newest event, resending nothing", { timeout: 120_000 }, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession();
  await api.postMessage(id, "first");
  await api.waitForIdle(id, 1);
  const { page } = await lab.newPage();
  // Each EventSource the page opens, with the ids it received, and where it (re)opened.
  await page.addInitScript(() => {
    const Native = window.EventSource;
    window.__sources = [];
    window.EventSource = class extends Native {
      constructor(url, options) {
        super(url, options);
        const record = { url: String(url), got: [] };
        window.__sources.push(record);
        super.addEventListener("open", () => record.got.push("open"));
        const listen = super.addEventListener.bind(this);
        this.addEventListener = (type, listener, opts) => listen(type, (message) => {
          if (type !== "open" && type !== "error") record.got.push(message.lastEventId);
          listener(message);
        }, opts);
      }
    };
  });
  await openSession(page, server, id);
  let log = await api.events(id);
  await waitForRow(page, log.at(-1).id, "the first turn drawn");

  // A gateway answers 502 to the browser's own reconnect: the page opens a new stream,
  // after the newest event it holds.
  let refused = 0;
  await page.route("**/events/stream*", (route) => (refused++ === 0 ? route.fulfill({ status: 502, body: "bad gateway" }) : route.continue()));
  await server.kill();
  await server.start({ port: server.port });
  await waitFor(page, "#conn[data-state=live]", "the page's own stream after the 502", { timeout: 30_000 });
  const sources = await page.evaluate(() => window.__sources.map((s) => s.url));
  assert.equal(sources.length, 2, `a second EventSource after the 502: ${show(sources)}`);
  assert.match(sources[1], new RegExp(`after_id=${log.at(-1).id}`), "it opens after the newest event the page holds");

  await api.postMessage(id, "second");
  log = await api.waitForIdle(id, 2);
  await waitForRow(page, log.at(-1).id, "the second turn drawn");
  const newest = log.at(-1).id;

  // A later drop: the browser reopens the same URL (its after_id now old), sending
  // Last-Event-ID; the server resumes from the later of the two.
  await server.kill();
  await server.start({ port: server.port });
  await waitFor(page, "#conn[data-state=live]", "the stream back after the second drop", { timeout: 30_000 });
  await api.postMessage(id, "third");
  log = await api.waitForIdle(id, 3);
  await waitForRow(page, log.at(-1).id, "the third turn drawn");
  const got = await page.evaluate(() => window.__sources[1].got);
  const reopened = got.lastIndexOf("open");
  const resent = got.slice(reopened + 1).filter((eventId) => eventId <= newest);
  assert.deepEqual(resent, [], `events resent after the second drop (the stream's ids: ${show(got)})`);
  const received = got.filter((g) => g !== "open");
  assert.equal(new Set(received).size, received.length, "no event received twice on the page's stream");
  await assertRowsMatchLog(page, log);
});

test("narrow screen: at 400 px the session reads without sideways scrolling; turn headers name each turn", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  await api.postMessage(id, '/think Two sums.\n/tool calculator {"expression": "1+2"}\n/tool calculator {"expression": "3+4"}');
  await api.waitForIdle(id, 1);
  await api.postMessage(id, "a longer message that has to wrap on a narrow screen, with a long token: " + "x".repeat(80));
  const log = await api.waitForIdle(id, 2);
  const view = await lab.newPage();
  const { page } = view;
  await page.setViewportSize({ width: 400, height: 800 });
  await openSession(page, server, id);
  await waitForRow(page, log.at(-1).id, "the session drawn");
  await waitFor(page, '#conversation section.turn[data-turn-n="2"] .turn-end', "the second turn's end");
  const width = await page.evaluate(() => document.documentElement.scrollWidth);
  const wide = await page.evaluate(() => [...document.querySelectorAll("body *")].filter((el) => el.getBoundingClientRect().right > 401).slice(0, 8).map((el) => `${el.tagName.toLowerCase()}#${el.id}.${el.className} right ${Math.round(el.getBoundingClientRect().right)}`));
  assert.ok(width <= 400, `${show(wide)}: ` + `no sideways scrolling at 400 px: the page is ${width} px wide; ${await pageState(page)}`);
  const heads = await page.$$eval("#conversation .turn-head", (els) => els.map((el) => [...el.children].map((part) => part.textContent).join(" ")));
  assert.equal(heads.length, 2, show(heads));
  heads.forEach((head, i) => assert.match(head, new RegExp(`^Turn ${i + 1} \\d\\d:\\d\\d:\\d\\d scripted \\d+\\.\\d s$`), head));
  // The events table takes the whole width of its box, and the event column what the
  // others leave (the id and time columns are hidden at this width).
  const table = await page.evaluate(() => ({
    box: document.getElementById("events-box").clientWidth,
    table: document.getElementById("events").getBoundingClientRect().width,
    shown: [1, 3].map((n) => document.querySelector(`#events th:nth-child(${n})`).getBoundingClientRect().width),
    event: document.querySelector("#events th:nth-child(5)").getBoundingClientRect().width,
  }));
  assert.ok(table.table >= table.box - 2, `the table fills its box: ${show(table)}`);
  assert.ok(table.event >= table.table - table.shown[0] - table.shown[1] - 2, `the event column has the room left: ${show(table)}`);
  await lab.screenshot(page, "narrow-400");
  await page.setViewportSize({ width: 1600, height: 900 });
  await lab.screenshot(page, "wide-1600");
  await until(async () => (await page.evaluate(() => document.documentElement.scrollWidth)) <= 1600, { what: "no sideways scrolling on a wide screen" });
});

test("what newer features record: a mode change, the model's plan, an outcome's evaluation, a compaction with its summary, a fork linked to its source, and the hash chain verified", { timeout: 120_000 }, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession({ tools: [{ name: "update_plan", trust: true }] });
  await api.ok("POST", `/sessions/${id}/mode`, { mode: "plan" });
  const plan = { entries: [
    { content: "Read the logs", status: "completed", priority: "high" },
    { content: "Find the slow turn", status: "in_progress", priority: "medium" },
    { content: "Write it up", status: "pending", priority: "low" },
  ] };
  await api.postMessage(id, `/tool update_plan ${JSON.stringify(plan)}`);
  await api.waitForIdle(id, 1);
  await api.ok("POST", `/sessions/${id}/events`, { events: [{ type: "user.define_outcome", outcome: "a short report" }] });
  await api.postMessage(id, "write the report");
  await api.waitForIdle(id, 2);
  await api.ok("POST", `/sessions/${id}/events`, { events: [{ type: "user.compact" }] });
  let log = await api.waitForIdle(id, 3);
  const { page } = await lab.newPage();
  await openSession(page, server, id);
  await waitForRow(page, log.at(-1).id, "the session drawn");

  assert.match(await page.textContent("#conversation .note.updated"), /mode plan from the next turn/);
  const steps = await page.$$eval("#conversation .tool.plan .plan-steps li", (els) => els.map((el) => [el.dataset.status, el.textContent.trim()]));
  assert.deepEqual(steps, [["completed", "● Read the logs high priority"], ["in_progress", "◐ Find the slow turn"], ["pending", "○ Write it up low priority"]], "the plan as steps");
  const verdict = log.find((e) => e.type === "span.outcome_evaluation_end");
  assert.ok(verdict, `an evaluation in the log: ${show(log.map((e) => e.type))}`);
  assert.match(await page.textContent("#conversation .evaluation"), new RegExp(`${verdict.result.replaceAll("_", " ")} · outcome “a short report” · evaluation 0`));
  const compacted = log.find((e) => e.type === "history.compacted");
  assert.ok(compacted?.summary, `a compaction with a summary: ${show(compacted)}`);
  await page.click("#conversation details.compaction summary");
  assert.equal(await page.textContent("#conversation .compaction-summary"), compacted.summary);
  await lab.screenshot(page, "newer-features");

  await page.click("#verify");
  await waitFor(page, '#verify-result[data-verified="true"]', "the chain verified");
  assert.match(await page.textContent("#verify-result"), new RegExp(`^Hash chain verified: ${log.length} events, head [0-9a-f]{64}$`));

  const fork = await api.ok("POST", `/sessions/${id}/fork`, { at: log.at(-1).id }, 201);
  await page.goto(`${server.url}/console#/sessions/${fork.sessionId}`);
  await waitFor(page, `#conversation .note.created a[href="#/sessions/${id}"]`, "the fork's link to its source");
  assert.match(await page.textContent("#conversation .note.created .fork"), new RegExp(`^Forked from ${id} at event #${log.length} \\(${log.at(-1).id}\\)$`));
  await page.click(`#conversation .note.created a[href="#/sessions/${id}"]`);
  await waitFor(page, `#session[data-session-id="${id}"]`, "the source opened from the fork's link");
});

test("switching: a replay started while a long session still loads stays a replay; back to live draws the log once; another session, and a filter, while the table is scrolled down, draw their own rows at once", { timeout: 180_000 }, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer({ config: lab.writeConfig(EVERY_DELTA) });
  const api = new Api(server);
  const long = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  await fillSession(api, long, 3_000);
  const longLog = await api.events(long);
  const short = await api.createSession();
  await api.postMessage(short, "just one");
  const shortLog = await api.waitForIdle(short, 1);
  const view = await lab.newPage();
  const { page } = view;

  // Replay pressed as soon as it can be, while the log is still loading.
  await page.goto(`${server.url}/console#/sessions/${long}`);
  await waitFor(page, "#replay-start:not([disabled])", "Replay available");
  await page.click("#replay-start");
  await waitFor(page, "#replay-play:not([disabled])", "the replay loaded", { timeout: 30_000 });
  const streamsFrom = view.requests.length;
  await page.$eval("#replay-scrub", (el) => { el.value = "10"; el.dispatchEvent(new Event("input", { bubbles: true })); });
  await waitInPage(page, () => document.getElementById("events-box").dataset.count === "10", null, "the replay at event 10");
  // The replay read the whole log after the click: a page of the first load still under
  // way then has long answered, and anything it started would show by now.
  assert.equal(await page.getAttribute("#events-box", "data-count"), "10", "nothing but the replay drew after it started");
  assert.deepEqual(view.requests.slice(streamsFrom).map((r) => r.url()).filter((u) => u.includes("/events/stream")), [], "no live stream during the replay");
  await page.click("#replay-exit");
  await assertRowsMatchLog(page, longLog);

  // The table scrolled to its end, then a filter: its rows are drawn at once, from the top.
  await page.$eval("#events-box", (box) => { box.scrollTop = box.scrollHeight; });
  await page.selectOption("#type-filter", "user.message");
  const firstAsk = longLog.find((e) => e.type === "user.message");
  await waitFor(page, `#events tbody tr[data-event-id="${firstAsk.id}"]`, "the first user.message row, drawn at once");
  await page.selectOption("#type-filter", "");

  // Another session, the table scrolled down: its own rows, from the top, and only those.
  await page.$eval("#events-box", (box) => { box.scrollTop = box.scrollHeight; });
  await page.goto(`${server.url}/console#/sessions/${short}`);
  await waitFor(page, `#events tbody tr[data-event-id="${shortLog[0].id}"]`, "the other session's first row, drawn at once");
  await assertRowsMatchLog(page, shortLog);
  const drawn = await page.evaluate(async () => {
    const box = document.getElementById("events-box");
    box.scrollTop = 200;
    await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))); // (the table draws at the next frame)
    return [...box.querySelectorAll("tbody tr[data-event-id]")].map((row) => row.dataset.eventId);
  });
  assert.ok(drawn.every((id) => shortLog.some((e) => e.id === id)), `only this session's rows after a scroll: ${show(drawn.filter((id) => !shortLog.some((e) => e.id === id)))}`);
});

// The console as people who watch agents all day use it: long sessions, dropped
// connections, a list that must not miss a session, replays, narrow screens. Each test
// starts its own server (`turnlog serve`, temp data dir) and drives Debian's Chromium
// through playwright-core; figures a test measures (the main thread's longest task, the
// page's DOM nodes) are printed in its report, not asserted on time.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import {
  Api,
  Lab,
  TEST,
  assertRowsMatchLog,
  closeBrowser,
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

/** Every delta a log event of its own (the default merges a model's tokens 25 ms at a time). */
const EVERY_DELTA = "[engine]\ndelta_coalesce_ms = 0\n";

/** Runs whole turns through the turn API (each answered once it ended) until the log holds at least `n` events. */
async function fillSession(api, id, n) {
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

/** Records the main thread's long tasks (the Long Tasks API) from the page's first script on. */
function watchLongTasks(page) {
  return page.addInitScript(() => {
    window.__longTasks = [];
    window.__frames = [];
    new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) window.__longTasks.push({ at: entry.startTime, ms: Math.round(entry.duration) });
    }).observe({ type: "longtask", buffered: true });
    // What ran in each long frame (Long Animation Frames), to say what a long task was.
    new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) {
        const scripts = entry.scripts.map((s) => `${s.invoker || s.sourceFunctionName || "?"} ${Math.round(s.duration)} ms`);
        window.__frames.push({ at: entry.startTime, ms: Math.round(entry.duration), what: `${Math.round(entry.duration)} ms (blocking ${Math.round(entry.blockingDuration)} ms, layout ${Math.round(entry.renderStart ? entry.startTime + entry.duration - entry.renderStart : 0)} ms): ${scripts.join(", ")}` });
      }
    }).observe({ type: "long-animation-frame", buffered: true });
  });
}

test("long session: 10,000 events open in slices (the longest task is printed), the page stays under a few thousand DOM nodes, and every turn is there to scroll to", { timeout: 300_000 }, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer({ config: lab.writeConfig(EVERY_DELTA) });
  const api = new Api(server);
  const id = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  const turns = await fillSession(api, id, 10_000);
  const log = await api.events(id);
  lab.note(`the session: ${log.length} events in ${turns} turns`);
  assert.ok(log.length >= 10_000, `at least 10,000 events: ${log.length}`);

  const { page } = await lab.newPage();
  await watchLongTasks(page);
  // What the conversation said while the log was read: each value its `data-loading` had
  // before a change (the value after the last change is read at the end).
  await page.addInitScript(() => {
    window.__loading = [];
    new MutationObserver((changes) => {
      for (const change of changes) if (change.target.id === "conversation") window.__loading.push(change.oldValue);
    }).observe(document, { subtree: true, attributes: true, attributeOldValue: true, attributeFilter: ["data-loading"] });
  });
  // The page first (its start-up measured apart), then the session opened from the list.
  await page.goto(`${server.url}/console#/`);
  await waitFor(page, rowSelector(id), "the session in the list", { state: "visible" });
  const opened = await page.evaluate(() => performance.now());
  const from = Date.now();
  await page.click(`${rowSelector(id)} a`);
  await waitFor(page, "#conn[data-state=live]", "the session's stream live", { timeout: 60_000 });
  await waitForRow(page, log.at(-1).id, "the whole log in the table", { timeout: 120_000 });
  await waitFor(page, `#conversation section.turn[data-turn-n="${turns}"] .turn-end`, "the last turn's end", { timeout: 30_000 });
  const loaded = Date.now() - from;
  await waitInPage(
    page,
    () => {
      const box = document.getElementById("conversation");
      return box.scrollHeight - box.scrollTop - box.clientHeight < 60;
    },
    null,
    "the conversation at its end once loaded",
    { timeout: 5_000 },
  );
  // Typing once it is loaded: how long a key takes to reach the text box.
  const keyFrom = Date.now();
  await page.type("#message", "still responsive");
  const typed = Date.now() - keyFrom;
  const figures = await page.evaluate((opened) => {
    const open = window.__longTasks.filter((t) => t.at >= opened).map((t) => t.ms);
    const boot = window.__longTasks.filter((t) => t.at < opened).map((t) => t.ms);
    return {
      nodes: document.getElementsByTagName("*").length,
      longest: Math.max(0, ...open),
      over50: open.filter((d) => d > 50).length,
      tasks: open.length,
      boot: Math.max(0, ...boot),
      sections: document.querySelectorAll("#conversation > section").length,
      aside: document.querySelectorAll("#conversation > section[data-aside]").length,
      frames: window.__frames.filter((f) => f.at >= opened && f.ms > 50).map((f) => f.what),
    };
  }, opened);
  lab.note(`frames over 50 ms while it opened: ${figures.frames.join(" | ") || "none"}`);
  lab.note(
    `opened from the list and drawn in ${loaded} ms; longest main-thread task while it opened ${figures.longest} ms ` +
      `(${figures.over50} over 50 ms, of ${figures.tasks} long tasks; the page's own start-up before it: ${figures.boot} ms); ` +
      `${figures.nodes} DOM nodes; ${figures.sections} sections, ${figures.aside} put aside; typing 16 keys took ${typed} ms`,
  );
  // Drawn out of sight while it was read, saying how far the reading was; shown once drawn.
  const said = await page.evaluate(() => [...window.__loading, document.getElementById("conversation").dataset.loading ?? null]);
  const progress = said.filter((text) => text != null);
  lab.note(`while it was read, the conversation said ${progress.length} times where the reading was, from "${progress[0]}" to "${progress.at(-1)}"`);
  assert.match(said.find((text) => /events so far/.test(text ?? "")) ?? "", /^Reading the session’s log: [\d,]+ events so far…$/, "the reading's progress, said");
  assert.equal(said.at(-1), null, "the conversation shown once drawn");
  assert.ok(figures.nodes < 5_000, `the page stays under a few thousand DOM nodes: ${figures.nodes}`);
  assert.equal(figures.sections, turns + 1, "a section per turn, and one before them");
  assert.ok(figures.aside > 0, "turns far from the view are put aside");
  // Shown with only its last turn in the page, the turns near it are filled again.
  await waitFor(page, `#conversation section.turn[data-turn-n="${turns - 1}"]:not([data-aside]) .turn-end`, "the turn before the last, near the view, filled again", { state: "attached", timeout: 5_000 });
  await lab.screenshot(page, "long-session-end");

  // The first turn is there to scroll to: its section is filled again as it comes near.
  await page.$eval("#conversation", (box) => { box.scrollTop = 0; });
  await waitFor(page, '#conversation section.turn[data-turn-n="1"] .turn-head', "the first turn drawn again at the top", { timeout: 10_000 });
  const first = await page.$eval('#conversation section.turn[data-turn-n="1"]', (el) => el.textContent);
  assert.match(first, /Turn 1/, "the first turn's header");
  assert.match(first, /w1 w2 w3/, "the first turn's reply");
  await lab.screenshot(page, "long-session-top");

  // The table's last rows, scrolled to: the log's last events, in order. (Rows out of the
  // window are drawn a few a frame, so the last may come a frame or two after the scroll.)
  await page.$eval("#events-box", (box) => { box.scrollTop = box.scrollHeight; });
  const tail = await waitInPage(
    page,
    (lastId) => {
      const ids = [...document.querySelectorAll("#events-box tbody tr[data-seq]")].map((tr) => tr.dataset.eventId);
      return ids.at(-1) === lastId && ids;
    },
    log.at(-1).id,
    "the table's last row drawn once scrolled to its end",
    { timeout: 5_000 },
  );
  assert.deepEqual(tail.slice(-5), log.slice(-5).map((e) => e.id), "the table's last rows are the log's last events");
});

test("one long turn: 1,500 calls made together are drawn in parts put aside like turns, each result under its own call", { timeout: 300_000 }, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  const calls = 1_500;
  // One model request with 1,500 different calls: their results come after all of them.
  const script = Array.from({ length: calls }, (_, i) => `/tool calculator {"expression": "${i}+1000"}`).join("\n");
  const turn = await api.call("POST", `/sessions/${id}/turns`, { stream: "none", messages: [{ role: "user", content: script }] });
  assert.equal(turn.status, 200, show(turn.body));
  const log = await api.events(id);
  lab.note(`the session: one turn of ${log.length} events`);

  const { page } = await lab.newPage();
  await watchLongTasks(page);
  // The page first (its start-up measured apart), then the session opened from the list.
  await page.goto(`${server.url}/console#/`);
  await waitFor(page, rowSelector(id), "the session in the list", { state: "visible" });
  const opened = await page.evaluate(() => performance.now());
  await page.click(`${rowSelector(id)} a`);
  await waitFor(page, "#conn[data-state=live]", "the session's stream live", { timeout: 60_000 });
  await waitForRow(page, log.at(-1).id, "the whole log in the table", { timeout: 120_000 });
  await waitFor(page, '#conversation section.turn-part .turn-end', "the turn's end, in a later part of it", { timeout: 30_000 });
  const figures = await page.evaluate((opened) => ({
    nodes: document.getElementsByTagName("*").length,
    parts: document.querySelectorAll('#conversation > section.turn-part[data-turn-n="1"]').length,
    aside: document.querySelectorAll("#conversation > section[data-aside]").length,
    longest: Math.max(0, ...window.__longTasks.filter((t) => t.at >= opened).map((t) => t.ms)),
    boot: Math.max(0, ...window.__longTasks.filter((t) => t.at < opened).map((t) => t.ms)),
    frames: window.__frames.filter((f) => f.at >= opened && f.ms > 50).map((f) => f.what),
  }), opened);
  lab.note(`frames over 50 ms while it opened: ${figures.frames.join(" | ") || "none"}`);
  lab.note(
    `${figures.nodes} DOM nodes; the turn in ${figures.parts + 1} sections, ${figures.aside} put aside; ` +
      `longest main-thread task while it opened ${figures.longest} ms (the page's own start-up before it: ${figures.boot} ms)`,
  );
  assert.ok(figures.parts >= calls / 50, `the turn goes on in parts: ${figures.parts}`);
  assert.ok(figures.aside > 0, "parts far from the view are put aside");
  assert.ok(figures.nodes < 5_000, `the page stays under a few thousand DOM nodes: ${figures.nodes}`);
  await lab.screenshot(page, "long-turn-end");

  // Read from the top to the end, a view at a time: every call once, in order, its own
  // result under it, no call continued elsewhere.
  const read = await page.evaluate(async () => {
    const box = document.getElementById("conversation");
    const frame = () => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
    const seen = new Map();
    const problems = [];
    box.scrollTop = 0;
    for (;;) {
      await frame();
      for (const tool of box.querySelectorAll(".tool")) {
        if (tool.matches(".continued")) problems.push(`a continued box for ${tool.querySelector(".tool-ref")?.dataset.callEventId}`);
        const call = tool.querySelector(".tool-call");
        if (!call) continue;
        const input = call.querySelector(".tool-input")?.textContent ?? "";
        const result = tool.querySelector(":scope > .tool-result")?.textContent ?? null;
        // (A view's calls are counted once each; one drawn twice in a view is a problem.)
        if ([...box.querySelectorAll(`.tool-call[data-event-id="${call.dataset.eventId}"]`)].length > 1) problems.push(`call ${call.dataset.eventId} drawn twice`);
        seen.set(call.dataset.eventId, { input, result });
      }
      if (box.scrollTop + box.clientHeight >= box.scrollHeight - 1) break;
      box.scrollTop += Math.max(box.clientHeight - 48, 24);
    }
    return { calls: [...seen.entries()], problems: [...new Set(problems)] };
  });
  assert.deepEqual(read.problems, [], "no call's result is in a box of its own");
  const callEvents = log.filter((e) => e.type === "agent.tool_use");
  assert.equal(callEvents.length, calls);
  const drawn = new Map(read.calls);
  assert.deepEqual([...drawn.keys()].sort(), callEvents.map((e) => e.id).sort(), "every call drawn once");
  for (const [i, event] of callEvents.entries()) {
    const { input, result } = drawn.get(event.id);
    const n = Number(JSON.parse(input).expression.split("+")[0]);
    assert.equal(result, String(n + 1000), `call ${i} (${event.id}, ${input}): its own result under it`);
  }
  await lab.screenshot(page, "long-turn-end-read");
});

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

test("the same call hundreds of times: folded (×N) a part of the turn at a time, so no box holds them all; every call once, in order", { timeout: 180_000 }, async (t) => {
  const lab = new Lab(t);
  const requests = 400;
  const server = await lab.startServer({ config: lab.writeConfig(`[agents.default]\nmax_turn_requests = ${requests}\n`) });
  const api = new Api(server);
  const id = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  // `/loop` calls the calculator with the same input in every request, until the limit.
  const turn = await api.call("POST", `/sessions/${id}/turns`, { stream: "none", messages: [{ role: "user", content: "/loop" }] });
  assert.equal(turn.status, 200, show(turn.body));
  const log = await api.events(id);
  const calls = log.filter((e) => e.type === "agent.tool_use");
  assert.equal(calls.length, requests, "one call per request");
  lab.note(`the session: one turn of ${log.length} events, ${calls.length} identical calls`);

  const { page } = await lab.newPage();
  await openSession(page, server, id);
  await waitForRow(page, log.at(-1).id, "the whole log in the table", { timeout: 60_000 });
  await waitFor(page, "#conversation section.turn-part .turn-end", "the turn's end, in a later part of it", { timeout: 30_000 });
  // Read from the top to the end, a view at a time: each box's call and its folded repeats.
  const read = await page.evaluate(async () => {
    const box = document.getElementById("conversation");
    const frame = () => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
    const boxes = new Map(); // the first call's event id → [the count shown, the calls under it]
    // A reader's wheel first: the view stops following the end, as it does for a person.
    box.dispatchEvent(new WheelEvent("wheel", { deltaY: -100 }));
    box.scrollTop = 0;
    for (;;) {
      await frame();
      for (const tool of box.querySelectorAll(".tool")) {
        const call = tool.querySelector(".tool-call");
        if (!call) continue;
        const ids = [call.dataset.eventId, ...[...tool.querySelectorAll(".repeat")].map((r) => r.dataset.eventId)];
        boxes.set(call.dataset.eventId, [tool.querySelector(".tool-head .count")?.textContent ?? "×1", ids]);
      }
      if (box.scrollTop + box.clientHeight >= box.scrollHeight - 1) break;
      box.scrollTop += Math.max(box.clientHeight - 48, 24);
    }
    return [...boxes.values()];
  });
  lab.note(`drawn as ${read.length} boxes: ${read.map(([count]) => count).join(" ")}`);
  assert.deepEqual(read.flatMap(([, ids]) => ids), calls.map((e) => e.id), "every call once, in the log's order");
  for (const [count, ids] of read) {
    assert.equal(count, `×${ids.length}`, "a box's count is the calls folded in it");
    assert.ok(ids.length <= 50, `no box holds more than a part's 50 items: ${count}`);
  }
  assert.ok(read.length >= requests / 50, `the calls go on over the turn's parts: ${read.length} boxes`);
  read.slice(0, -1).forEach(([count], i) => assert.ok(Number(count.slice(1)) >= 40, `box ${i + 1} folds the repeats its part holds: ${count}`));
  await lab.screenshot(page, "identical-calls");
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

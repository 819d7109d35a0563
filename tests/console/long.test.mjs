// Long sessions in the console: a 10,000-event log, one turn of 1,500 calls made together,
// and the same call hundreds of times. Each test starts its own server (`turnlog serve`,
// temp data dir) and drives Debian's Chromium through playwright-core; what a test measures
// (the main thread's longest task while the session opens, the long frames, the DOM nodes)
// is printed in its report, not asserted on time.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { Api, EVERY_DELTA, Lab, closeBrowser, fillSession, openSession, rowSelector, show, waitFor, waitForRow, waitInPage } from "./helpers.mjs";

after(closeBrowser);

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

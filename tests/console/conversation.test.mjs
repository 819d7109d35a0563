// A session's view, what it draws from the log: the conversation (thinking folded, tool calls
// with their inputs, results and permission decisions, stop reasons, errors, usage per turn),
// the Interrupt button, and the raw events' type filter. Turns are driven through the native
// event API with the scripted model ("The scripted model" in docs/models.md):
//   `/think T` a thinking block; `/tool NAME JSON` a call (several lines: parallel calls);
//   `/error CODE`, `/refuse`, `/max_tokens`, `/loop` (calculator on every request, until
//   max_turn_requests); `/delay MS` and `/words N` a slow reply `w1 ... wN`.
// The page is used only through the console contract (README.md here). Screenshots, the
// server's log and the browser's log go to target/console-tests/<test>/.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import {
  Api,
  Lab,
  TEST,
  assertRowsMatchLog,
  closeBrowser,
  count,
  eventRows,
  eventText,
  openSession,
  pageState,
  show,
  shownRows,
  until,
  waitFor,
  waitForRow,
  waitForText,
  waitInPage,
  words,
} from "./helpers.mjs";

after(closeBrowser);

// ---------- what the page shows, and what it should show ----------

/**
 * `#conversation` as lines, top to bottom, one per item a reader sees; what is under a tool
 * call (its permission decision, its result) is indented below the call. Texts that may hold
 * line breaks are JSON strings; a tool's input is its JSON, compact.
 */
function outline(page) {
  return page.$$eval("#conversation > section > :not(.turn-head)", (items) => {
    const flat = (el) => (el?.textContent ?? "").replace(/\s+/g, " ").trim();
    const lines = [];
    for (const el of items) {
      const id = el.dataset.eventId;
      if (el.matches(".msg.user")) lines.push(`user${el.matches(".queued") ? " (queued)" : ""}: ${JSON.stringify(el.textContent)}`);
      else if (el.matches(".msg.agent")) {
        const states = ["streaming", "retracted"].filter((c) => el.matches(`.${c}`)).map((c) => ` (${c})`).join("");
        lines.push(`agent${states}: ${JSON.stringify(el.textContent)}`);
      }
      else if (el.matches("details.thinking")) {
        lines.push(`thinking ${el.open ? "open" : "folded"}: ${JSON.stringify(el.querySelector(".thinking-text")?.textContent)}`);
      } else if (el.matches(".tool")) {
        for (const part of el.children) {
          if (part.matches(".tool-call")) {
            const tags = [...part.querySelectorAll(".tool-head .tag")].map(flat);
            let input = part.querySelector(".tool-input")?.textContent ?? "";
            try {
              input = JSON.stringify(JSON.parse(input));
            } catch {
              // not JSON: shown as it is
            }
            lines.push(`tool ${part.dataset.eventId} ${flat(part.querySelector(".tool-name"))}${tags.length ? ` [${tags.join(", ")}]` : ""} ${input}`);
          } else if (part.matches(".repeats")) {
            for (const repeat of part.querySelectorAll(".repeat")) {
              const result = repeat.querySelector(".tool-result");
              lines.push(`  repeat ${repeat.dataset.eventId}: ${result?.matches(".is-error") ? "error" : "result"} ${result?.dataset.eventId}: ${JSON.stringify(result?.querySelector("pre")?.textContent)}`);
            }
          } else if (part.matches(".tool-ref")) {
            lines.push(`tool ↳ ${part.dataset.callEventId} ${flat(part.querySelector(".tool-name"))}`);
          } else if (part.matches(".decision")) lines.push(`  decision ${part.dataset.eventId} ${part.dataset.result}: ${flat(part)}`);
          else if (part.matches(".tool-result")) {
            lines.push(`  ${part.matches(".is-error") ? "error" : "result"} ${part.dataset.eventId}: ${JSON.stringify(part.querySelector("pre")?.textContent)}`);
          } else lines.push(`  ? ${part.className}: ${flat(part)}`);
        }
      } else if (el.matches(".turn-end")) {
        const stop = el.querySelector(".stop");
        lines.push(`end ${stop?.dataset.stop}: ${flat(stop)} | ${flat(el.querySelector(".usage")) || "(no usage)"}`);
      } else if (el.matches(".error")) lines.push(`error ${id}: ${flat(el)}`);
      else if (el.matches(".note")) lines.push(`note ${[...el.classList].filter((c) => c !== "note").join(".")}: ${flat(el)}`);
      else lines.push(`? ${el.tagName.toLowerCase()}.${el.className}: ${flat(el)}`);
    }
    return lines;
  });
}

/** Waits until `outline(page)` is `expected`; a failure shows the difference. */
async function waitForOutline(page, expected, what, timeout = 15_000) {
  let seen = [];
  try {
    await until(
      async () => {
        seen = await outline(page);
        return JSON.stringify(seen) === JSON.stringify(expected);
      },
      { what, timeout, interval: 100 },
    );
  } catch (error) {
    assert.deepEqual(seen, expected, `${what}: the conversation is not as expected; ${await pageState(page)}`);
    throw error;
  }
}

/**
 * Every item of `#conversation` is laid out whole, none squeezed or cut off (their content
 * fits their box), and the conversation is long enough to scroll, so that this means something.
 */
async function assertNothingClipped(page, what) {
  const { overflows, clipped } = await page.$eval("#conversation", (box) => ({
    overflows: box.scrollHeight > box.clientHeight,
    clipped: [...box.querySelectorAll(":scope > section > *")]
      .filter((el) => el.getBoundingClientRect().height + 1 < el.scrollHeight)
      .map((el) => {
        const high = Math.round(el.getBoundingClientRect().height);
        return `${el.tagName.toLowerCase()}.${el.className} (${high} px high, its content ${el.scrollHeight} px): ${el.textContent.replace(/\s+/g, " ").slice(0, 80)}`;
      }),
  }));
  assert.ok(overflows, `${what}: #conversation is long enough to scroll`);
  assert.deepEqual(clipped, [], `${what}: items of #conversation cut off`);
}

// What a reader sees as a turn's end: the stop reason's label, by turnlog's own name for it
// (the native stream's `stop_reason.detail` where it differs from the seed's `type`).
const STOP_LABELS = {
  end_turn: "Turn ended",
  requires_action: "Waiting for action",
  cancelled: "Cancelled",
  max_tokens: "Stopped: output token limit",
  max_turn_requests: "Stopped: too many model requests",
  refusal: "The model refused",
  error: "Stopped by an error",
};

const number = new Intl.NumberFormat("en-US");

/** A turn's end as `outline` shows it, from its events' `session.status_idle` (exactly one). */
function endLine(turn) {
  const [idle] = only(turn, "session.status_idle");
  const { input_tokens: input, output_tokens: output, ...others } = idle.usage ?? {};
  assert.ok(Number.isInteger(input) && Number.isInteger(output), `the turn's usage in the log: ${show(idle)}`);
  const parts = [`${number.format(input)} in`, `${number.format(output)} out`];
  for (const [name, value] of Object.entries(others)) if (typeof value === "number") parts.push(`${number.format(value)} ${name.replaceAll("_", " ")}`);
  const stop = idle.stop_reason.detail ?? idle.stop_reason.type;
  // A request cut short before its provider reported usage is counted by turnlog's estimate,
  // which the log marks and the page shows as such.
  const estimated = turn.some((e) => e.type === "span.model_request_end" && e.usage_estimated === true);
  return `end ${stop}: ${STOP_LABELS[stop]} | ${estimated ? "≈ " : ""}tokens: ${parts.join(" · ")}`;
}

/** A turn's reply as `outline` shows it, from the log's `agent.message` (exactly one). */
function replyLine(turn) {
  return `agent: ${JSON.stringify(eventText(only(turn, "agent.message")[0]))}`;
}

/** The log's turns, in order: each turn's events (by turn_id). */
function turns(log) {
  const byId = new Map();
  for (const e of log) if (e.turn_id) byId.set(e.turn_id, [...(byId.get(e.turn_id) ?? []), e]);
  return [...byId.values()];
}

/** The events of `type` in `events`, asserting how many there are. */
function only(events, type, n = 1) {
  const found = events.filter((e) => e.type === type);
  assert.equal(found.length, n, `${n} ${type} in ${show(events.map((e) => e.type))}`);
  return found;
}

/** Posts one event through the native event API. */
function postEvent(api, sessionId, event) {
  return api.ok("POST", `/sessions/${sessionId}/events`, { events: [event] });
}

/** A plain HTTP server on a loopback port for fetch_url: each page says its path. */
async function pageServer(t) {
  const paths = [];
  const server = http.createServer((req, res) => {
    paths.push(req.url);
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(`the page at ${req.url}`);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    server.closeAllConnections();
    return new Promise((resolve) => server.close(resolve));
  });
  return { url: `http://127.0.0.1:${server.address().port}`, paths };
}

/** The `#type-filter` options' values, in order. */
function typeOptions(page) {
  return page.$$eval("#type-filter option", (options) => options.map((o) => o.value));
}

/** Waits until the shown `#events` rows are exactly `events` (ids, in order). */
async function waitForShown(page, events, what) {
  const want = events.map((e) => e.id);
  let shown = [];
  try {
    await until(
      async () => {
        shown = (await shownRows(page)).map((r) => r.id);
        return JSON.stringify(shown) === JSON.stringify(want);
      },
      { what, interval: 100 },
    );
  } catch (error) {
    assert.deepEqual(shown, want, `${what}: the rows shown in #events; ${await pageState(page)}`);
    throw error;
  }
}

// ---------- the tests ----------

test("conversation: thinking folded, parallel tool calls with their inputs and results, an error turn, each turn's stop reason and usage, as the log has them", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  // calculator is `allow` for the default agent: trusted, it runs inline.
  const id = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  const { page } = await lab.newPage();
  await openSession(page, server, id);
  const expected = ["note created: Session created by local with agent default"];
  await waitForOutline(page, expected, "the session's creation");

  // A thinking step, then two calls in one response, each answered inline.
  const think = "Two products; the calculator does them.";
  const ask = `/think ${think}\n/tool calculator {"expression": "6*7"}\n/tool calculator {"expression": "2*(3+4)"}`;
  await api.postMessage(id, ask);
  let log = await api.waitForIdle(id, 1);
  let turn = turns(log)[0];
  assert.equal(only(turn, "agent.thinking")[0].thinking, think, "the log's thinking");
  const calls = only(turn, "agent.tool_use", 2);
  const results = only(turn, "agent.tool_result", 2);
  assert.deepEqual(results.map(eventText), ["42", "14"], "the calculator's results in the log");
  assert.deepEqual(results.map((r) => r.tool_use_id), calls.map((c) => c.id), "each result answers its call");
  expected.push(
    `user: ${JSON.stringify(ask)}`,
    `thinking folded: ${JSON.stringify(think)}`,
    `tool ${calls[0].id} calculator {"expression":"6*7"}`,
    `  result ${results[0].id}: "42"`,
    `tool ${calls[1].id} calculator {"expression":"2*(3+4)"}`,
    `  result ${results[1].id}: "14"`,
    replyLine(turn),
    endLine(turn),
  );
  assert.equal(expected.at(-2), 'agent: "tool results: calculator=42; calculator=14"', "the reply after the calls");
  await waitForOutline(page, expected, "the first turn: thinking, two calls and their results, the reply, its end");

  // The thinking is folded: its text is in the page but not shown until the reader opens it.
  const thinking = "#conversation details.thinking";
  assert.equal(await page.isVisible(`${thinking} .thinking-text`), false, "the folded thinking's text is not shown");
  assert.equal(await page.isVisible(`${thinking} summary`), true, "the folded thinking's summary is shown");
  await lab.screenshot(page, "thinking-folded");
  await page.click(`${thinking} summary`);
  await waitFor(page, `${thinking} .thinking-text`, "the thinking's text once opened", { state: "visible" });
  assert.equal(await page.$eval(`${thinking} .thinking-text`, (el) => el.innerText.trim()), think, "the opened thinking's text");
  await lab.screenshot(page, "thinking-open");
  await page.click(`${thinking} summary`);
  await waitFor(page, `${thinking} .thinking-text`, "the thinking folded again", { state: "hidden" });

  // The model fails: the failed request, the error (code and message), the stop reason.
  await api.postMessage(id, "/error overloaded");
  log = await api.waitForIdle(id, 2);
  turn = turns(log)[1];
  const failure = only(turn, "session.error")[0];
  assert.equal(failure.code, "overloaded", `the log's session.error: ${show(failure)}`);
  expected.push(
    'user: "/error overloaded"',
    "note model-error: The request to scripted failed",
    `error ${failure.id}: overloaded: ${failure.error}`,
    endLine(turn),
  );
  assert.match(expected.at(-1), /^end error: Stopped by an error \| /, "the error turn's end");
  await waitForOutline(page, expected, "the error turn");
  await lab.screenshot(page, "error-turn");

  // The other ways a turn stops.
  for (const [n, ask, stop] of [
    [3, "/refuse", "refusal"],
    [4, "/max_tokens", "max_tokens"],
  ]) {
    await api.postMessage(id, ask);
    log = await api.waitForIdle(id, n);
    turn = turns(log)[n - 1];
    const { type, detail } = only(turn, "session.status_idle")[0].stop_reason;
    assert.deepEqual({ type, detail }, { type: "end_turn", detail: stop }, `${ask}'s stop reason on the native view`);
    expected.push(`user: ${JSON.stringify(ask)}`, replyLine(turn), endLine(turn));
    await waitForOutline(page, expected, `the ${ask} turn`);
  }
  await api.postMessage(id, "/loop");
  log = await api.waitForIdle(id, 5);
  turn = turns(log)[4];
  const loopCalls = only(turn, "agent.tool_use", 16);
  const loopResults = only(turn, "agent.tool_result", 16);
  expected.push('user: "/loop"');
  // The same call 16 times over is drawn once (×16), each repeat's result folded under it.
  loopCalls.forEach((call, i) => {
    assert.equal(loopResults[i].tool_use_id, call.id, `the /loop turn's result ${i + 1} answers call ${i + 1}`);
    if (i === 0) expected.push(`tool ${call.id} calculator [×16] {"expression":"1+1"}`, `  result ${loopResults[i].id}: "2"`);
    else expected.push(`  repeat ${call.id}: result ${loopResults[i].id}: "2"`);
  });
  expected.push(endLine(turn));
  assert.match(expected.at(-1), /^end max_turn_requests: /, "the /loop turn's end");
  await waitForOutline(page, expected, "the /loop turn: 16 calls, then max_turn_requests");

  // Every turn's end, in order, is the log's: its stop reason and its usage.
  assert.deepEqual(
    expected.filter((line) => line.startsWith("end ")),
    turns(log).map(endLine),
    "one end per turn, with its stop reason and usage",
  );
  await assertRowsMatchLog(page, log);
  await assertNothingClipped(page, "after every turn");
  await lab.screenshot(page, "all-turns");

  // Drawn again from the log in one catch-up (a reload), the conversation is the same.
  await page.reload();
  await waitFor(page, "#conn[data-state=live]", "the reloaded view to be live", { timeout: 15_000 });
  await waitForOutline(page, expected, "the reloaded conversation, drawn from the log at once");
  await assertRowsMatchLog(page, log);
  await assertNothingClipped(page, "reloaded");
  await lab.screenshot(page, "reloaded");
});

test("permissions: a call that asks is marked and its turn waits; granted, the decision and the result show under the call; denied, the denial and its error", TEST, async (t) => {
  const lab = new Lab(t);
  const pages = await pageServer(t);
  const server = await lab.startServer({ config: lab.writeConfig('[tools.fetch_url]\nallowed_hosts = ["127.0.0.1"]\n') });
  const api = new Api(server);
  // fetch_url is `ask` for the default agent: trusted or not, each call waits for a decision.
  const id = await api.createSession({ tools: [{ name: "fetch_url", trust: true }] });
  const { page } = await lab.newPage();
  await openSession(page, server, id);
  const expected = ["note created: Session created by local with agent default"];

  for (const [n, path, decision, shown] of [
    [1, "/granted", { result: "allow" }, "Allowed"],
    [3, "/denied", { result: "deny", deny_message: "not this one" }, "Denied: not this one"],
  ]) {
    // The call asks: marked as such, and its turn ends waiting for the decision.
    const ask = `/tool fetch_url {"url": "${pages.url}${path}"}`;
    await api.postMessage(id, ask);
    let log = await api.waitForIdle(id, n);
    let turn = turns(log)[n - 1];
    const call = only(turn, "agent.tool_use")[0];
    assert.equal(call.evaluated_permission, "ask", `fetch_url asks: ${show(call)}`);
    expected.push(`user: ${JSON.stringify(ask)}`, `tool ${call.id} fetch_url [needs approval] {"url":"${pages.url}${path}"}`, endLine(turn));
    assert.match(expected.at(-1), /^end requires_action: Waiting for action \| /, "the turn waits for a decision");
    await waitForOutline(page, expected, `the call of ${path} asking, its turn waiting`);
    assert.equal(await page.getAttribute(`[data-event-id="${call.id}"] .tag.permission`, "data-permission"), "ask", "the call's permission tag");
    await lab.screenshot(page, `asked-${path.slice(1)}`);

    // The decision, through the native event API: the page reads in the log's order, so
    // below the waiting turn's end a box continues the call with the decision, then the
    // result (drawn under the call only while nothing came after it).
    await postEvent(api, id, { type: "user.tool_confirmation", tool_use_id: call.id, ...decision });
    log = await api.waitForIdle(id, n + 1);
    turn = turns(log)[n];
    const confirmation = only(turn, "user.tool_confirmation")[0];
    const result = only(turn, "agent.tool_result")[0];
    assert.equal(result.tool_use_id, call.id, `the result answers the call: ${show(result)}`);
    const kind = decision.result === "allow" ? "result" : "error";
    assert.equal(result.is_error, kind === "error", `the result of a call ${decision.result}ed: ${show(result)}`);
    const under = [`  decision ${confirmation.id} ${decision.result}: ${shown}`, `  ${kind} ${result.id}: ${JSON.stringify(eventText(result))}`];
    expected.push(`tool ↳ ${call.id} fetch_url`, ...under, replyLine(turn), endLine(turn));
    await waitForOutline(page, expected, `the decision on ${path} and the result under its call, then the reply`);
    await lab.screenshot(page, `${decision.result}-${path.slice(1)}`);
  }
  const log = await api.waitForIdle(id, 4);
  assert.equal(eventText(only(turns(log)[1], "agent.tool_result")[0]), "HTTP 200\n\nthe page at /granted", "the granted call's result");
  assert.equal(eventText(only(turns(log)[3], "agent.tool_result")[0]), "Tool call denied: not this one", "the denied call's result");
  assert.deepEqual(pages.paths, ["/granted"], "only the granted call fetched its page");
  await assertRowsMatchLog(page, log);

  await page.reload();
  await waitFor(page, "#conn[data-state=live]", "the reloaded view to be live", { timeout: 15_000 });
  await waitForOutline(page, expected, "the reloaded conversation, drawn from the log at once");
  await lab.screenshot(page, "reloaded");
});

test("interrupt: the Interrupt button cancels a running turn; the page and the log both end it cancelled, and the session goes on", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession();
  const view = await lab.newPage();
  const { page } = view;
  await openSession(page, server, id);

  // A turn of 40 words at 100 ms each (4 s); interrupt it once its text is streaming.
  const slow = "/delay 100\n/words 40";
  await api.postMessage(id, slow);
  await until(
    async () => (await eventRows(page)).filter((r) => r.type === "agent.message.delta").length >= 2 && (await page.$("#conversation .msg.agent.streaming")),
    { what: "the slow reply streaming (2 agent.message.delta rows and a .msg.agent.streaming)", timeout: 15_000 },
  );
  await lab.screenshot(page, "streaming");
  const from = view.requests.length;
  await page.click("#interrupt");
  await waitFor(page, "#conversation .stop", "the turn's end on the page", { timeout: 10_000 });
  assert.equal(await page.getAttribute("#conversation .stop", "data-stop"), "cancelled", "the turn ends cancelled on the page");
  await lab.screenshot(page, "cancelled");

  // The page sent the interrupt through the native event API.
  const posts = view.requests.slice(from).filter((r) => r.method() === "POST" && new URL(r.url()).pathname === `/sessions/${id}/events`);
  assert.deepEqual(
    posts.map((r) => JSON.parse(r.postData() ?? "null")),
    [{ events: [{ type: "user.interrupt" }] }],
    "the Interrupt button posts one user.interrupt",
  );
  assert.equal(await page.$eval("#compose-error", (el) => el.textContent.trim()), "", "#compose-error after the interrupt");

  // The log: the interrupt inside the turn, then its end, cancelled, before all 40 words.
  const log = await api.waitForIdle(id, 1);
  const [turn] = turns(log);
  const interrupt = only(turn, "user.interrupt")[0];
  const idle = only(turn, "session.status_idle")[0];
  assert.deepEqual(idle.stop_reason, { type: "cancel", detail: "cancelled" }, `the turn's stop reason in the log: ${show(idle)}`);
  assert.ok(interrupt.sequence_number < idle.sequence_number, "the interrupt comes before the turn's end");
  const said = eventText(only(turn, "agent.message")[0]);
  assert.match(said, /^w1( w\d+)*$/, "the reply cut short is a run of words");
  assert.ok(words(40).startsWith(said) && said.length < words(40).length, `the reply was cut before its 40 words: ${show(said)}`);
  // The cut-short turn counts what its request was sent and streamed (the scripted model
  // reports usage only at its end): turnlog's estimate, marked so, and shown as one.
  assert.ok(idle.usage.input_tokens > 0 && idle.usage.output_tokens === Math.ceil(said.length / 4), `the usage of the cut-short turn: ${show(idle.usage)}`);
  assert.match(endLine(turn), /\| ≈ tokens: [1-9]/, "the page marks the usage as estimated");
  // What the page shows of the turn: the words said, the interrupt, the end (no failure: the
  // request was cancelled, not failed).
  await waitForOutline(
    page,
    [
      "note created: Session created by local with agent default",
      `user: ${JSON.stringify(slow)}`,
      `agent: ${JSON.stringify(said)}`,
      "note interrupt: Interrupted by the user",
      endLine(turn),
    ],
    "the interrupted turn on the page",
  );
  await assertRowsMatchLog(page, log);

  // The session takes the next message as usual.
  await api.postMessage(id, "after the interrupt");
  await waitForText(page, "#conversation .msg.agent", "echo: after the interrupt", "the reply to the next message", { timeout: 15_000 });
  const next = await api.waitForIdle(id, 2);
  assert.equal(only(turns(next)[1], "session.status_idle")[0].stop_reason.type, "end_turn", "the next turn ends as usual");
  assert.equal(count(next, "user.interrupt"), 1, "one interrupt in the log");
  await assertRowsMatchLog(page, next);
  await lab.screenshot(page, "after-interrupt");
});

test("resume: a turn whose server is SIGKILLed mid-reply goes on after the restart; the page strikes out the cut reply, notes the resume once, and shows the whole new reply", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession();
  const view = await lab.newPage();
  const { page } = view;
  await openSession(page, server, id);

  // 80 words at 60 ms each (about 5 s); the server dies once a few of them are on the page.
  const slow = "/delay 60\n/words 80";
  const reply = words(80);
  await api.postMessage(id, slow);
  const before = await waitInPage(
    page,
    () => {
      const el = document.querySelector("#conversation .msg.agent.streaming");
      return el && /^w1 w2 w3\b/.test(el.textContent) ? { messageId: el.dataset.messageId, text: el.textContent } : false;
    },
    null,
    "a growing .msg.agent.streaming with at least 3 words",
    { timeout: 15_000, polling: 10 },
  );
  // Marks the growing message's element and the document: after the restart the same
  // element must be the one struck out, in the same document (no reload).
  const marked = await page.evaluate((messageId) => {
    window.__sameDocument = true;
    const el = document.querySelector(`#conversation .msg.agent[data-message-id="${messageId}"]`);
    if (el) el.__beforeKill = true;
    return Boolean(el);
  }, before.messageId);
  assert.ok(marked, `the growing message ${before.messageId} is on the page`);
  const fromRequest = view.requests.length;
  await server.kill();
  lab.note(`killed with ${JSON.stringify(before.text)} on the page (message ${before.messageId})`);
  assert.ok(!before.text.includes("w80"), `the server was killed before the reply's last word: ${show(before.text)}`);
  await lab.screenshot(page, "killed");
  await waitFor(page, "#conn[data-state=reconnecting]", "#conn to show the lost connection", { timeout: 15_000 });

  // Same port, same data dir: the page's own EventSource finds the server again and the
  // turn goes on from its log.
  await server.start({ port: server.port });
  await waitFor(page, "#conn[data-state=live]", "the page to reconnect to the restarted server", { timeout: 30_000 });
  await waitForText(page, "#conversation .msg.agent:not(.streaming):not(.retracted)", reply, "the whole new reply after the resume", { timeout: 30_000 });

  // The log: one turn, resumed once; the cut reply discarded; its request closed as failed;
  // the new attempt's whole reply under a new message id; no error.
  const log = await api.waitForIdle(id, 1);
  const [turn, ...more] = turns(log);
  assert.deepEqual(more, [], `one turn in the log: ${show(log.map((e) => e.type))}`);
  const resumed = only(turn, "turn.resumed")[0];
  assert.equal(resumed.attempt, 1, `the first resume: ${show(resumed)}`);
  assert.deepEqual(resumed.discarded, [before.messageId], `the message cut by the kill is discarded: ${show(resumed)}`);
  assert.deepEqual([resumed.rerun ?? [], resumed.interrupted ?? []], [[], []], `no tool call ran: ${show(resumed)}`);
  const at = turn.indexOf(resumed);
  assert.deepEqual(
    turn.slice(at + 1, at + 3).map((e) => `${e.type}${e.type === "span.model_request_end" ? ` is_error=${e.is_error}` : ""}`),
    ["span.model_request_end is_error=true", "session.status_running"],
    "after turn.resumed: the cut request ends failed (a failure the page must not report), then the turn runs",
  );
  const cutText = turn
    .filter((e) => e.type === "agent.message.delta" && e.message_id === before.messageId)
    .map((e) => e.delta)
    .join("");
  assert.ok(cutText.startsWith(before.text), `the log's deltas of the cut message begin with what the page showed before the kill: ${show(cutText)} vs ${show(before.text)}`);
  assert.ok(reply.startsWith(cutText) && !cutText.includes("w80"), `the cut message is a prefix of the reply, without w80: ${show(cutText)}`);
  const final = only(turn, "agent.message")[0];
  assert.equal(eventText(final), reply, "the new attempt's whole reply in the log");
  assert.notEqual(final.message_id, before.messageId, "the new attempt is a new message");
  assert.equal(count(turn, "session.error"), 0, "no session.error");
  assert.equal(only(turn, "session.status_idle")[0].stop_reason.type, "end_turn", "the turn ends end_turn");

  // The page: the cut reply struck out (the same element, never finished), one note of the
  // resume, the new reply whole, the turn's end; no "request failed".
  const expected = [
    "note created: Session created by local with agent default",
    `user: ${JSON.stringify(slow)}`,
    `agent (retracted): ${JSON.stringify(cutText)}`,
    "note resumed: The server stopped during this turn; it goes on (resume 1) · the unfinished reply is struck out",
    replyLine(turn),
    endLine(turn),
  ];
  await waitForOutline(page, expected, "the resumed turn on the page");
  assert.equal(await page.locator("#conversation .note.resumed").count(), 1, "exactly one .note.resumed");
  assert.equal(await page.locator("#conversation .note.model-error").count(), 0, "no .note.model-error for the request the kill cut");
  assert.equal(await page.locator("#conversation .streaming").count(), 0, "nothing is left streaming");
  const struck = await page.$$eval("#conversation .msg.agent.retracted", (els) =>
    els.map((el) => ({ messageId: el.dataset.messageId, same: el.__beforeKill === true, decoration: getComputedStyle(el).textDecorationLine })),
  );
  assert.deepEqual(
    struck,
    [{ messageId: before.messageId, same: true, decoration: "line-through" }],
    "the struck-out message is the element that was growing before the kill, its text struck through",
  );
  assert.deepEqual(
    await page.$$eval("#conversation .msg.agent:not(.retracted)", (els) => els.map((el) => el.dataset.messageId)),
    [final.message_id],
    "the one reply not struck out is the final agent.message's",
  );
  assert.equal(await page.evaluate(() => window.__sameDocument === true), true, "the page followed the restart without reloading");

  // The page's EventSource came back by itself, each request resuming after the last event
  // it had (Last-Event-ID from the browser, or the page's after_id once it reopens).
  const streams = view.requests.slice(fromRequest).filter((r) => new URL(r.url()).pathname === `/sessions/${id}/events/stream`);
  const headers = await Promise.all(streams.map((r) => r.allHeaders()));
  const resumedFrom = streams.map((r, i) => headers[i]["last-event-id"] ?? new URL(r.url()).searchParams.get("after_id"));
  lab.note(`stream requests after the kill: ${show(streams.map((r, i) => `${r.url()} last-event-id=${headers[i]["last-event-id"] ?? "-"}`))}`);
  assert.ok(streams.length > 0, "the page asked for the session's stream again after the kill");
  assert.ok(
    resumedFrom.every((from) => from && log.some((e) => e.id === from)),
    `every stream request after the kill resumes after an event of the log: ${show(resumedFrom)}`,
  );
  await assertRowsMatchLog(page, log);
  await lab.screenshot(page, "resumed");

  // Drawn again from the log in one catch-up (a reload), the conversation is the same.
  await page.reload();
  await waitFor(page, "#conn[data-state=live]", "the reloaded view to be live", { timeout: 15_000 });
  await waitForOutline(page, expected, "the reloaded conversation, drawn from the log at once");
  await assertRowsMatchLog(page, log);
  await lab.screenshot(page, "reloaded");
});

test("type filter: the raw events show exactly the log's events of the type chosen, also as new ones arrive, and all again once cleared", TEST, async (t) => {
  const lab = new Lab(t);
  const server = await lab.startServer();
  const api = new Api(server);
  const id = await api.createSession({ tools: [{ name: "calculator", trust: true }] });
  await api.postMessage(id, "hello filter");
  await api.waitForIdle(id, 1);
  await api.postMessage(id, "/think briefly\nagain");
  let log = await api.waitForIdle(id, 2);
  const { page } = await lab.newPage();
  await openSession(page, server, id);
  await assertRowsMatchLog(page, log);

  // The options: all types, then each type the log has, once, sorted.
  const typesOf = (events) => [...new Set(events.map((e) => e.type))].sort();
  assert.deepEqual(await typeOptions(page), ["", ...typesOf(log)], "#type-filter offers every type in the log");
  assert.equal(await page.inputValue("#type-filter"), "", "no filter at first");

  await page.selectOption("#type-filter", "user.message");
  await waitForShown(page, log.filter((e) => e.type === "user.message"), "filtered on user.message");
  assert.equal(await page.getAttribute("#events-box", "data-count"), String(log.length), "the table still holds every event, the filtered ones undrawn");
  await lab.screenshot(page, "filter-user-message");

  // A turn while the filter is on: its new rows follow the filter; its new types join the options.
  await api.postMessage(id, '/tool calculator {"expression": "1+2"}');
  log = await api.waitForIdle(id, 3);
  await waitForRow(page, log.at(-1).id, "the new turn's last row");
  await waitForShown(page, log.filter((e) => e.type === "user.message"), "still filtered on user.message after a live turn");
  assert.deepEqual(await typeOptions(page), ["", ...typesOf(log)], "the new turn's types join #type-filter");
  assert.equal(await page.inputValue("#type-filter"), "user.message", "the filter stays as chosen");
  assert.equal(await page.getAttribute("#events-box", "data-count"), String(log.length), "the table holds every event of the log, filtered or not");
  // The filter is the raw table's: the conversation still shows every message.
  assert.deepEqual(
    await page.$$eval("#conversation .msg.user", (els) => els.map((el) => el.textContent)),
    log.filter((e) => e.type === "user.message").map(eventText),
    "the conversation is not filtered",
  );

  await page.selectOption("#type-filter", "agent.tool_result");
  await waitForShown(page, log.filter((e) => e.type === "agent.tool_result"), "filtered on agent.tool_result");
  await lab.screenshot(page, "filter-tool-result");

  await page.selectOption("#type-filter", "");
  await waitForShown(page, log, "the filter cleared");
  await assertRowsMatchLog(page, log);
  await lab.screenshot(page, "filter-cleared");
});

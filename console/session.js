// session.js: one session's view: its log read a page at a time and drawn in slices, then
// followed live; the compose box; the hash chain's check. The replay is replay.js's.

import { api, Stream } from './net.js';
import { SessionRenderer } from './render.js';
import { RawTable } from './table.js';

const $ = (id) => document.getElementById(id);

// The page draws events in slices of at most SLICE_MS of script and SLICE_ITEMS new items
// (which the browser then lays out), then lets the browser paint and take input: a long
// log loads without freezing the page.
const SLICE_MS = 8;
const SLICE_ITEMS = 20;

/** Whether the view shows a replay (replay.js) rather than the live session. */
export const inReplay = () => $('session').dataset.mode === 'replay';

// `gen` is bumped on each enter and leave, so late answers meant for another view are dropped.
// `held`: events received and not drawn yet, drawn a slice at a time (see `drain`).
export const view = { id: null, gen: 0, renderer: null, stream: null, held: [], next: 0, draining: false };

/** Shows session `id`: its log drawn, then followed live; returns what stops it. */
export function enterSession(id, eventTypes) {
  Object.assign(view, { id, eventTypes, gen: view.gen + 1, refused: false });
  Object.assign($('session').dataset, { sessionId: id, mode: 'live' });
  $('message').value = '';
  $('compose-error').textContent = '';
  $('verify-result').hidden = true;
  // One renderer and one table for the page's life (their listeners and observer once),
  // emptied for each session.
  view.renderer ??= new SessionRenderer({
    conversation: $('conversation'),
    table: new RawTable({ box: $('events-box'), body: $('events').tBodies[0], typeFilter: $('type-filter'), detail: $('event-detail') }),
  });
  view.renderer.table.forgetTypes();
  view.renderer.reset();
  view.gapAt = undefined;
  followBottom({ reset: true }); // a session opens at its end
  showHeading();
  goLive();
  return () => {
    view.gen += 1;
    stopFeeding();
  };
}

export function showHeading() {
  const title = view.renderer.title;
  $('session-title').textContent = title || view.id;
  $('session-id').textContent = title ? view.id : '';
  document.title = `${title || view.id} · turnlog`;
}

const CONN_NOTES = {
  connecting: 'Connecting to the session’s event stream…',
  reconnecting: 'The connection to the server is lost. Reconnecting every second; the page resumes from the last event it shows, and nothing is missed or shown twice.',
};

/** The stream's state, in the pill and (while it is not live) in words under the heading. */
export function setConn(state) {
  $('conn').dataset.state = state;
  $('conn').textContent = state;
  $('conn-note').textContent = CONN_NOTES[state] ?? '';
  $('conn-note').hidden = !CONN_NOTES[state];
  showControls();
}

/**
 * Enables the controls that can act now: none in a session that has ended or is archived,
 * or during a replay; Interrupt only while a turn runs; Replay once there is a log.
 */
export function showControls() {
  const renderer = view.renderer;
  const closed = !renderer || renderer.ended || renderer.archived || view.refused || inReplay();
  $('send').disabled = closed;
  $('message').disabled = closed;
  $('interrupt').disabled = closed || !renderer.running;
  $('replay-start').disabled = !renderer || view.refused || renderer.lastSeq === 0;
  $('verify').disabled = !renderer || view.refused;
}

/**
 * The newest event the page holds: drawn, or received and waiting to be drawn (an event
 * from a page of the log, or a stream frame's data, parsed when drawn).
 */
function newestHeld() {
  const last = view.next < view.held.length ? view.held.at(-1) : undefined;
  if (last === undefined) return view.renderer.lastId;
  return typeof last === 'string' ? JSON.parse(last).id : last.id;
}

/**
 * Starts (again) what feeds the view live: anything held or streaming for the view is
 * dropped (`view.live` tells a load or a slice still under way that it is no longer
 * wanted), then the log is opened from after the last event drawn.
 */
export function goLive() {
  stopFeeding();
  openLog();
}

/** Stops what feeds the view live (entering a replay). */
export function stopFeeding() {
  view.live = (view.live ?? 0) + 1;
  stopLive();
  Object.assign(view, { held: [], next: 0, draining: false, reading: false });
  loaded({ show: false });
}

/** Events read at a time when a session opens. */
const OPEN_PAGE = 500;

/**
 * Opens a session's log: what it holds so far read a page at a time, each page drawn in
 * slices as it comes, then followed live from the newest event read. A long log so arrives
 * in pieces the page draws between, not as one burst of thousands of stream frames (which
 * the browser dispatches in one task). If a page cannot be read, the stream catches up.
 *
 * A log longer than a page, opened from its start, is drawn out of sight (`loading`, then `loaded`): its
 * turns are built but not laid out or painted, nor the table's rows, a line says how far the
 * reading is, and the conversation shows once it is all drawn, at its end. Drawing
 * thousands of events in view, frame after frame, painted each turn on its way past: on
 * two cores, frames of 50-100 ms.
 */
async function openLog() {
  const { live, id } = view;
  const current = () => live === view.live;
  setConn('connecting');
  view.reading = true;
  let ended = false;
  try {
    for (let after = view.renderer.lastId; ;) {
      const params = new URLSearchParams({ limit: String(OPEN_PAGE), order: 'asc' });
      if (after) params.set('after_id', after);
      const page = await api('GET', `/sessions/${encodeURIComponent(id)}/events?${params}`);
      if (!current()) return;
      if (!after && page.has_more) loading();
      view.held.push(...page.data);
      drain();
      if (view.loading) loading(view.renderer.lastSeq + view.held.length - view.next);
      // A log that ends with `terminated` has nothing more to follow (drawing it says so).
      if (page.data.at(-1)?.type === 'terminated') {
        ended = true;
        break;
      }
      if (!page.has_more || !page.last_id || page.last_id === after) break;
      after = page.last_id;
    }
  } catch {
    if (!current()) return; // (a 401 showed the login form; a 404 the stream's refusal says)
  }
  if (!current()) return;
  view.reading = false;
  if (!view.draining) loaded();
  if (!ended) followLive();
}

/** The conversation is drawn out of sight while a long log is read (`read`: the events read so far). */
function loading(read) {
  view.loading = true;
  view.renderer.table.hold(true);
  $('conversation').dataset.loading = read ? `Reading the session’s log: ${read.toLocaleString('en-US')} events so far…` : 'Reading the session’s log…';
}

/**
 * The log is read and drawn: the conversation shows, at its end (or, with `show` false,
 * only stops being hidden: the view is left, or a replay takes it).
 */
function loaded({ show = true } = {}) {
  if (!view.loading) return;
  const box = $('conversation');
  const { renderer } = view;
  view.loading = false;
  delete box.dataset.loading;
  if (!show) return renderer.table.hold(false);
  renderer.showFromTheEnd();
  // At the end at once (a layout of the last section), before the observer looks: at the
  // top of a long last section, the sections above it would be near, and filled again.
  box.scrollTop = box.scrollHeight;
  followBottom({ reset: true });
  // The table's rows come after the conversation's first frame, not in it.
  requestAnimationFrame(() => requestAnimationFrame(() => view.loading || renderer.table.hold(false)));
}

/** Follows the log live, from after the newest event the page holds (from the start if none). */
function followLive() {
  const { id, renderer } = view;
  if (inReplay()) return;
  stopLive(); // (never two streams for one view)
  if (renderer.ended) return setConn('ended'); // the log ends with `terminated`: nothing will come
  setConn('connecting');
  view.stream = new Stream({
    // A reopened stream resumes after the newest event the page holds. Every event as
    // logged (the stream merges deltas unless told not to): the raw table shows the log
    // exactly, and the gap check in `drain` counts on it.
    url: () => {
      const after = newestHeld();
      return `/sessions/${encodeURIComponent(id)}/events/stream?delta_flush_interval_ms=0${after ? `&after_id=${encodeURIComponent(after)}` : ''}`;
    },
    types: view.eventTypes ?? [],
    raw: true,
    onEvent: (_type, data) => {
      view.held.push(data);
      drain();
    },
    onOpen: () => {
      setConn('live');
      if ($('compose-error').dataset.transient === 'true') showComposeError(null);
    },
    onError: () => setConn('reconnecting'),
    // Why was the stream refused? A session that is not there (or not the viewer's) ends
    // the view; a 401 shows the login form; anything else (a restart) is retried.
    refused: async () => {
      try {
        await api('GET', `/sessions/${encodeURIComponent(id)}/events?limit=1`);
        return true;
      } catch (error) {
        if (error.status !== 404) return error.status !== 401;
        view.refused = true;
        setConn('ended');
        $('fatal').textContent = `Session not found: ${error.message}`;
        $('fatal').hidden = false;
        return false;
      }
    },
  });
}

/** A slice of drawing begins: whether it may draw one more event (asked before each). */
export function sliceBudget() {
  const until = performance.now() + SLICE_MS;
  const items = view.renderer.drawnItems + SLICE_ITEMS;
  return () => performance.now() < until && view.renderer.drawnItems < items;
}

/**
 * Draws the events held, a slice at a time, yielding to the browser between slices (a long
 * log arrives in large chunks of events).
 */
function drain() {
  if (view.draining) return;
  view.draining = true;
  const { live } = view;
  const slice = () => {
    if (live !== view.live) return; // (whoever dropped the held events reset `draining`)
    try {
      drawSlice();
    } finally {
      // (Whatever a slice threw, the drawing goes on, or ends and shows what it drew.)
      if (view.next < view.held.length) setTimeout(slice, 0);
      else {
        view.held = [];
        view.next = 0;
        view.draining = false;
        if (!view.reading) loaded();
      }
    }
  };
  setTimeout(slice, 0);
}

/** Draws the events held, as many as a slice's budget allows. */
function drawSlice() {
  const { renderer } = view;
  const more = sliceBudget();
  let drawn = false;
  while (view.next < view.held.length && more()) {
    const held = view.held[view.next++];
    const event = typeof held === 'string' ? JSON.parse(held) : held;
    // A gap means a frame was missed (of a type this page has no listener for?): reopen
    // after the last event drawn, once per gap; if the same gap comes back, draw on.
    if (event.sequence_number > renderer.lastSeq + 1 && view.gapAt !== renderer.lastSeq) {
      view.gapAt = renderer.lastSeq;
      view.held = [];
      view.next = 0;
      followLive();
      break;
    }
    if (renderer.apply(event)) {
      drawn = true;
      if (event.type === 'session.created' || event.type === 'session.updated') showHeading();
    }
    if (event.type === 'terminated') {
      stopLive();
      setConn('ended');
    }
  }
  if (drawn) {
    showControls();
    followBottom();
  }
}

function stopLive() {
  view.stream?.close();
  view.stream = null;
}

/**
 * Keeps the conversation scrolled to its end while the reader is there. Only the reader
 * leaves the end, by scrolling (a wheel, a touch, a key, the scroll bar) away from it, and
 * comes back by scrolling to it: a scroll of the page's own (to the end, once per frame),
 * content growing below, or turns far off measured again, is never taken for the reader's.
 */
export const followBottom = (() => {
  const box = $('conversation');
  let stick = true;
  let queued = false;
  let readerUntil = 0; // scrolls until then are the reader's
  const reader = () => { readerUntil = performance.now() + 400; };
  for (const type of ['wheel', 'touchmove', 'keydown', 'pointerdown']) box.addEventListener(type, reader, { passive: true });
  let lastTop = 0;
  box.addEventListener('scroll', () => {
    const up = box.scrollTop < lastTop;
    lastTop = box.scrollTop;
    if (performance.now() > readerUntil) return;
    // Any step up leaves the end, however small; reaching the end again comes back to it.
    stick = !up && box.scrollHeight - box.scrollTop - box.clientHeight < 48;
  });
  // After the last scroll, the end is kept for SETTLE_FRAMES more frames: turns far off
  // filled again or put aside just then (the IntersectionObserver reports a frame or two
  // late) may be measured anew and move it.
  const SETTLE_FRAMES = 10;
  let settle = 0;
  const toEnd = () => {
    queued = false;
    if (!stick) return;
    box.scrollTop = box.scrollHeight;
    if (settle-- > 0) {
      queued = true;
      requestAnimationFrame(toEnd);
    }
  };
  return ({ reset = false } = {}) => {
    if (reset) stick = true;
    settle = SETTLE_FRAMES;
    if (!stick || queued) return;
    queued = true; // once per frame, however many events came
    requestAnimationFrame(toEnd);
  };
})();

$('type-filter').addEventListener('change', () => view.renderer?.table.setTypeFilter($('type-filter').value));

// ---------- Compose ----------

/**
 * Posts events to the session, showing a failure in #compose-error; true when sent. A
 * failure to reach the server is marked transient: it is cleared once the stream is back.
 */
async function postEvents(events) {
  const { gen, id } = view;
  showComposeError(null);
  try {
    await api('POST', `/sessions/${encodeURIComponent(id)}/events`, { events });
    return gen === view.gen;
  } catch (error) {
    if (gen === view.gen) showComposeError(error);
    return false;
  }
}

function showComposeError(error) {
  const box = $('compose-error');
  box.textContent = error?.message ?? '';
  // No answer, or a gateway's: the server was out of reach, not the request wrong.
  box.dataset.transient = String(error != null && (error.status === 0 || error.status >= 502));
}

async function sendMessage() {
  const text = $('message').value;
  if (!text.trim()) return;
  $('send').disabled = true;
  if (await postEvents([{ type: 'user.message', content: text }])) $('message').value = '';
  showControls();
}

$('compose').addEventListener('submit', (event) => {
  event.preventDefault();
  sendMessage();
});
$('message').addEventListener('keydown', (event) => {
  if (event.key !== 'Enter' || !(event.ctrlKey || event.metaKey)) return;
  event.preventDefault();
  sendMessage();
});
$('interrupt').addEventListener('click', () => postEvents([{ type: 'user.interrupt' }]));

// ---------- Verify: the session's hash chain, checked by the server against its events ----------

$('verify').addEventListener('click', async () => {
  const { gen, id } = view;
  const out = $('verify-result');
  Object.assign(out, { hidden: false, textContent: 'Checking the hash chain…' });
  delete out.dataset.verified;
  try {
    const chain = await api('GET', `/sessions/${encodeURIComponent(id)}/audit?verify=true`);
    if (gen !== view.gen) return;
    out.dataset.verified = String(chain.verified !== false);
    if (chain.verified === false) {
      const broken = chain.broken ?? {};
      out.textContent = `The hash chain is broken at event #${broken.sequence_number}: ${broken.what ?? 'it does not match'}`;
    } else {
      out.textContent = `Hash chain verified: ${chain.sequence_number} events, head ${chain.hash}`;
    }
  } catch (error) {
    if (gen === view.gen) out.textContent = `Could not verify: ${error.message}`;
  }
});

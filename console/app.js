// app.js: the turnlog observer console. Login, the session list, and one session's view
// (live following, replay, compose). How a session is drawn is render.js's job.

import { SessionRenderer, sessionRow } from './render.js';
import { RawTable } from './table.js';

const $ = (id) => document.getElementById(id);

const REFRESH_EVERY_MS = 5 * 60 * 1000;
const MAX_REPLAY_GAP_MS = 2000;
const RETRY_DELAYS_MS = [1000, 2000, 4000, 5000];
// The page draws events in slices of at most this long, then lets the browser paint and
// take input: a long log loads without freezing the page.
const SLICE_MS = 8;

let me = null; // whoami: {subject, admin, open, event_types}; null while logged out
let refreshTimer = 0;
let leaveRoute = null; // closes what the current route opened

// ---------- The server ----------

/** Calls the API: the parsed JSON (null for 204), or throws an Error with `status` (0: no answer). */
async function api(method, path, body) {
  const headers = {};
  // The server refuses cookie-authenticated writes without it (CSRF defence).
  if (method !== 'GET') headers['X-Turnlog-Console'] = '1';
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    throw Object.assign(new Error(`cannot reach the server (${error.message})`), { status: 0 });
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (response.ok) return data;
  if (response.status === 401 && path !== '/console/api/login') showLogin();
  const message = data?.error?.message || `${response.status} ${response.statusText}`;
  throw Object.assign(new Error(message), { status: response.status });
}

/** Asks whoami only for its side effect: a 401 shows the login form. */
function checkLogin() {
  api('GET', '/console/api/whoami').catch(() => {});
}

/**
 * An EventSource that is reopened when the browser gives up on it. While readyState is
 * CONNECTING the browser retries by itself (sending Last-Event-ID); once it is CLOSED (the
 * server answered an error, e.g. while restarting) we ask `refused()` whether to go on (a
 * session that is gone is not retried; by default: yes, after checking the login) and open
 * a new one after 1, 2, 4, then 5 s, forever until `close`. `url()` is asked again each
 * time, so it can carry a cursor. With `raw`, `onEvent` gets each frame's data unparsed
 * (a long log comes in chunks of thousands of frames, dispatched in one task: the parsing
 * is left to whoever draws them a slice at a time).
 */
class Stream {
  constructor({ url, types, onEvent, onOpen, onError, refused, raw = false }) {
    refused ??= async () => { checkLogin(); return true; };
    Object.assign(this, { url, types, onEvent, onOpen, onError, refused, raw, opens: 0, failures: 0, closed: false });
    this.connect();
  }

  connect() {
    const source = new EventSource(this.url());
    this.source = source;
    const current = () => !this.closed && source === this.source;
    for (const type of this.types) {
      source.addEventListener(type, (message) => current() && this.onEvent(type, this.raw ? message.data : JSON.parse(message.data)));
    }
    source.addEventListener('open', () => {
      if (!current()) return;
      this.failures = 0;
      this.onOpen?.(this.opens++ > 0);
    });
    source.addEventListener('error', () => {
      if (!current()) return;
      this.onError?.();
      if (source.readyState !== EventSource.CLOSED) return; // the browser is retrying
      const delay = RETRY_DELAYS_MS[Math.min(this.failures++, 3)];
      this.refused().then((again) => {
        if (again && current()) this.timer = setTimeout(() => this.connect(), delay);
      });
    });
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    this.source?.close();
  }
}

// ---------- Login ----------

function showOnly(id) {
  for (const section of ['login', 'list-view', 'session']) $(section).hidden = section !== id;
}

async function start() {
  try {
    me = await api('GET', '/console/api/whoami');
  } catch (error) {
    if (error.status !== 401) { // (401: api() showed the login form)
      $('fatal').textContent = `Cannot load the console: ${error.message}. Retrying…`;
      $('fatal').hidden = false;
      setTimeout(start, 3000);
    }
    return;
  }
  $('fatal').hidden = true;
  $('whoami').textContent = me.subject;
  $('whoami').title = me.admin ? 'admin' : '';
  $('logout').hidden = me.open;
  // The cookie lasts 30 minutes: renew it while the page is open. A 401 shows the login form.
  clearInterval(refreshTimer);
  if (!me.open) refreshTimer = setInterval(() => api('POST', '/console/api/refresh').catch(() => {}), REFRESH_EVERY_MS);
  route();
}

function showLogin() {
  leaveRoute?.();
  leaveRoute = null;
  me = null;
  clearInterval(refreshTimer);
  $('whoami').textContent = '';
  $('logout').hidden = true;
  showOnly('login');
  $('key').focus();
}

$('login').addEventListener('submit', async (event) => {
  event.preventDefault();
  // The key goes to the server once, in the body, and is kept nowhere.
  const key = $('key').value;
  $('key').value = '';
  $('login-error').textContent = '';
  $('login-submit').disabled = true;
  try {
    await api('POST', '/console/api/login', { key });
    await start();
  } catch (error) {
    $('login-error').textContent = error.message;
  } finally {
    $('login-submit').disabled = false;
  }
});

$('logout').addEventListener('click', async () => {
  await api('POST', '/console/api/logout').catch(() => {}); // logged out either way
  showLogin();
});

// ---------- Routes: #/ is the list, #/sessions/<id> a session ----------

function route() {
  if (!me) return;
  leaveRoute?.();
  $('fatal').hidden = true;
  const match = /^#\/sessions\/([^/?]+)/.exec(location.hash);
  let id = null;
  try {
    id = match && decodeURIComponent(match[1]);
  } catch {
    // a malformed address: show the list
  }
  leaveRoute = id ? enterSession(id) : enterList();
}

window.addEventListener('hashchange', route);

// ---------- The session list ----------

const list = {
  stream: null, // open while the list is shown
  next: null, // the `after` of the next page, or null
  token: 0, // bumped by each full load (and on leaving), so older answers are dropped
  pending: null, // stream changes that came while a full load was in flight
};

function enterList() {
  showOnly('list-view');
  document.title = 'Sessions · turnlog';
  loadAgents();
  list.stream = new Stream({
    url: () => '/console/api/sessions/stream',
    types: ['session', 'removed', 'resync'],
    onEvent: (type, data) => (type === 'resync' ? loadSessions() : applyChange(type, data)),
    // The stream carries only changes after it subscribes: the list is loaded again each
    // time it opens (the first time too: a session made between the first load and the
    // stream's subscription would be missed), its changes held until the load is drawn.
    onOpen: () => loadSessions(),
  });
  loadSessions();
  return () => {
    list.stream.close();
    list.stream = null;
    list.token += 1;
    list.pending = null;
  };
}

/** Fills the new session form's agents from `GET /meta` (once). */
async function loadAgents() {
  const select = $('new-agent');
  if (select.options.length) return;
  try {
    const { agents } = await api('GET', '/meta');
    for (const agent of agents) select.add(new Option(agent.title ? `${agent.title} (${agent.name})` : agent.name, agent.name));
    $('new-error').textContent = '';
  } catch (error) {
    $('new-error').textContent = `cannot list the agents: ${error.message}`;
  }
}

/** Makes a session of the chosen agent (the turn API's `POST /sessions`) and opens it. */
$('new-session').addEventListener('submit', async (event) => {
  event.preventDefault();
  $('new-error').textContent = '';
  $('new-submit').disabled = true;
  try {
    const { sessionId } = await api('POST', '/sessions', { agent: { name: $('new-agent').value } });
    location.hash = `#/sessions/${encodeURIComponent(sessionId)}`;
  } catch (error) {
    $('new-error').textContent = error.message;
  } finally {
    $('new-submit').disabled = false;
  }
});

function listFilters() {
  return { agent: $('filter-agent').value.trim(), created_by: $('filter-creator').value.trim(), status: $('filter-status').value };
}

function matchesFilters(item) {
  const { agent, created_by: creator, status } = listFilters();
  return (!agent || item.agent === agent) && (!creator || item.created_by === creator) && (!status || item.status === status);
}

/** Loads the first page (replacing the rows), or with `more` the next one. */
async function loadSessions({ more = false } = {}) {
  if (!list.stream) return;
  const token = more ? list.token : ++list.token;
  const params = new URLSearchParams(Object.entries(listFilters()).filter(([, value]) => value));
  if (more) params.set('after', list.next);
  else list.pending ??= [];
  $('more').disabled = true;
  let page = null;
  try {
    page = await api('GET', `/console/api/sessions?${params}`);
  } catch (error) {
    if (token === list.token) $('list-error').textContent = error.message;
  }
  if (token !== list.token) return;
  if (page) {
    $('list-error').textContent = '';
    if (!more) $('sessions').replaceChildren();
    for (const item of page.sessions) if (!findRow(item.id)) $('sessions').append(sessionRow(item));
    list.next = page.next ?? null;
  }
  $('more').hidden = list.next == null;
  $('more').disabled = false;
  if (!more) {
    const pending = list.pending ?? [];
    list.pending = null;
    for (const [type, data] of pending) applyChange(type, data);
  }
}

function findRow(id) {
  return $('sessions').querySelector(`[data-session-id="${CSS.escape(id)}"]`);
}

/** Newest first, as the server lists: by creation time, then id (ULIDs sort by time). */
function isNewer(item, row) {
  const [mine, theirs] = [Date.parse(item.created_at), Date.parse(row.dataset.createdAt)];
  return mine > theirs || (mine === theirs && item.id > row.dataset.sessionId);
}

/** A change from the list's stream: a session as it now is (`session`), or deleted (`removed`). */
function applyChange(type, data) {
  if (list.pending) {
    list.pending.push([type, data]); // applied once the load in flight has drawn its rows
    return;
  }
  if (type === 'removed') findRow(data.id)?.remove();
  else applySessionItem(data);
}

function applySessionItem(item) {
  const row = findRow(item.id);
  if (row) {
    // An item from before the row's last update (title, archive) is stale: ignore it.
    if (Date.parse(item.updated_at) < Date.parse(row.dataset.updatedAt)) return;
    if (matchesFilters(item)) row.replaceWith(sessionRow(item));
    else row.remove();
  } else if (matchesFilters(item)) {
    // A session new to the list goes at its place (the top, for a new one). Past the last
    // row loaded it belongs to a page not loaded yet, which #more will bring.
    const later = [...$('sessions').children].find((other) => isNewer(item, other));
    if (later) later.before(sessionRow(item));
    else if (list.next == null) $('sessions').append(sessionRow(item));
  }
}

let filterTimer = 0;
for (const id of ['filter-agent', 'filter-creator']) {
  $(id).addEventListener('input', () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(loadSessions, 250);
  });
}
$('filter-status').addEventListener('change', () => loadSessions());
$('more').addEventListener('click', () => loadSessions({ more: true }));

// ---------- A session's view ----------

// `gen` is bumped on each enter and leave, so late answers meant for another view are dropped.
// `held`: events received and not drawn yet, drawn a slice at a time (see `drain`).
const view = { id: null, gen: 0, renderer: null, stream: null, held: [], next: 0, draining: false };

function enterSession(id) {
  showOnly('session');
  Object.assign(view, { id, gen: view.gen + 1, refused: false });
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
  resetReplay();
  goLive();
  return () => {
    view.gen += 1;
    stopFeeding();
    resetReplay();
  };
}

function showHeading() {
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
function setConn(state) {
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
function showControls() {
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
function goLive() {
  view.live = (view.live ?? 0) + 1;
  stopLive();
  Object.assign(view, { held: [], next: 0, draining: false });
  openLog();
}

/** Stops what feeds the view live (entering a replay). */
function stopFeeding() {
  view.live = (view.live ?? 0) + 1;
  stopLive();
  Object.assign(view, { held: [], next: 0, draining: false });
}

/** Events read at a time when a session opens. */
const OPEN_PAGE = 500;

/**
 * Opens a session's log: what it holds so far read a page at a time, each page drawn in
 * slices as it comes, then followed live from the newest event read. A long log so arrives
 * in pieces the page draws between, not as one burst of thousands of stream frames (which
 * the browser dispatches in one task). If a page cannot be read, the stream catches up.
 */
async function openLog() {
  const { live, id } = view;
  const current = () => live === view.live;
  setConn('connecting');
  try {
    for (let after = view.renderer.lastId; ;) {
      const params = new URLSearchParams({ limit: String(OPEN_PAGE), order: 'asc' });
      if (after) params.set('after_id', after);
      const page = await api('GET', `/sessions/${encodeURIComponent(id)}/events?${params}`);
      if (!current()) return;
      view.held.push(...page.data);
      drain();
      // A log that ends with `terminated` has nothing more to follow (drawing it says so).
      if (page.data.at(-1)?.type === 'terminated') return;
      if (!page.has_more || !page.last_id || page.last_id === after) break;
      after = page.last_id;
    }
  } catch {
    if (!current()) return; // (a 401 showed the login form; a 404 the stream's refusal says)
  }
  if (current()) followLive();
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
    types: me.event_types ?? [],
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

/**
 * Draws the events held, a slice of at most SLICE_MS at a time, yielding to the browser
 * between slices (a long log arrives in large chunks of events).
 */
function drain() {
  if (view.draining) return;
  view.draining = true;
  const { live } = view;
  const slice = () => {
    if (live !== view.live) return; // (whoever dropped the held events reset `draining`)
    const { renderer } = view;
    const until = performance.now() + SLICE_MS;
    let drawn = false;
    while (view.next < view.held.length && performance.now() < until) {
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
    if (view.next < view.held.length) setTimeout(slice, 0);
    else {
      view.held = [];
      view.next = 0;
      view.draining = false;
    }
  };
  setTimeout(slice, 0);
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
const followBottom = (() => {
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
  return ({ reset = false } = {}) => {
    if (reset) stick = true;
    if (!stick || queued) return;
    queued = true; // once per frame, however many events came
    requestAnimationFrame(() => {
      queued = false;
      if (stick) box.scrollTop = box.scrollHeight;
    });
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

// ---------- Replay: the log from GET (every page), drawn by the same renderer ----------

const replay = {
  gen: 0, // bumped on start, exit and leave: a load that finishes later is dropped
  events: null, // the whole log, once loaded
  pos: 0, // how many of them are drawn
  playing: false,
  timer: 0,
  nextAt: 0, // the performance.now() at which events[pos] is due
};

const inReplay = () => $('session').dataset.mode === 'replay';

async function startReplay() {
  if (inReplay()) return;
  stopFeeding();
  setConn('ended');
  $('session').dataset.mode = 'replay';
  const gen = ++replay.gen;
  $('replay-status').textContent = 'loading the log…';
  try {
    const events = await loadLog(view.id);
    if (gen !== replay.gen) return;
    $('replay-status').textContent = '';
    Object.assign(replay, { events, pos: 0 });
    view.renderer.reset();
    followBottom({ reset: true });
    seek(0);
  } catch (error) {
    if (gen === replay.gen) $('replay-status').textContent = error.message;
  }
}

async function loadLog(id) {
  const events = [];
  for (let after = null; ;) {
    const params = new URLSearchParams({ limit: '1000', order: 'asc' });
    if (after) params.set('after_id', after);
    const page = await api('GET', `/sessions/${encodeURIComponent(id)}/events?${params}`);
    events.push(...page.data);
    if (!page.has_more || !page.last_id || page.last_id === after) return events;
    after = page.last_id;
  }
}

/** Back to live: the view is drawn again from the log's start, as when it opened. */
function exitReplay() {
  if (!inReplay()) return;
  resetReplay();
  $('session').dataset.mode = 'live';
  view.renderer.reset();
  followBottom({ reset: true });
  goLive();
}

function resetReplay() {
  pause();
  Object.assign(replay, { gen: replay.gen + 1, events: null, pos: 0, target: 0, seeking: false });
  $('replay-status').textContent = '';
  showReplayPosition();
}

/**
 * Draws the session up to `n` events: onwards from where it is, or again from the start;
 * a slice of at most SLICE_MS at a time (a long way is drawn over several frames).
 */
function seek(n) {
  if (!replay.events) return;
  replay.target = Math.max(0, Math.min(n, replay.events.length));
  if (replay.target < replay.pos) {
    view.renderer.reset();
    replay.pos = 0;
  }
  if (replay.seeking) return;
  replay.seeking = true;
  const { gen } = replay;
  const slice = () => {
    if (gen !== replay.gen || !replay.events) return;
    const until = performance.now() + SLICE_MS;
    while (replay.pos < replay.target && performance.now() < until) view.renderer.apply(replay.events[replay.pos++]);
    showHeading();
    showReplayPosition();
    followBottom();
    if (replay.pos < replay.target) setTimeout(slice, 0);
    else replay.seeking = false;
  };
  slice();
}

function showReplayPosition() {
  const loaded = replay.events != null;
  const total = replay.events?.length ?? 0;
  Object.assign($('replay-scrub'), { max: String(total), value: String(replay.pos) });
  for (const id of ['replay-scrub', 'replay-play', 'replay-pause']) $(id).disabled = !loaded;
  $('replay-position').textContent = `${replay.pos} / ${total}`;
  if (loaded && replay.pos >= total) $('replay').dataset.done = 'true';
  else delete $('replay').dataset.done;
  $('replay').dataset.playing = String(replay.playing);
}

const speed = () => ($('replay-speed').value === 'max' ? Infinity : Number($('replay-speed').value) || 1);

/** How long to wait before drawing event i: its created_at gap, cut to 2 s, over the speed. */
function delayBefore(i) {
  if (i === 0 || i >= replay.events.length) return 0;
  const gap = Date.parse(replay.events[i].created_at) - Date.parse(replay.events[i - 1].created_at);
  return gap > 0 ? Math.min(gap, MAX_REPLAY_GAP_MS) / speed() : 0;
}

function play() {
  if (!replay.events || replay.playing) return;
  if (replay.pos >= replay.events.length) seek(0); // at the end: play again from the start
  replay.playing = true;
  replay.nextAt = performance.now() + delayBefore(replay.pos);
  tick();
}

function pause() {
  replay.playing = false;
  clearTimeout(replay.timer);
  showReplayPosition();
}

// Draws every event that is due, then sleeps until the next one is. Due times add up from
// `nextAt` (not from when the timer fired), so a late timer catches up instead of slowing
// the replay. At `max` it draws for SLICE_MS at a time, then yields so the page can paint.
function tick() {
  if (!replay.playing) return;
  const { events } = replay;
  const fastest = speed() === Infinity;
  const now = performance.now();
  while (replay.pos < events.length && (fastest ? performance.now() < now + SLICE_MS : replay.nextAt <= now)) {
    view.renderer.apply(events[replay.pos++]);
    replay.nextAt += delayBefore(replay.pos);
  }
  showHeading();
  followBottom();
  if (replay.pos >= events.length) {
    followBottom();
    return pause(); // pause() shows data-done
  }
  showReplayPosition();
  replay.timer = setTimeout(tick, fastest ? 0 : Math.max(0, replay.nextAt - performance.now()));
}

$('replay-start').addEventListener('click', startReplay);
$('replay-exit').addEventListener('click', exitReplay);
$('replay-play').addEventListener('click', play);
$('replay-pause').addEventListener('click', pause);
$('replay-speed').addEventListener('change', () => {
  if (!replay.playing) return;
  clearTimeout(replay.timer); // the new pace starts from the next event
  replay.nextAt = performance.now() + delayBefore(replay.pos);
  tick();
});
for (const type of ['input', 'change']) {
  $('replay-scrub').addEventListener(type, () => {
    const target = Number($('replay-scrub').value); // read first: pause() redraws the input
    pause();
    seek(target);
  });
}

start();

// replay.js: a session's replay: its whole log read with GET (every page), drawn by the
// session view's renderer up to a position, or played at a pace.

import { api } from './net.js';
import { followBottom, goLive, inReplay, setConn, showHeading, sliceBudget, stopFeeding, view } from './session.js';

const $ = (id) => document.getElementById(id);

const MAX_REPLAY_GAP_MS = 2000;

const replay = {
  gen: 0, // bumped on start, exit and leave: a load that finishes later is dropped
  events: null, // the whole log, once loaded
  pos: 0, // how many of them are drawn
  playing: false,
  timer: 0,
  nextAt: 0, // the performance.now() at which events[pos] is due
};

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

/** Stops and forgets a replay (another session, or none). */
export function resetReplay() {
  pause();
  Object.assign(replay, { gen: replay.gen + 1, events: null, pos: 0, target: 0, seeking: false });
  $('replay-status').textContent = '';
  showReplayPosition();
}

/**
 * Draws the session up to `n` events: onwards from where it is, or again from the start;
 * a slice at a time (a long way is drawn over several frames).
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
    const more = sliceBudget();
    while (replay.pos < replay.target && more()) view.renderer.apply(replay.events[replay.pos++]);
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
// the replay. At `max` it draws a slice at a time, yielding so the page can paint.
function tick() {
  if (!replay.playing) return;
  const { events } = replay;
  const fastest = speed() === Infinity;
  const now = performance.now();
  const more = sliceBudget();
  while (replay.pos < events.length && (fastest ? more() : replay.nextAt <= now)) {
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

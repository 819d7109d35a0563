// table.js: the raw events table. A log may hold tens of thousands of events, so the table
// is windowed: every row has one height, and only the rows in view (and a few around them)
// are in the page, between two spacers that keep the scroll height of them all. A row's
// whole event shows below the table when its row is clicked.
//
// The keyboard reaches every row: one row at a time takes focus (Tab), the arrows, Page
// Up/Down, Home and End move it, Enter or Space shows its event, and `c` copies its id.

import { h } from './render.js';

const ROW_HEIGHT = 24; // px: style.css gives #events rows this height
const AROUND = 16; // rows drawn above and below those in view
const BOX_HEIGHT = 480; // px: style.css's max-height of #events-box, the most rows in view
const ROWS_PER_DRAW = 12; // new rows a frame's draw adds at most (see `draw`)

/** A row that stands for `rows` rows not drawn (its height is set by `setHeight`). */
const spacer = () => h('tr', { class: 'spacer', 'aria-hidden': 'true' }, h('td', { colspan: 5 }));

/** A spacer's height: `rows` rows'. (The CSSOM: the page's CSP refuses style attributes.) */
function setHeight(tr, rows) { tr.style.height = `${rows * ROW_HEIGHT}px`; }

const timeFormat = new Intl.DateTimeFormat(undefined, {
  hour: '2-digit', minute: '2-digit', second: '2-digit', fractionalSecondDigits: 3, hour12: false,
});

// The fields every event has; the one-line preview leaves them out.
const ENVELOPE = new Set([
  'id', 'type', 'session_id', 'sequence_number', 'created_at', 'processed_at',
  'schema_version', 'turn_id', 'turn_sequence_number',
]);

function preview(event) {
  const own = JSON.stringify(Object.fromEntries(Object.entries(event).filter(([name]) => !ENVELOPE.has(name))));
  return own.length > 140 ? `${own.slice(0, 139)}…` : own;
}

function time(iso) {
  const at = Date.parse(iso);
  return Number.isNaN(at) ? String(iso ?? '') : timeFormat.format(at);
}

/** An event id as a cell shows it: its kind and its last, distinct characters. */
function shortId(id) {
  return id.length > 20 ? `${id.slice(0, 4)}…${id.slice(-14)}` : id;
}

export class RawTable {
  /**
   * `box` scrolls (its `data-count` and `data-last-id` say what the table holds), `body` is
   * the table's tbody, `typeFilter` the type select, `detail` where a row's event shows.
   */
  constructor({ box, body, typeFilter, detail }) {
    Object.assign(this, { box, body, typeFilter, detail });
    this.queued = false;
    box.addEventListener('scroll', () => this.schedule());
    body.addEventListener('click', (click) => this.clicked(click));
    body.addEventListener('keydown', (key) => this.key(key));
    body.addEventListener('focusin', (focus) => {
      const row = focus.target.closest('tr[data-seq]');
      if (row) this.focusRow(row.dataset.eventId, false);
    });
    this.forgetTypes();
    this.reset();
  }

  /** Forgets the types seen and the filter (another session). */
  forgetTypes() {
    this.typeFilter.replaceChildren(h('option', { value: '' }, 'all types'));
    this.filter = '';
    this.types = new Set();
  }

  /** Forgets every event (the type filter and its options stay). */
  reset() {
    this.box.scrollTop = 0;
    this.all = [];
    this.shown = []; // the events the filter lets through, in log order
    this.drawn = null; // [first, last) of `shown` in the page
    this.open = null; // the event whose whole JSON shows
    this.current = null; // the id of the row the keyboard is on (Tab stops there)
    this.detail.replaceChildren();
    this.detail.hidden = true;
    this.body.replaceChildren();
    this.mark();
  }

  add(event) {
    if (!this.types.has(event.type)) this.addType(event.type);
    this.all.push(event);
    if (this.passes(event.type)) this.shown.push(event);
    this.mark();
    this.schedule();
  }

  /** Shows only the events of one type ('' for all). */
  setTypeFilter(type) {
    this.filter = type;
    this.shown = this.all.filter((event) => this.passes(event.type));
    this.drawn = null;
    this.box.scrollTop = 0;
    this.mark();
    this.schedule();
  }

  passes(type) { return this.filter === '' || type === this.filter; }

  addType(type) {
    this.types.add(type);
    const next = [...this.typeFilter.options].find((option) => option.value > type);
    this.typeFilter.insertBefore(h('option', { value: type }, type), next ?? null);
  }

  mark() {
    this.box.dataset.count = String(this.all.length);
    this.box.dataset.shown = String(this.shown.length);
    this.box.dataset.lastId = this.all.at(-1)?.id ?? '';
  }

  /** Holds the table's drawing (its events are still taken), or lets it draw again. */
  hold(on) {
    this.held = on;
    if (!on) this.schedule();
  }

  /** Draws the rows in view at the next frame (once, however many events came), unless held. */
  schedule() {
    if (this.queued || this.held) return;
    this.queued = true;
    requestAnimationFrame(() => {
      this.queued = false;
      if (!this.held) this.draw();
    });
  }

  /**
   * Draws the rows in view and AROUND rows on each side, reusing the rows already in the
   * page. The rows the reader can see (in the box's view and in the window) are drawn at
   * once; of the others, a scheduled draw (`all` false) adds at most ROWS_PER_DRAW and
   * leaves the rest to the next frames. A table's first rows, below a long conversation
   * that is opening, so cost a few rows a frame, not one long frame.
   */
  draw({ all = false } = {}) {
    // (The box grows with its rows up to its max-height, which bounds its view.)
    const view = Math.max(this.box.clientHeight, Math.min(BOX_HEIGHT, window.innerHeight));
    const top = this.box.scrollTop;
    const count = this.shown.length;
    const inView = Math.ceil(view / ROW_HEIGHT);
    // (Never past the rows there are: a box scrolled further than fewer rows reach draws the last ones.)
    const viewFirst = Math.max(0, Math.min(Math.floor(top / ROW_HEIGHT), count - inView));
    const viewLast = Math.min(count, Math.ceil((top + view) / ROW_HEIGHT));
    const first = Math.max(0, viewFirst - AROUND);
    const last = Math.min(count, viewLast + AROUND);
    // The rows of the view inside the window (none while the box is below it).
    const box = this.box.getBoundingClientRect();
    const seen = (y) => Math.min(viewLast, Math.max(viewFirst, Math.floor((top + y) / ROW_HEIGHT)));
    const seenFirst = seen(Math.max(0, -box.top));
    const seenLast = Math.max(seenFirst, seen(Math.min(view, window.innerHeight - box.top) + ROW_HEIGHT - 1));
    const focused = this.body.contains(document.activeElement);
    let [from, to] = this.drawn ?? [0, 0];
    if (!this.drawn || to <= first || from >= last) {
      // Nothing drawn is wanted: start again, from the rows seen.
      this.body.replaceChildren(spacer(), spacer());
      from = to = seenFirst;
    }
    // The rows no longer wanted go; the page keeps [from, to) between its two spacers.
    for (; from < first; from += 1) this.body.firstElementChild.nextElementSibling.remove();
    for (; to > last; to -= 1) this.body.lastElementChild.previousElementSibling.remove();
    // New rows: those seen first (whatever the budget), then the rest of the view, then the rows around it.
    let budget = all ? Infinity : ROWS_PER_DRAW;
    const down = (until, free = false) => {
      const rows = [];
      for (; to < until && (free || budget > 0); to += 1, budget -= 1) rows.push(this.row(this.shown[to]));
      this.body.lastElementChild.before(...rows);
    };
    const up = (until, free = false) => {
      const rows = [];
      for (; from > until && (free || budget > 0); from -= 1, budget -= 1) rows.unshift(this.row(this.shown[from - 1]));
      this.body.firstElementChild.after(...rows);
    };
    if (from === to) from = to = seenFirst; // (none left: start from the rows seen)
    down(seenLast, true);
    up(seenFirst, true);
    down(viewLast);
    up(viewFirst);
    down(last);
    up(first);
    this.drawn = [from, to];
    setHeight(this.body.firstElementChild, from);
    setHeight(this.body.lastElementChild, count - to);
    if (from > first || to < last) this.schedule(); // (the rest at the next frame)
    // One row takes Tab: the keyboard's row if drawn, else the first in view.
    const rows = this.body.querySelectorAll('tr[data-seq]');
    const current = [...rows].find((tr) => tr.dataset.eventId === this.current) ?? rows[viewFirst - from] ?? rows[0];
    for (const tr of this.body.querySelectorAll('tr[tabindex="0"]')) if (tr !== current) tr.setAttribute('tabindex', '-1');
    current?.setAttribute('tabindex', '0');
    // (A focused row scrolled out of the window hands the focus to the row that takes Tab.)
    if (focused && current && !this.body.contains(document.activeElement)) this.focusRow(current.dataset.eventId, true);
  }

  row(event) {
    return h('tr', {
      'data-event-id': event.id, 'data-seq': event.sequence_number, 'data-type': event.type,
      class: this.open === event ? 'open' : null, tabindex: '-1',
    },
    h('td', { class: 'seq' }, String(event.sequence_number)),
    h('td', { class: 'id', title: `${event.id} (click to copy)` }, shortId(event.id)),
    h('td', { class: 'type' }, event.type),
    h('td', { class: 'time', title: event.created_at }, time(event.created_at)),
    h('td', { class: 'json' }, preview(event)));
  }

  /** A click on an id copies it; on the rest of a row, shows (or hides) its event. */
  clicked(click) {
    const row = click.target.closest('tr[data-seq]');
    if (!row) return;
    const event = this.shown.find((e) => e.id === row.dataset.eventId);
    if (!event) return;
    if (click.target.closest('td.id')) this.copy(row, event);
    else this.toggle(event);
  }

  copy(row, event) {
    navigator.clipboard?.writeText(event.id).then(() => { row.dataset.copied = 'true'; }, () => {});
  }

  /** A key on a row: moves the keyboard's row, shows its event, or copies its id. */
  key(key) {
    const row = key.target.closest('tr[data-seq]');
    if (!row || key.altKey || key.ctrlKey || key.metaKey) return;
    const at = this.shown.findIndex((e) => e.id === row.dataset.eventId);
    if (at < 0) return;
    const page = Math.max(1, Math.floor(this.box.clientHeight / ROW_HEIGHT) - 1);
    const to = { ArrowDown: at + 1, ArrowUp: at - 1, PageDown: at + page, PageUp: at - page, Home: 0, End: this.shown.length - 1 }[key.key];
    if (to !== undefined) {
      key.preventDefault();
      this.moveTo(Math.max(0, Math.min(to, this.shown.length - 1)));
    } else if (key.key === 'Enter' || key.key === ' ') {
      key.preventDefault();
      this.toggle(this.shown[at]);
    } else if (key.key.toLowerCase() === 'c') {
      this.copy(row, this.shown[at]);
    }
  }

  /** Puts the keyboard on row `index` of those shown: scrolled into view, drawn, focused. */
  moveTo(index) {
    const top = index * ROW_HEIGHT;
    const header = this.body.parentNode.tHead?.offsetHeight ?? 0;
    if (top < this.box.scrollTop) this.box.scrollTop = top;
    else if (top + ROW_HEIGHT + header > this.box.scrollTop + this.box.clientHeight) this.box.scrollTop = top + ROW_HEIGHT + header - this.box.clientHeight;
    // (In view in the box now; the page scrolls too if the box is partly out of the window.)
    this.focusRow(this.shown[index].id, true)?.scrollIntoView({ block: 'nearest' });
  }

  /** The keyboard's row is `id`; focused now if `focus` (drawn first if it is not). Returns the row, if drawn. */
  focusRow(id, focus) {
    this.current = id;
    for (const tr of this.body.querySelectorAll('tr[tabindex="0"]')) if (tr.dataset.eventId !== id) tr.setAttribute('tabindex', '-1');
    let row = this.body.querySelector(`tr[data-event-id="${CSS.escape(id)}"]`);
    if (!row && focus) {
      this.draw({ all: true });
      row = this.body.querySelector(`tr[data-event-id="${CSS.escape(id)}"]`);
    }
    row?.setAttribute('tabindex', '0');
    if (focus) row?.focus({ preventScroll: true });
    return row;
  }

  /** Shows `event` whole below the table, or hides it if it shows. */
  toggle(event) {
    const rowOf = (e) => e && this.body.querySelector(`tr[data-event-id="${CSS.escape(e.id)}"]`);
    rowOf(this.open)?.classList.remove('open');
    this.open = this.open === event ? null : event;
    rowOf(this.open)?.classList.add('open');
    this.detail.hidden = this.open == null;
    this.detail.replaceChildren();
    if (this.open) {
      this.detail.append(
        h('div', { class: 'detail-head' }, `#${event.sequence_number} · `, h('code', {}, event.id), ` · ${event.type}`),
        h('pre', {}, JSON.stringify(event, null, 2)));
    }
  }
}

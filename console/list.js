// list.js: the session list: newest first, a page at a time, filtered, and kept current
// by the list's stream; and the form that makes a session.

import { api, Stream } from './net.js';
import { sessionRow } from './render.js';

const $ = (id) => document.getElementById(id);

const list = {
  stream: null, // open while the list is shown
  next: null, // the `after` of the next page, or null
  token: 0, // bumped by each full load (and on leaving), so older answers are dropped
  pending: null, // stream changes that came while a full load was in flight
};

/** Shows the list, kept current by its stream; returns what closes them. */
export function enterList() {
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

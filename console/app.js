// app.js: the turnlog observer console: login, and the routes (#/ is the session list,
// #/sessions/<id> a session). The list is list.js's, a session's view session.js's, its
// replay replay.js's, how a session is drawn render.js's.

import { enterList } from './list.js';
import { api, onSignedOut } from './net.js';
import { resetReplay } from './replay.js';
import { enterSession } from './session.js';

const $ = (id) => document.getElementById(id);

const REFRESH_EVERY_MS = 5 * 60 * 1000;

let me = null; // whoami: {subject, admin, open, event_types}; null while logged out
let refreshTimer = 0;
let leaveRoute = null; // closes what the current route opened

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
  // The view is set up (emptied, scrolled to its top) while it is still hidden, then shown:
  // set up once shown, its scroll reset forced the whole page's layout inside this task,
  // a task of 40-75 ms on opening a session.
  leaveRoute = id ? openSession(id) : enterList();
  showOnly(id ? 'session' : 'list-view');
}

window.addEventListener('hashchange', route);

/** A session's view, live; leaving it ends any replay too. */
function openSession(id) {
  resetReplay();
  const leave = enterSession(id, me.event_types);
  return () => {
    leave();
    resetReplay();
  };
}

onSignedOut(showLogin);
start();

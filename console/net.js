// net.js: how the console talks to the server: its API over fetch, and event streams
// that reopen themselves.

const RETRY_DELAYS_MS = [1000, 2000, 4000, 5000];

let signedOut = () => {};

/** Calls `fn` whenever the server answers 401 (the login lapsed, or was never made). */
export function onSignedOut(fn) {
  signedOut = fn;
}

/** Calls the API: the parsed JSON (null for 204), or throws an Error with `status` (0: no answer). */
export async function api(method, path, body) {
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
  if (response.status === 401 && path !== '/console/api/login') signedOut();
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
export class Stream {
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

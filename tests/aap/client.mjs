// A plain-JS port of the official AAP v3 client, for turnlog's conformance tests.
//
// Mirrors: npm @agentapplicationprotocol/client 0.8.0
//   source: github.com/agentapplicationprotocol/typescript-sdk, packages/client/src/client.ts
//   (tag v0.8.0, 2026-04-23). The scope is E404 on the npm registry reachable here, so this
//   file reproduces its wire behaviour instead (see ../../../shared/reference/CLIENTS.md §3):
//   - headers on every request: Content-Type: application/json, Authorization: Bearer <key>;
//     streaming calls add Accept: text/event-stream;
//   - a non-2xx answer throws ClientError(method, path, status, text), except that
//     404 -> undefined on getSessions/getSession/getSessionHistory/deleteSession/postSessionTurn;
//     204 -> undefined;
//   - no response validation, except getMeta() throws unless version === 3;
//   - SSE is parsed with eventsource-parser v3: each frame becomes { event, ...JSON.parse(data) }
//     (a data-level "event" key overrides the event: line), comments are ignored, and a
//     non-JSON data: line throws out of the iterator. id:/retry: are ignored; no reconnect.
// Deliberately no extra checks, retries or conveniences: this is a strict wire probe.
// The zod types and the Session / resolvePendingToolUse helpers are not ported.

import { createParser } from "eventsource-parser";

export const PROTOCOL_VERSION = 3;

export class ClientError extends Error {
  constructor(method, path, status, message) {
    super(`AAP ${method} ${path} → ${status}: ${message}`);
    this.name = "ClientError";
    this.method = method;
    this.path = path;
    this.status = status;
    // Not on the upstream class (there it is only inside `message`); kept for assertions.
    this.text = message;
  }
}

export class Client {
  constructor({ baseUrl, apiKey }) {
    this.baseUrl = baseUrl.replace(/\/$/, "");
    this.headers = {
      "Content-Type": "application/json",
      Authorization: `Bearer ${apiKey}`,
    };
  }

  url(path) {
    return `${this.baseUrl}${path}`;
  }

  // JSON request. With allow404, a 404 answer resolves to undefined.
  async request(method, path, body, allow404 = false) {
    const res = await fetch(this.url(path), {
      method,
      headers: this.headers,
      body: body !== undefined ? JSON.stringify(body) : undefined,
    });
    if (allow404 && res.status === 404) return undefined;
    if (!res.ok) {
      const text = await res.text().catch(() => res.statusText);
      throw new ClientError(method, path, res.status, text);
    }
    if (res.status === 204) return undefined;
    return res.json();
  }

  // SSE request: resolves to an async iterable of events (404 -> undefined).
  async streamRequest(method, path, body) {
    const res = await fetch(this.url(path), {
      method,
      headers: { ...this.headers, Accept: "text/event-stream" },
      body: JSON.stringify(body),
    });
    if (res.status === 404) return undefined;
    if (!res.ok || !res.body) {
      const text = await res.text().catch(() => res.statusText);
      throw new ClientError(method, path, res.status, text);
    }
    return parseSSE(res.body);
  }

  /** GET /meta */
  async getMeta() {
    const meta = await this.request("GET", "/meta");
    if (meta.version !== PROTOCOL_VERSION) {
      throw new Error(`Protocol version mismatch: expected ${PROTOCOL_VERSION}, got ${meta.version}`);
    }
    return meta;
  }

  /** GET /sessions[?after=] -> { sessions, next? } */
  getSessions(params) {
    let path = "/sessions";
    if (params?.after) {
      path += "?" + new URLSearchParams({ after: params.after }).toString();
    }
    return this.request("GET", path, undefined, true);
  }

  /** GET /sessions/:id -> { sessionId, agent, tools? } */
  getSession(sessionId) {
    return this.request("GET", `/sessions/${sessionId}`, undefined, true);
  }

  /** GET /sessions/:id/history?type=full|compacted -> { history: { full?|compacted? } } */
  getSessionHistory(sessionId, type) {
    return this.request(
      "GET",
      `/sessions/${sessionId}/history?${new URLSearchParams({ type }).toString()}`,
      undefined,
      true,
    );
  }

  /** POST /sessions -> { sessionId } (any 2xx; 201 expected) */
  postSessions(req) {
    return this.request("POST", "/sessions", req);
  }

  /**
   * POST /sessions/:id/turns.
   * stream "delta" | "message": AsyncIterable of SSE events; otherwise { stopReason, messages }.
   */
  postSessionTurn(sessionId, req) {
    if (req.stream === "delta" || req.stream === "message") {
      return this.streamRequest("POST", `/sessions/${sessionId}/turns`, req);
    }
    return this.request("POST", `/sessions/${sessionId}/turns`, req, true);
  }

  /** DELETE /sessions/:id (204 or 404 -> undefined) */
  deleteSession(sessionId) {
    return this.request("DELETE", `/sessions/${sessionId}`, undefined, true);
  }
}

async function* parseSSE(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const queue = [];

  const parser = createParser({
    onEvent({ event, data }) {
      // Throws SyntaxError on non-JSON data; it propagates out of feed() and the iterator.
      queue.push({ event, ...JSON.parse(data) });
    },
  });

  try {
    while (true) {
      const { done, value } = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      while (queue.length > 0) yield queue.shift();
    }
  } finally {
    reader.releaseLock();
  }
}

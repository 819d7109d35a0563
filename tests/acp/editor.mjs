// The editor side of the ACP tests: what an editor does for its agent's `fs/*` and
// `terminal/*` requests, on a real directory and real processes (no fakes), registered on the
// official client (@agentclientprotocol/sdk) as an editor registers its own handlers. Every
// request is recorded in `requests`, in order, for the tests to check.

import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import * as acp from "@agentclientprotocol/sdk";

const m = acp.methods;

export class Editor {
  /** An editor whose workspace is `root` (the agent's cwd). */
  constructor(root) {
    this.root = root;
    this.requests = []; // {method, params}
    this.terminals = new Map(); // id -> {child, output, truncated, limit, exit: Promise, exitStatus, released}
    this.next = 0;
  }

  capabilities() {
    return { fs: { readTextFile: true, writeTextFile: true }, terminal: true };
  }

  /** Registers the handlers on an SDK client app. */
  register(app) {
    const on = (method, handler) =>
      app.onRequest(method, async ({ params }) => {
        this.requests.push({ method, params });
        return handler(params);
      });
    on(m.client.fs.readTextFile, (p) => this.read(p));
    on(m.client.fs.writeTextFile, (p) => this.write(p));
    on(m.client.terminal.create, (p) => this.create(p));
    on(m.client.terminal.output, (p) => this.output(p));
    on(m.client.terminal.waitForExit, (p) => this.waitForExit(p));
    on(m.client.terminal.kill, (p) => this.kill(p));
    on(m.client.terminal.release, (p) => this.release(p));
    return app;
  }

  /** The requests of one method, in order. */
  of(method) {
    return this.requests.filter((r) => r.method === method).map((r) => r.params);
  }

  file(name) {
    return fs.readFileSync(path.join(this.root, name), "utf8");
  }

  absolute(p) {
    if (!path.isAbsolute(p)) throw acp.RequestError.invalidParams({ path: p }, "paths must be absolute");
    return p;
  }

  read({ path: p, line, limit }) {
    let text;
    try {
      text = fs.readFileSync(this.absolute(p), "utf8");
    } catch (e) {
      if (e.code === "ENOENT") throw acp.RequestError.resourceNotFound(p);
      throw e;
    }
    if (line == null && limit == null) return { content: text };
    const lines = text.split(/(?<=\n)/);
    const from = (line ?? 1) - 1;
    return { content: lines.slice(from, limit == null ? undefined : from + limit).join("") };
  }

  write({ path: p, content }) {
    fs.writeFileSync(this.absolute(p), content);
    return {};
  }

  create({ command, args = [], cwd, outputByteLimit }) {
    const id = `term-${++this.next}`;
    const child = spawn(command, args, { cwd: cwd ?? this.root, stdio: ["ignore", "pipe", "pipe"] });
    const terminal = { child, output: "", truncated: false, limit: outputByteLimit ?? Infinity, exitStatus: null, released: false };
    const keep = (chunk) => {
      terminal.output += chunk.toString("utf8");
      const bytes = Buffer.byteLength(terminal.output);
      if (bytes > terminal.limit) {
        terminal.output = Buffer.from(terminal.output).subarray(bytes - terminal.limit).toString("utf8");
        terminal.truncated = true;
      }
    };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    terminal.exit = new Promise((resolve) => {
      child.once("error", (e) => {
        keep(`${e.message}\n`);
        terminal.exitStatus = { exitCode: 127, signal: null };
        resolve(terminal.exitStatus);
      });
      child.once("close", (code, signal) => {
        terminal.exitStatus = { exitCode: code, signal };
        resolve(terminal.exitStatus);
      });
    });
    this.terminals.set(id, terminal);
    return { terminalId: id };
  }

  terminal(id) {
    const terminal = this.terminals.get(id);
    if (!terminal || terminal.released) throw acp.RequestError.invalidParams({ terminalId: id }, "no such terminal");
    return terminal;
  }

  output({ terminalId }) {
    const t = this.terminal(terminalId);
    return { output: t.output, truncated: t.truncated, ...(t.exitStatus ? { exitStatus: t.exitStatus } : {}) };
  }

  async waitForExit({ terminalId }) {
    return this.terminal(terminalId).exit;
  }

  kill({ terminalId }) {
    this.terminal(terminalId).child.kill("SIGKILL");
    return {};
  }

  release({ terminalId }) {
    const t = this.terminal(terminalId);
    if (t.exitStatus === null) t.child.kill("SIGKILL");
    t.released = true;
    return {};
  }

  /** Terminals whose process is still running. */
  running() {
    return [...this.terminals.values()].filter((t) => t.exitStatus === null);
  }
}

// MCP servers an editor declares in session/new and session/load (`mcpServers`), driven with
// the official client (@agentclientprotocol/sdk, unchanged). In embedded mode `turnlog acp`
// runs them itself, as the user who started it (here the reference server `mcp-server-time`
// from PyPI, installed by scripts/test into target/venv/mcp); each call asks first. A server
// declared this way is never stored: its env must not reach the data dir. In bridge mode a
// turnlog server does not run its clients' commands, and session/new says so.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Lab, TEST, contentText, m, show, withAgent } from "./helpers.mjs";

const TIME = new URL("../../target/venv/mcp/bin/mcp-server-time", import.meta.url).pathname;
const SECRET = "sekrit-9f3c1d7a"; // in the server's env: must not be stored anywhere
const CLOCK = { name: "clock", command: TIME, args: ["--local-timezone", "UTC"], env: [{ name: "CLOCK_TOKEN", value: SECRET }] };
const NOW = '/tool clock__get_current_time {"timezone":"UTC"}';

/** The command lines of the processes whose parent is `pid`. */
function childrenOf(pid) {
  const out = [];
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, "utf8");
      const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      if (parent === pid) out.push(fs.readFileSync(`/proc/${entry}/cmdline`, "utf8").replaceAll("\0", " "));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** Every file under `dir` that holds `needle`. */
function filesHolding(dir, needle) {
  const found = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    const file = path.join(entry.parentPath ?? entry.path, entry.name);
    if (entry.isFile() && fs.readFileSync(file).includes(needle)) found.push(file);
  }
  return found;
}

describe("turnlog acp: MCP servers from the editor", () => {
  test("embedded: a stdio server from session/new offers its tools; a call asks, runs, and is answered; the env is stored nowhere", TEST, async (t) => {
    assert.ok(fs.existsSync(TIME), `${TIME} is missing: scripts/test installs tests/mcp/requirements.txt into target/venv/mcp`);
    const lab = new Lab(t);
    const target = await lab.target("embedded");
    const first = await withAgent(lab, target.args, async (c) => {
      const init = await c.initialize();
      assert.equal(init.agentCapabilities?.mcpCapabilities?.http, true, `mcpCapabilities.http: ${show(init)}`);
      const { sessionId } = await c.ok(m.agent.session.new, c.newSessionParams([CLOCK]));
      c.permissionPolicy = "allow_once";
      const turn = await c.prompt(sessionId, NOW);
      assert.equal(turn.stopReason, "end_turn", show(turn.updates));
      assert.equal(turn.permissions.length, 1, `a server the editor declared asks before each call: ${show(turn.events)}`);
      const [call] = turn.toolCalls;
      assert.deepEqual(call.statuses, ["pending", "in_progress", "completed"], show(turn.updates));
      assert.match(contentText(call.content), /"timezone": "UTC"/, show(call));
      assert.ok(turn.text.startsWith("tool results: clock__get_current_time="), turn.text);

      // A second session given the same servers shares their process.
      const other = await c.ok(m.agent.session.new, c.newSessionParams([CLOCK]));
      assert.equal((await c.prompt(other.sessionId, NOW)).toolCalls[0]?.status, "completed");
      const clocks = childrenOf(c.child.pid).filter((cmd) => cmd.includes("mcp-server-time"));
      assert.equal(clocks.length, 1, `one mcp-server-time for both sessions: ${show(clocks)}`);
      return sessionId;
    });
    const sessionId = first.result;
    assert.deepEqual(filesHolding(target.dataDir, SECRET), [], "the server's env is stored nowhere");

    // A new process: the session has the servers session/load names, and only those.
    await withAgent(lab, target.args, async (c) => {
      await c.initialize();
      await c.load(sessionId, [CLOCK]);
      c.permissionPolicy = "allow_once";
      const again = await c.prompt(sessionId, NOW);
      assert.equal(again.toolCalls[0]?.status, "completed", show(again.updates));
      await c.load(sessionId, []);
      const without = await c.prompt(sessionId, NOW);
      assert.deepEqual(without.permissions, [], "a tool the session no longer has is not asked for");
      assert.match(without.text, /no tool named "clock__get_current_time"/, without.text);
    });
  });

  test("embedded: an SSE server, or two servers of one name, are refused with invalid params naming why", TEST, async (t) => {
    const lab = new Lab(t);
    const target = await lab.target("embedded");
    await withAgent(lab, target.args, async (c) => {
      await c.initialize();
      const sse = await c.fails(m.agent.session.new, c.newSessionParams([{ type: "sse", name: "old", url: "http://127.0.0.1:9/sse", headers: [] }]));
      assert.equal(sse.code, -32602, show(sse));
      assert.match(show(sse.data), /not SSE/, show(sse));
      const twice = await c.fails(m.agent.session.new, c.newSessionParams([CLOCK, CLOCK]));
      assert.match(show(twice.data), /declared twice/, show(twice));
    });
  });

  test("bridge: session/new with a server is refused (a turnlog server does not run its clients' commands); without one it works", TEST, async (t) => {
    const lab = new Lab(t);
    const target = await lab.target("bridge");
    await withAgent(lab, target.args, async (c) => {
      await c.initialize();
      const refused = await c.fails(m.agent.session.new, c.newSessionParams([CLOCK]));
      assert.equal(refused.code, -32602, show(refused));
      assert.match(show(refused.data), /without --server/, show(refused));
      const { sessionId } = await c.ok(m.agent.session.new, c.newSessionParams());
      assert.equal((await c.prompt(sessionId, "hi")).text, "echo: hi");
    });
  });
});

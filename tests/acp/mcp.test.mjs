// MCP servers an editor declares in session/new and session/load (`mcpServers`), driven with
// the official client (@agentclientprotocol/sdk, unchanged). In embedded mode `turnlog acp`
// runs them itself, as the user who started it (here the reference server `mcp-server-time`
// from PyPI, installed by scripts/test into target/venv/mcp); each call asks first. A server
// declared this way is never stored: its env must not reach the data dir. In bridge mode a
// turnlog server does not run its clients' commands, and session/new says so.
//
// The prompts of an agent's MCP servers are commands (`/mcp:<server>:<prompt>`), in both
// modes: here the reference server `@modelcontextprotocol/server-everything` (npm, installed
// by scripts/test into tests/mcp/node_modules), as it is.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Lab, TEST, commandsIn, contentText, m, show, waitFor, withAgent } from "./helpers.mjs";

const TIME = new URL("../../target/venv/mcp/bin/mcp-server-time", import.meta.url).pathname;
const SECRET = "sekrit-9f3c1d7a"; // in the server's env: must not be stored anywhere
const CLOCK = { name: "clock", command: TIME, args: ["--local-timezone", "UTC"], env: [{ name: "CLOCK_TOKEN", value: SECRET }] };
const NOW = '/tool clock__get_current_time {"timezone":"UTC"}';
const EVERYTHING = new URL("../mcp/node_modules/.bin/mcp-server-everything", import.meta.url).pathname;
const PROMPTED = `
[agents.prompted]
description = "Scripted, with server-everything's prompts"
model = { provider = "scripted", name = "scripted" }

[agents.prompted.mcp_servers.everything]
command = "${EVERYTHING}"
args = ["stdio"]
permission = "allow"

# The same server, and one that cannot start (every turn of this agent fails; its commands do not).
[agents.halfway]
model = { provider = "scripted", name = "scripted" }
[agents.halfway.mcp_servers.everything]
command = "${EVERYTHING}"
args = ["stdio"]
[agents.halfway.mcp_servers.gone]
command = "/nonexistent/mcp-server-gone"
`;
const ARGS_PROMPT = "mcp:everything:args-prompt";

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

  for (const mode of ["embedded", "bridge"]) {
    test(`${mode}: the agent's MCP prompts are commands, listed once the server is up; one typed is written out by the server and is the turn's message, which the log keeps and a load replays; one used wrongly says how and stores nothing`, TEST, async (t) => {
      assert.ok(fs.existsSync(EVERYTHING), `${EVERYTHING} is missing: scripts/test installs tests/mcp's npm packages`);
      const lab = new Lab(t);
      const target = await lab.target(mode, { config: PROMPTED, agent: "prompted" });
      const first = await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const { sessionId } = await c.ok(m.agent.session.new, c.newSessionParams());
        const lists = await waitFor(
          () => commandsIn(c.transcript, sessionId).length >= 2 && commandsIn(c.transcript, sessionId),
          20_000,
          () => `the commands again with the prompts: ${show(commandsIn(c.transcript, sessionId))}`,
        );
        assert.deepEqual(lists[0].availableCommands.map((x) => x.name), ["compact", "fork"], "the built-in commands come at once");
        const listed = Object.fromEntries(lists[1].availableCommands.map((x) => [x.name, x]));
        for (const name of ["compact", "fork", "mcp:everything:simple-prompt", ARGS_PROMPT, "mcp:everything:resource-prompt"]) {
          assert.ok(listed[name], `${name} in ${show(Object.keys(listed))}`);
        }
        assert.equal(listed[ARGS_PROMPT].input?.hint, "<city> [state]", show(listed[ARGS_PROMPT]));
        assert.equal(listed[ARGS_PROMPT].description, "A prompt with two arguments, one required and one optional (MCP server everything)");
        assert.equal(listed["mcp:everything:simple-prompt"].input ?? null, null, "a prompt with no arguments takes no input");

        const weather = await c.prompt(sessionId, `/${ARGS_PROMPT} "New York" NY`);
        assert.equal(weather.stopReason, "end_turn", show(weather.updates));
        assert.equal(weather.text, "echo: What's weather in New York, NY?", "the model got what the server wrote");
        const wrong = await c.prompt(sessionId, `/${ARGS_PROMPT}`);
        assert.equal(wrong.stopReason, "end_turn");
        assert.equal(wrong.text, `/${ARGS_PROMPT} <city> [state]: city needed`);
        const resource = await c.prompt(sessionId, "/mcp:everything:resource-prompt Text 3");
        assert.equal(resource.stopReason, "end_turn", show(resource.updates));
        assert.match(resource.text, /^echo: This prompt includes the Text resource with id: 3\./, resource.text);
        return sessionId;
      });
      const sessionId = first.result;

      // A fresh process: load replays the messages the prompts wrote, as the log keeps them.
      await withAgent(lab, target.args, async (c) => {
        await c.initialize();
        const loaded = await c.load(sessionId);
        const said = loaded.updates.filter((u) => u.sessionUpdate === "user_message_chunk").map((u) => u.content);
        assert.deepEqual(said.map((b) => b.type), ["text", "text", "resource"], show(said));
        assert.equal(said[0].text, "What's weather in New York, NY?");
        assert.match(said[1].text, /^This prompt includes the Text resource with id: 3\. Please analyze/, show(said));
        assert.match(said[2].resource.uri, /\/3$/, show(said[2]));
        assert.match(said[2].resource.text, /^Resource 3: This is a plaintext resource/, show(said[2]));
        await waitFor(
          () => commandsIn(c.transcript, sessionId).some((u) => u.availableCommands.some((x) => x.name === ARGS_PROMPT)),
          20_000,
          () => `a load lists the prompts too: ${show(commandsIn(c.transcript, sessionId))}`,
        );
      });

      // An agent with a server that cannot start: the other's prompts are offered; a prompt
      // of the one down, or one no server has, is said to the user, never sent to the model.
      const halfway = [...target.args.slice(0, -1), "halfway"];
      await withAgent(lab, halfway, async (c) => {
        await c.initialize();
        const { sessionId } = await c.ok(m.agent.session.new, c.newSessionParams());
        await waitFor(
          () => commandsIn(c.transcript, sessionId).some((u) => u.availableCommands.some((x) => x.name === ARGS_PROMPT)),
          20_000,
          () => `the working server's prompts: ${show(commandsIn(c.transcript, sessionId))}`,
        );
        const gone = await c.prompt(sessionId, "/mcp:gone:anything at all");
        assert.equal(gone.stopReason, "end_turn");
        assert.match(gone.text, /^\/mcp:gone:anything: MCP server gone cannot be reached now \(.*could not start.*\); try again$/, gone.text);
        const none = await c.prompt(sessionId, "/mcp:everything:no-such-prompt");
        assert.match(none.text, /^\/mcp:everything:no-such-prompt: no MCP server of this session offers a prompt "no-such-prompt"/, none.text);
        const { updates } = await c.load(sessionId);
        assert.deepEqual(updates.filter((u) => u.sessionUpdate === "user_message_chunk"), [], "nothing of either was stored");
      });
    });
  }
});

// `turnlog acp` as an editor's agent: the editor's files and terminals as the model's tools.
// The official client (@agentclientprotocol/sdk 2.4.0, unchanged) plays the editor, with its
// own `fs/*` and `terminal/*` handlers on a real temp directory and real processes
// (./editor.mjs). Both modes: embedded (`--data-dir`) and bridge (`--server`).
//
// The scripted model calls what the prompt says: `/tool NAME JSON` per call, all in one reply;
// once the calls are answered it says `tool results: NAME=CONTENT; ...`.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Lab, TEST, contentText, getJson, m, outline, show, waitFor, withAgent } from "./helpers.mjs";
import { Editor } from "./editor.mjs";

const BEFORE = "one\ntwo\nthree\n";
const AFTER = "one\nTWO\nthree\n";

/** A prompt of tool calls, one `/tool` line each. */
function calls(...list) {
  return list.map(([name, input]) => `/tool ${name} ${JSON.stringify(input)}`).join("\n");
}

/** The folded tool calls of a list of updates, by tool name (from the title's verb). */
function toolCalls(updates) {
  return outline(updates).filter((i) => i.kind === "tool");
}

/** The raw `session/update` lines a load sent before its answer, as the agent wrote them. */
function loadLines(c, sessionId) {
  const out = c.transcript.findLastIndex((e) => e.dir === "out" && e.msg?.method === "session/load");
  return c.transcript
    .slice(out + 1)
    .filter((e) => e.dir === "in" && e.msg?.method === "session/update" && e.msg.params.sessionId === sessionId)
    .map((e) => e.line);
}

/**
 * A fresh target (`mode`), a workspace holding `files` (name -> text), and a `turnlog acp`
 * there whose client is an Editor of it: `op(c, {sessionId, modes, editor, workspace})` runs
 * on a new session. Returns `{lab, target, result}`.
 */
async function inEditor(t, mode, files, op) {
  const lab = new Lab(t);
  const target = await lab.target(mode);
  const workspace = lab.tempDir("turnlog-workspace-");
  for (const [name, text] of Object.entries(files)) fs.writeFileSync(path.join(workspace, name), text);
  const editor = new Editor(workspace);
  const run = async (c) => {
    await c.initialize();
    const { sessionId, modes } = await c.ok(m.agent.session.new, c.newSessionParams());
    return op(c, { sessionId, modes, editor, workspace });
  };
  const { result } = await withAgent(lab, target.args, run, { editor, cwd: workspace });
  return { lab, target, result };
}

for (const mode of ["embedded", "bridge"]) {
  describe(`turnlog acp (${mode}): the editor's files and terminals`, () => {
    test("a turn reads a file, writes it (a diff with locations), runs `ls` in the editor's terminal (asked and allowed); all in the log, and a load in a fresh process replays it, the same bytes twice", TEST, async (t) => {
      const { lab, target, result } = await inEditor(t, mode, { "notes.txt": BEFORE }, async (c, { sessionId, modes, editor, workspace }) => {
        const notes = path.join(workspace, "notes.txt");
        assert.equal(modes.currentModeId, "code", "code mode: edits unasked, commands asked");
        c.permissionPolicy = "allow_once";
        const prompt = calls(
          ["read_text_file", { path: "notes.txt", line: 2, limit: 1 }],
          ["write_text_file", { path: notes, content: AFTER }],
          ["terminal", { command: "ls", args: ["-1"] }],
        );
        const turn = await c.prompt(sessionId, prompt);
        assert.equal(turn.stopReason, "end_turn", show(turn.updates));
        const [read, write, run] = turn.toolCalls;
        assert.equal(turn.toolCalls.length, 3, show(turn.updates));

        // The read: the editor read line 2, by the absolute path; the model got it.
        assert.deepEqual(editor.of(m.client.fs.readTextFile)[0], { sessionId, path: notes, line: 2, limit: 1 });
        assert.equal(read.toolKind, "read", show(read));
        assert.equal(read.title, "Read notes.txt", show(read));
        assert.equal(read.status, "completed", show(read));
        assert.deepEqual(read.locations, [{ path: notes, line: 2 }], show(read));

        // The write: unasked in code mode, read first for the diff, then written.
        assert.equal(fs.readFileSync(notes, "utf8"), AFTER, "the editor wrote the new text");
        assert.deepEqual(editor.of(m.client.fs.writeTextFile), [{ sessionId, path: notes, content: AFTER }]);
        assert.equal(write.toolKind, "edit", show(write));
        assert.equal(write.status, "completed", show(write));
        assert.deepEqual(write.content[0], { type: "diff", path: notes, oldText: BEFORE, newText: AFTER }, show(write));
        assert.deepEqual(write.locations, [{ path: notes }], show(write));

        // The command: asked first (code mode asks for commands), the terminal embedded while it ran.
        assert.equal(turn.permissions.length, 1, `one permission request, for the command: ${show(turn.permissions)}`);
        const asked = turn.permissions[0];
        assert.equal(asked.toolCall.toolCallId, run.toolCallId, show(asked));
        assert.deepEqual(asked.options.map((o) => o.kind), ["allow_once", "reject_once"], show(asked));
        const created = editor.of(m.client.terminal.create);
        assert.deepEqual(created.map(({ command, args, cwd }) => ({ command, args, cwd })), [{ command: "ls", args: ["-1"], cwd: workspace }]);
        assert.ok(created[0].outputByteLimit > 0, `an output limit is set: ${show(created)}`);
        const embedded = turn.updates.find((u) => u.toolCallId === run.toolCallId && u.content?.some((x) => x.type === "terminal"));
        assert.ok(embedded, `the terminal is embedded in its call while it runs: ${show(turn.updates)}`);
        const terminalId = embedded.content.find((x) => x.type === "terminal").terminalId;
        assert.deepEqual(editor.of(m.client.terminal.release).map((p) => p.terminalId), [terminalId], "the terminal is released");
        assert.deepEqual(editor.running(), [], "no process is left running");
        assert.equal(run.toolKind, "execute", show(run));
        assert.equal(run.title, "Run ls -1", show(run));
        assert.equal(run.status, "completed", show(run));
        assert.equal(contentText(run.content), "notes.txt\n\n[exit code 0]", show(run));
        assert.match(turn.text, /^tool results: read_text_file=two\n; write_text_file=Wrote 14 bytes to .*notes\.txt; terminal=notes\.txt\n\n\[exit code 0\]$/, turn.text);
        const final = [read, write, run].map(({ content, locations, status }) => ({ content, locations, status }));
        return { sessionId, notes, workspace, final };
      });
      const { sessionId, notes, workspace, final } = result;

      // A load in a fresh process, twice (with a client that offers nothing: a replay needs none).
      const loads = [];
      for (let i = 0; i < 2; i++) {
        await withAgent(lab, target.args, async (c) => {
          await c.initialize();
          const loaded = await c.load(sessionId);
          const replayed = toolCalls(loaded.updates).map(({ content, locations, status }) => ({ content, locations, status }));
          assert.deepEqual(replayed, final, `the load shows each call as the live turn left it; replay: ${show(loaded.updates)}`);
          loads.push(loadLines(c, sessionId));
        });
      }
      assert.ok(loads[0].length > 0);
      assert.deepEqual(loads[1], loads[0], "two loads in fresh processes send the same bytes");

      // The log has each call's run: who ran it, the diff, the command and its end (read
      // through a server on the data dir, once no agent holds it, in embedded mode).
      const server = target.server ?? (await lab.startServer({ dataDir: target.dataDir }));
      const page = await getJson(`${server.url}/sessions/${sessionId}/events?limit=500`);
      const results = page.data.filter((e) => e.type === "user.custom_tool_result");
      assert.deepEqual(results.map((e) => e.ran?.by), ["turnlog-acp-test", "turnlog-acp-test", "turnlog-acp-test"], show(results));
      assert.deepEqual(results[0].ran, { by: "turnlog-acp-test", locations: [{ path: notes, line: 2 }] }, show(results[0]));
      assert.deepEqual(results[1].ran.diff, { path: notes, old_text: BEFORE, new_text: AFTER }, show(results[1]));
      assert.equal(results[2].ran.permission, "allow", show(results[2]));
      assert.deepEqual(results[2].ran.terminal, { command: "ls", args: ["-1"], cwd: workspace, exit_code: 0 }, show(results[2]));
      const uses = page.data.filter((e) => e.type === "agent.custom_tool_use").map((e) => [e.name, e.ask ?? false, e.editor]);
      assert.deepEqual(uses, [["read_text_file", false, true], ["write_text_file", false, true], ["terminal", true, true]], "each call says it is the editor's, and whether it asks");
    });

    test("modes: in `ask` a write asks, showing the diff, and refused the file is untouched and the call fails saying so; in `plan` a write is refused unasked, a read runs unasked; a client that offers no files has no such tools", TEST, async (t) => {
      const { lab, target, result: notes } = await inEditor(t, mode, { "notes.txt": BEFORE }, async (c, { sessionId, editor, workspace }) => {
        const notes = path.join(workspace, "notes.txt");
        const write = calls(["write_text_file", { path: notes, content: AFTER }]);
        await c.ok(m.agent.session.setMode, { sessionId, modeId: "ask" });
        c.permissionPolicy = "reject_once";
        const refused = await c.prompt(sessionId, write);
        assert.equal(refused.permissions.length, 1, show(refused.events));
        const asked = refused.permissions[0].toolCall;
        assert.deepEqual(asked.content, [{ type: "diff", path: notes, oldText: BEFORE, newText: AFTER }], `the question shows the edit: ${show(asked)}`);
        assert.deepEqual(asked.locations, [{ path: notes }], show(asked));
        assert.equal(fs.readFileSync(notes, "utf8"), BEFORE, "refused: the file is untouched");
        assert.deepEqual(editor.of(m.client.fs.writeTextFile), [], "nothing was written");
        assert.equal(refused.toolCalls[0].status, "failed", show(refused.updates));
        assert.equal(refused.text, "tool results: write_text_file=Tool call denied: the user refused it");

        await c.ok(m.agent.session.setMode, { sessionId, modeId: "plan" });
        const planned = await c.prompt(sessionId, `${write}\n${calls(["read_text_file", { path: notes }])}`);
        assert.equal(planned.permissions.length, 0, `plan mode asks nothing: ${show(planned.events)}`);
        assert.equal(fs.readFileSync(notes, "utf8"), BEFORE);
        assert.deepEqual(editor.of(m.client.fs.writeTextFile), [], "nothing was written");
        assert.deepEqual(planned.toolCalls.map((x) => x.status), ["failed", "completed"], show(planned.updates));
        assert.equal(
          planned.text,
          `tool results: write_text_file=Tool call denied: the session's mode (plan) does not allow "write_text_file": the user may change the mode; read_text_file=${BEFORE}`,
        );
        return notes;
      });

      // A client that offers no files or terminals: the model has no such tools.
      await withAgent(lab, target.args, async (c) => {
        const sessionId = await c.openSession();
        const turn = await c.prompt(sessionId, calls(["read_text_file", { path: notes }]));
        assert.equal(turn.text, 'tool results: read_text_file=Tool call denied: no tool named "read_text_file" is available', show(turn.updates));
      });
    });

    test("session/cancel while a command runs: the prompt answers `cancelled` within 5 s, the command is killed and its terminal released; the session goes on", TEST, async (t) => {
      await inEditor(t, mode, {}, async (c, { sessionId, editor }) => {
        c.permissionPolicy = "allow_once";
        const from = c.transcript.length;
        const prompt = [{ type: "text", text: calls(["terminal", { command: "sleep", args: ["30"] }]) }];
        const running = c.call(m.agent.session.prompt, { sessionId, prompt });
        await c.waitForUpdate(sessionId, (u) => u.content?.some?.((x) => x.type === "terminal"), { from, what: "the terminal embedded in its call" });
        const cancelledAt = performance.now();
        await c.cancel(sessionId);
        const reply = await running;
        assert.equal(reply.result?.stopReason, "cancelled", show(reply.result ?? reply.error));
        assert.ok(reply.answeredAt - cancelledAt < 5_000, `answered ${Math.round(reply.answeredAt - cancelledAt)} ms after the cancel`);
        assert.equal(editor.of(m.client.terminal.kill).length, 1, "the command was killed");
        assert.equal(editor.of(m.client.terminal.release).length, 1, "its terminal released");
        // (The kill's exit reaches the editor as its process closes.)
        await waitFor(() => editor.running().length === 0, 5_000, () => "the killed command's process to end");
        const next = await c.prompt(sessionId, "hi");
        assert.equal(next.text, "echo: hi", "the session goes on");

        // Past its `timeout_secs`, a command is killed, and the model is told.
        const late = await c.prompt(sessionId, calls(["terminal", { command: "sleep", args: ["30"], timeout_secs: 1 }]));
        assert.equal(late.stopReason, "end_turn", show(late.updates));
        assert.equal(late.toolCalls[0].status, "failed", show(late.updates));
        assert.equal(late.text, "tool results: terminal=\n[killed after 1 s]");
        assert.equal(editor.of(m.client.terminal.kill).length, 2, "the late command was killed");
        await waitFor(() => editor.running().length === 0, 5_000, () => "the killed command's process to end");
      });
    });
  });
}

"""MCP tools through the turn engine, against the reference servers as they are. The
scripted model calls what a line `/tool <server>__<tool> <json>` names, then says
`tool results: <name>=<content>`."""

import json
import os
import signal
import time

import pytest
from conftest import idle_after, of_type


def reply(turn) -> str:
    """The last assistant text of an AAP turn answer."""
    texts = [m["content"] for m in turn["messages"] if m["role"] == "assistant" and isinstance(m["content"], str)]
    assert texts, f"no reply: {turn}"
    return texts[-1]


def test_a_stdio_tool_runs_inline_and_is_logged_with_its_server(client):
    session = client.session("tools")
    turn = client.turn(session, '/tool time__get_current_time {"timezone": "UTC"}')
    assert turn["stopReason"] == "end_turn", turn
    assert reply(turn).startswith("tool results: time__get_current_time="), turn
    events = client.events(session)
    [use] = of_type(events, "agent.tool_use")
    assert use["name"] == "time__get_current_time"
    assert use["mcp"] == {"server": "time", "tool": "get_current_time"}
    assert use["evaluated_permission"] == "allow"
    [result] = of_type(events, "agent.tool_result")
    assert result["tool_use_id"] == use["id"] and result["is_error"] is False
    # The server's text and structured content, as it gave them.
    assert result["structured_content"]["timezone"] == "UTC", result
    assert json.loads(result["content"][0]["text"])["datetime"] == result["structured_content"]["datetime"]


def test_an_ask_tool_waits_for_a_decision_granted_or_denied(client):
    session = client.session("tools")
    call = '/tool time__convert_time {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}'
    for decision, expected in [("allow", "21:00"), ("deny", "Tool call denied")]:
        seen = len(of_type(client.events(session), "session.status_idle"))
        client.post(session, {"type": "user.message", "content": call})
        events = client.wait_for(session, idle_after(seen + 1), what="the turn to stop for the permission")
        idle = of_type(events, "session.status_idle")[-1]
        assert idle["stop_reason"]["type"] == "requires_action", idle
        use = of_type(events, "agent.tool_use")[-1]
        assert use["evaluated_permission"] == "ask" and use["mcp"]["tool"] == "convert_time"
        assert idle["stop_reason"]["event_ids"] == [use["id"]]
        client.post(session, {"type": "user.tool_confirmation", "tool_use_id": use["id"], "result": decision})
        events = client.wait_for(session, idle_after(seen + 2), what=f"the turn after {decision}")
        assert of_type(events, "session.status_idle")[-1]["stop_reason"]["type"] == "end_turn"
        result = [r for r in of_type(events, "agent.tool_result") if r["tool_use_id"] == use["id"]]
        assert len(result) == 1 and expected in result[0]["content"][0]["text"], result


def test_a_denied_tool_is_not_offered(client):
    session = client.session("tools")
    turn = client.turn(session, "/tool everything__get-env {}")
    assert reply(turn) == 'tool results: everything__get-env=Tool call denied: no tool named "everything__get-env" is available'


@pytest.mark.parametrize("agent", ["tools", "remote"], ids=["stdio", "streamable-http"])
def test_server_everything_answers_over_both_transports(client, agent):
    session = client.session(agent)
    turn = client.turn(session, '/tool everything__echo {"message": "hi from turnlog"}')
    assert turn["stopReason"] == "end_turn", turn
    assert reply(turn) == "tool results: everything__echo=Echo: hi from turnlog"
    [use] = of_type(client.events(session), "agent.tool_use")
    assert use["mcp"] == {"server": "everything", "tool": "echo"}


def test_a_slow_call_is_cancelled_at_once(client):
    session = client.session("tools")
    client.post(session, {"type": "user.message", "content": '/tool everything__trigger-long-running-operation {"duration": 30, "steps": 30}'})
    client.wait_for(session, lambda events: of_type(events, "agent.tool_use"), what="the slow call")
    started = time.monotonic()
    client.post(session, {"type": "user.interrupt"})
    events = client.wait_for(session, idle_after(1), seconds=10, what="the cancelled turn's end")
    assert time.monotonic() - started < 5, "a cancel reaches a running MCP call at once"
    assert of_type(events, "session.status_idle")[-1]["stop_reason"] == {"type": "cancel", "detail": "cancelled"}
    [result] = of_type(events, "agent.tool_result")
    assert result["is_error"] and result["content"][0]["text"] == "Tool call cancelled", result
    # The server goes on serving the next call.
    turn = client.turn(session, '/tool everything__echo {"message": "still here"}')
    assert reply(turn) == "tool results: everything__echo=Echo: still here"


def children(pid: int):
    """The processes whose parent is `pid`, with their command lines."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            out.append((int(entry), command))
    return out


def test_a_server_killed_mid_session_is_started_again(client, server):
    session = client.session("tools")
    first = client.turn(session, '/tool time__get_current_time {"timezone": "UTC"}')
    assert "datetime" in reply(first)
    # The `time` server's process (`time.utc` runs the same command with another zone).
    [(pid, _)] = [(pid, cmd) for pid, cmd in children(server.process.pid) if cmd.endswith("--local-timezone UTC ")]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(p == pid for p, _ in children(server.process.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    turn = client.turn(session, '/tool time__get_current_time {"timezone": "Europe/Paris"}')
    assert turn["stopReason"] == "end_turn", turn
    assert "Europe/Paris" in reply(turn), turn
    assert [p for p, cmd in children(server.process.pid) if cmd.endswith("--local-timezone UTC ")] != [pid], "a new process"


def test_a_server_that_does_not_start_fails_the_turn_clearly(client):
    session = client.session("broken")
    started = time.monotonic()
    turn = client.call("POST", f"/sessions/{session}/turns", {"stream": "none", "messages": [{"role": "user", "content": "hi"}]})
    assert time.monotonic() - started < 10, "no hang"
    events = client.events(session)
    [error] = of_type(events, "session.error")
    assert error["code"] == "mcp_unavailable", error
    assert "nothing" in error["error"] and "/nonexistent/mcp-server-nothing" in error["error"], error
    assert of_type(events, "session.status_idle")[-1]["stop_reason"]["type"] == "error"
    assert turn["stopReason"] != "end_turn", turn


def test_a_server_that_keeps_failing_is_not_started_again_at_once(client):
    """Starts in a row wait 2 s, then 4 s, ...: a wait longer than 2 s fails the turn at
    once, naming the last failure, rather than hold it."""
    session = client.session("broken")
    errors = []
    for _ in range(3):
        started = time.monotonic()
        client.call("POST", f"/sessions/{session}/turns", {"stream": "none", "messages": [{"role": "user", "content": "hi"}]})
        assert time.monotonic() - started < 10, "no hang"
        errors.append(of_type(client.events(session), "session.error")[-1]["error"])
    assert "keeps failing" in errors[-1] and "/nonexistent/mcp-server-nothing" in errors[-1], errors


def test_a_servers_error_result_is_kept_as_an_error(client):
    session = client.session("tools")
    turn = client.turn(session, "/tool everything__echo {}")
    assert turn["stopReason"] == "end_turn", turn
    [result] = of_type(client.events(session), "agent.tool_result")
    # The server refused the input (`message` is required): its `isError` result, as it gave it.
    assert result["is_error"] is True and result["mcp"] == {"server": "everything", "tool": "echo"}, result
    assert "message" in result["content"][0]["text"], result


def test_a_call_past_its_timeout_fails_and_the_server_goes_on(client):
    session = client.session("tools")
    started = time.monotonic()
    turn = client.turn(session, '/tool hasty__trigger-long-running-operation {"duration": 20, "steps": 20}')
    assert time.monotonic() - started < 10, "the call gives up after its 1 s timeout"
    assert reply(turn) == "tool results: hasty__trigger-long-running-operation=MCP server hasty: trigger-long-running-operation took longer than 1 s", turn
    turn = client.turn(session, '/tool hasty__echo {"message": "next"}')
    assert reply(turn) == "tool results: hasty__echo=Echo: next"


def test_a_cancel_reaches_the_server_as_notifications_cancelled(client, cancelled_mark):
    session = client.session("tools")
    client.post(session, {"type": "user.message", "content": '/tool slow__wait {"seconds": 60}'})
    def mark_is(text: str):
        deadline = time.monotonic() + 10
        while not (cancelled_mark.exists() and cancelled_mark.read_text() == text):
            assert time.monotonic() < deadline, f"the server's mark never said {text!r}"
            time.sleep(0.02)

    mark_is("started")  # the call is in the server's handler
    client.post(session, {"type": "user.interrupt"})
    events = client.wait_for(session, idle_after(1), seconds=10, what="the cancelled turn's end")
    assert of_type(events, "session.status_idle")[-1]["stop_reason"] == {"type": "cancel", "detail": "cancelled"}
    mark_is("cancelled")

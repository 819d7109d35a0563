"""One MCP turn, as each view shows it: the native log (the call names its server), the turn
API's history (the tool as the model saw it), and the managed-agents view through the
official `anthropic` SDK in strict mode (`agent.mcp_tool_use` / `agent.mcp_tool_result`)."""

import time

import anthropic
from conftest import of_type


def test_one_mcp_turn_through_the_native_aap_and_managed_views(client, server):
    sdk = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=30, _strict_response_validation=True)
    environment = sdk.beta.environments.create(name="mcp")
    session = sdk.beta.sessions.create(agent="tools", environment_id=environment.id)
    call = '/tool time__get_current_time {"timezone": "UTC"}'
    sdk.beta.sessions.events.send(session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": call}]}])
    deadline = time.monotonic() + 30
    while True:
        managed = list(sdk.beta.sessions.events.list(session.id))
        if any(e.type == "session.status_idle" for e in managed):
            break
        assert time.monotonic() < deadline, f"the turn to end; saw {[e.type for e in managed]}"
        time.sleep(0.05)

    # Native: the log's own events.
    native = client.events(session.id)
    [use] = of_type(native, "agent.tool_use")
    [result] = of_type(native, "agent.tool_result")
    assert use["mcp"] == {"server": "time", "tool": "get_current_time"} and result["mcp"] == use["mcp"]

    # Managed agents: the SDK's MCP event types, strictly validated.
    [mcp_use] = [e for e in managed if e.type == "agent.mcp_tool_use"]
    assert (mcp_use.id, mcp_use.name, mcp_use.mcp_server_name) == (use["id"], "get_current_time", "time")
    assert mcp_use.input == {"timezone": "UTC"} and mcp_use.evaluated_permission == "allow"
    [mcp_result] = [e for e in managed if e.type == "agent.mcp_tool_result"]
    assert mcp_result.mcp_tool_use_id == use["id"] and mcp_result.is_error is False
    assert mcp_result.content[0].text == result["content"][0]["text"]
    assert not [e for e in managed if e.type in ("agent.tool_use", "agent.tool_result")], "no plain tool events for MCP calls"
    only = list(sdk.beta.sessions.events.list(session.id, types=["agent.mcp_tool_use"]))
    assert [e.id for e in only] == [use["id"]], "the type filter knows MCP calls"

    # The turn API: the tool as the model saw it, and its answer.
    history = client.call("GET", f"/sessions/{session.id}/history")["history"]["compacted"]
    tool_uses = [b for m in history if m["role"] == "assistant" and isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_use"]
    assert [b["name"] for b in tool_uses] == ["time__get_current_time"], history
    answers = [m for m in history if m["role"] == "tool"]
    assert answers and "datetime" in str(answers[0]["content"]), history

"""MCP servers declared other than in config, and MCP calls in the other views:
- per agent through the managed-agents API (`mcp_servers` with `mcp_toolset` tools), read
  and driven with the official `anthropic` SDK in strict mode, on a server with API keys
  (a non-admin may reach only the hosts `tools.mcp.allowed_hosts` names; never a command);
- a seed history that ends with an MCP call (AAP `messages`);
- the agent harness view, through the official `truefoundry-gateway-sdk`: `mcp.initialize`
  and `tool_info` of type `mcp`;
- a server name no model provider takes as part of a tool name."""

import json
import socket
import tempfile
import time
import urllib.error
import urllib.request

import anthropic
import pytest
from conftest import of_type
from truefoundry_gateway_sdk.agents import AgentSessionClient
from turnlog_server import Server, keys, sha256

ALICE, ROOT = "alice-key", "root-key"


@pytest.fixture(scope="module")
def keyed(everything_http):
    """A server with keys: `alice` (not an admin) and `root` (an admin); MCP servers
    declared through an API may be on 127.0.0.1 only, for non-admins."""
    config = keys(alice=ALICE) + f"""
[[auth.keys]]
subject = "root"
sha256 = "{sha256(ROOT)}"
admin = true

[tools.mcp]
allowed_hosts = ["127.0.0.1"]
"""
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, config)
        yield running
        running.stop()


def sdk(server, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=30, _strict_response_validation=True)


def toolset(server: str, policy: str, **extra) -> dict:
    return {"type": "mcp_toolset", "mcp_server_name": server, "default_config": {"permission_policy": {"type": policy}}, **extra}


def run(client: anthropic.Anthropic, session: str, text: str, idles: int = 1):
    """Sends `text` and waits until the session has stopped `idles` times in all: its events."""
    client.beta.sessions.events.send(session, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}])
    return wait_idle(client, session, idles)


def wait_idle(client, session: str, idles: int):
    deadline = time.monotonic() + 30
    while True:
        events = list(client.beta.sessions.events.list(session))
        if len([e for e in events if e.type == "session.status_idle"]) >= idles:
            return events
        assert time.monotonic() < deadline, f"the turn to stop; saw {[e.type for e in events]}"
        time.sleep(0.05)


def everything_agent(client: anthropic.Anthropic, url: str, name: str, toolset: dict):
    """An agent with server-everything at `url` as server `everything`, with `toolset`."""
    servers = [{"type": "url", "name": "everything", "url": url}]
    return client.beta.agents.create(name=name, model="scripted", mcp_servers=servers, tools=[toolset])


def test_an_agent_made_through_the_managed_api_has_its_mcp_servers(keyed, everything_http):
    alice = sdk(keyed, ALICE)
    disabled = [{"name": "get-env", "enabled": False}]
    agent = everything_agent(alice, everything_http, "echoes", toolset("everything", "always_allow", configs=disabled))
    # The agent reads back as the SDK's strict models have it, toolset resolved.
    assert [(s.name, s.url) for s in agent.mcp_servers] == [("everything", everything_http)]
    [declared] = [t for t in agent.tools if t.type == "mcp_toolset"]
    assert declared.default_config.enabled is True and declared.default_config.permission_policy.type == "always_allow"
    assert [(c.name, c.enabled) for c in declared.configs] == [("get-env", False)]
    assert alice.beta.agents.retrieve(agent.id).mcp_servers[0].url == everything_http

    environment = alice.beta.environments.create(name="mcp")
    session = alice.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    events = run(alice, session.id, '/tool everything__echo {"message": "hi"}')
    [use] = [e for e in events if e.type == "agent.mcp_tool_use"]
    assert (use.name, use.mcp_server_name, use.evaluated_permission) == ("echo", "everything", "allow")
    [result] = [e for e in events if e.type == "agent.mcp_tool_result"]
    assert result.mcp_tool_use_id == use.id and result.content[0].text == "Echo: hi"
    # A disabled tool is not offered.
    events = run(alice, session.id, "/tool everything__get-env {}", idles=2)
    denied = [e for e in events if e.type == "agent.tool_result"][-1]
    assert denied.is_error and "no tool named" in denied.content[0].text


def test_an_always_ask_toolset_waits_for_the_users_confirmation(keyed, everything_http):
    alice = sdk(keyed, ALICE)
    # No policy: always_ask.
    agent = everything_agent(alice, everything_http, "careful", {"type": "mcp_toolset", "mcp_server_name": "everything"})
    [declared] = [t for t in agent.tools if t.type == "mcp_toolset"]
    assert declared.default_config.permission_policy.type == "always_ask"
    environment = alice.beta.environments.create(name="mcp")
    session = alice.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    events = run(alice, session.id, '/tool everything__echo {"message": "may I"}')
    [use] = [e for e in events if e.type == "agent.mcp_tool_use"]
    assert use.evaluated_permission == "ask"
    idle = [e for e in events if e.type == "session.status_idle"][-1]
    assert idle.stop_reason.type == "requires_action" and idle.stop_reason.event_ids == [use.id]
    alice.beta.sessions.events.send(
        session.id, events=[{"type": "user.tool_confirmation", "tool_use_id": use.id, "result": "allow"}]
    )
    events = wait_idle(alice, session.id, 2)
    [result] = [e for e in events if e.type == "agent.mcp_tool_result"]
    assert result.mcp_tool_use_id == use.id and result.content[0].text == "Echo: may I"


def test_who_may_declare_which_server(keyed, everything_http):
    alice, root = sdk(keyed, ALICE), sdk(keyed, ROOT)
    elsewhere = everything_http.replace("127.0.0.1", "localhost")
    body = {"name": "x", "model": "scripted", "tools": [toolset("far", "always_allow")]}
    with pytest.raises(anthropic.BadRequestError) as refused:
        alice.beta.agents.create(**body, mcp_servers=[{"type": "url", "name": "far", "url": elsewhere}])
    assert "tools.mcp.allowed_hosts" in str(refused.value)
    # An admin may (it is the operator's own call).
    assert root.beta.agents.create(**body, mcp_servers=[{"type": "url", "name": "far", "url": elsewhere}]).id
    # A server needs its toolset, and a toolset its server.
    with pytest.raises(anthropic.BadRequestError) as unpaired:
        alice.beta.agents.create(name="x", model="scripted", mcp_servers=[{"type": "url", "name": "e", "url": everything_http}])
    assert "mcp_toolset" in str(unpaired.value)
    with pytest.raises(anthropic.BadRequestError) as dangling:
        alice.beta.agents.create(name="x", model="scripted", tools=[toolset("ghost", "always_allow")])
    assert "ghost" in str(dangling.value)
    with pytest.raises(anthropic.BadRequestError) as auto:
        alice.beta.agents.create(
            name="x", model="scripted", mcp_servers=[{"type": "url", "name": "e", "url": everything_http}],
            tools=[toolset("e", "auto")],
        )
    assert "always_allow or always_ask" in str(auto.value)


def test_an_update_replaces_servers_and_toolsets_together(keyed, everything_http):
    alice = sdk(keyed, ALICE)
    agent = alice.beta.agents.create(
        name="changing", model="scripted",
        mcp_servers=[{"type": "url", "name": "everything", "url": everything_http}],
        tools=[toolset("everything", "always_allow")],
    )
    # Servers alone, leaving the old toolset naming a server that is gone: refused.
    with pytest.raises(anthropic.BadRequestError):
        alice.beta.agents.update(agent.id, version=agent.version, mcp_servers=[{"type": "url", "name": "other", "url": everything_http}])
    updated = alice.beta.agents.update(
        agent.id, version=agent.version,
        mcp_servers=[{"type": "url", "name": "other", "url": everything_http}], tools=[toolset("other", "always_ask")],
    )
    assert updated.version == agent.version + 1 and [s.name for s in updated.mcp_servers] == ["other"]
    cleared = alice.beta.agents.update(agent.id, version=updated.version, mcp_servers=[], tools=[])
    assert cleared.mcp_servers == [] and cleared.tools == []
    again = alice.beta.agents.update(
        agent.id, version=cleared.version,
        mcp_servers=[{"type": "url", "name": "other", "url": everything_http}], tools=[toolset("other", "always_ask")],
    )
    # `null` clears, as for every field of an agent.
    nulled = alice.beta.agents.update(agent.id, version=again.version, mcp_servers=None, tools=None)
    assert nulled.mcp_servers == [] and nulled.tools == []
    # A non-admin's update is held to the allowed hosts too.
    with pytest.raises(anthropic.BadRequestError) as refused:
        alice.beta.agents.update(
            agent.id, version=nulled.version,
            mcp_servers=[{"type": "url", "name": "far", "url": everything_http.replace("127.0.0.1", "localhost")}],
            tools=[toolset("far", "always_allow")],
        )
    assert "tools.mcp.allowed_hosts" in str(refused.value)


def test_a_server_that_cannot_be_reached_is_an_mcp_connection_error(keyed):
    root = sdk(keyed, ROOT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/mcp"  # nothing listens once closed
    agent = root.beta.agents.create(
        name="unreachable", model="scripted",
        mcp_servers=[{"type": "url", "name": "gone", "url": closed + "?token=hush-hush"}],
        tools=[toolset("gone", "always_allow")],
    )
    environment = root.beta.environments.create(name="mcp")
    session = root.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    events = run(root, session.id, "hello")
    [error] = [e for e in events if e.type == "session.error"]
    assert error.error.type == "mcp_connection_failed_error" and error.error.mcp_server_name == "gone"
    assert closed in error.error.message and "hush-hush" not in error.error.message, error.error.message


def test_a_seed_history_ending_with_an_mcp_call_waits_for_its_permission(client):
    call = {"source_timezone": "UTC", "time": "06:00", "target_timezone": "Asia/Tokyo"}
    created = client.call("POST", "/sessions", {
        "agent": {"name": "tools"},
        "messages": [
            {"role": "user", "content": "What time is 06:00 UTC in Tokyo?"},
            {"role": "assistant", "content": [{"type": "tool_use", "toolCallId": "seed-1", "name": "time__convert_time", "input": call}]},
        ],
    })
    session = created["sessionId"]
    events = client.events(session)
    [use] = of_type(events, "agent.tool_use")
    assert use["mcp"] == {"server": "time", "tool": "convert_time"} and use["evaluated_permission"] == "ask"
    assert of_type(events, "session.status_idle")[-1]["stop_reason"]["event_ids"] == [use["id"]]
    client.post(session, {"type": "user.tool_confirmation", "tool_use_id": use["id"], "result": "allow"})
    events = client.wait_for(session, lambda ev: of_type(ev, "agent.tool_result"), what="the granted call's result")
    [result] = of_type(events, "agent.tool_result")
    assert result["mcp"] == use["mcp"] and result["is_error"] is False and "15:00" in result["content"][0]["text"]


def test_a_seed_history_whose_servers_cannot_be_listed_is_refused_naming_the_server(client):
    request = urllib.request.Request(
        client.url + "/sessions", method="POST", headers={"content-type": "application/json"},
        data=json.dumps({"agent": {"name": "broken"}, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "toolCallId": "seed-1", "name": "nothing__x", "input": {}}]},
        ]}).encode(),
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 503
    assert "nothing" in refused.value.read().decode()


def test_the_harness_view_shows_mcp_initialize_and_mcp_tool_info(server):
    client = AgentSessionClient(base_url=server.url, api_key="unused")
    session = client.create_session(agent_name="tools")
    turn = session.prepare_turn(input=[{"type": "user.message", "content": '/tool time__get_current_time {"timezone": "UTC"}'}])
    frames = [frame.event for frame in turn.execute(stream=True)]
    kinds = [f.type for f in frames]
    [initialize] = [f for f in frames if f.type == "mcp.initialize"]
    assert kinds.index("mcp.initialize") < kinds.index("model.message"), kinds
    names = sorted(s.name for s in initialize.mcp_servers)
    assert names == ["everything", "hasty", "slow", "time", "time.utc"], names
    assert all(s.transport_type is None for s in initialize.mcp_servers), "stdio servers name no HTTP transport"
    infos = [c.tool_info for f in frames if f.type == "model.message.delta" for c in (f.tool_calls or [])]
    [info] = [i for i in infos if i is not None]
    assert (info.type, info.server_name, info.name) == ("mcp", "time", "get_current_time")
    assert frames[-1].type == "turn.done" and frames[-1].state.status == "done"
    # A server over HTTP names its transport.
    remote = client.create_session(agent_name="remote").prepare_turn(input=[{"type": "user.message", "content": "hi"}])
    [initialize] = [f.event for f in remote.execute(stream=True) if f.event.type == "mcp.initialize"]
    assert [(s.name, s.transport_type) for s in initialize.mcp_servers] == [("everything", "streamable-http")]


def model_name(server: str, tool: str) -> str:
    """docs/mcp.md's rule: `<server>__<tool>`, or when that needs a change, its characters
    outside [a-zA-Z0-9_-] made `_`, cut to 55, then `_` and the FNV-1a (32-bit) hash of
    server NUL tool in 8 hex digits."""
    full = f"{server}__{tool}"
    clean = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in full)
    ambiguous = server.endswith("_") or "__" in server or tool.startswith("_")
    if clean == full and not ambiguous and len(full) <= 64:
        return full
    h = 0x811C9DC5
    for b in server.encode() + b"\0" + tool.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{clean[:55]}_{h:08x}"


def test_a_server_name_no_provider_takes_is_made_into_one(client):
    session = client.session("tools")
    name = model_name("time.utc", "get_current_time")
    assert name.startswith("time_utc__get_current_time_") and len(name) == 35, name
    turn = client.turn(session, f'/tool {name} {{"timezone": "UTC"}}')
    assert turn["stopReason"] == "end_turn", turn
    events = client.events(session)
    [listed] = of_type(events, "agent.mcp_tools")
    assert "time.utc" in [s["server"] for s in listed["servers"]]
    [use] = of_type(events, "agent.tool_use")
    assert use["name"] == name
    assert use["mcp"] == {"server": "time.utc", "tool": "get_current_time"}
    [result] = of_type(events, "agent.tool_result")
    assert result["is_error"] is False and result["structured_content"]["timezone"] == "UTC"

"""MCP servers' prompts through the native API: `GET /sessions/{id}/prompts` lists the
prompts of a session's servers (server-everything's, over stdio and Streamable HTTP), and
`POST /sessions/{id}/prompts/{server}/{prompt}` has the server write one out from the
user's arguments, into the content the client then sends as its turn's message. Nothing is
stored until it does."""

import json
import urllib.error
import urllib.request

from conftest import idle_after, of_type

EVERYTHING_PROMPTS = {"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"}


def call(client, method, path, body=None):
    """(status, JSON body) of a call, whatever the status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(client.url + path, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_sessions_prompts_are_listed_with_their_arguments_over_stdio_and_http(client):
    for agent in ("tools", "remote"):
        session = client.session(agent)
        status, listed = call(client, "GET", f"/sessions/{session}/prompts")
        assert status == 200, listed
        assert listed["unavailable"] == [], listed
        everything = {p["name"]: p for p in listed["prompts"] if p["server"] == "everything"}
        assert set(everything) >= EVERYTHING_PROMPTS, listed
        args = everything["args-prompt"]
        assert args["description"] == "A prompt with two arguments, one required and one optional"
        assert [(a["name"], a["required"]) for a in args["arguments"]] == [("city", True), ("state", False)], args
        assert args["arguments"][0]["description"] == "Name of the city"
        assert everything["simple-prompt"]["arguments"] == []
        # mcp-server-time has no prompts: it lists none, and is not unavailable for that.
        assert not [p for p in listed["prompts"] if p["server"].startswith("time")], listed


def test_a_prompt_written_out_is_the_message_of_the_turn_the_client_sends(client):
    session = client.session("remote")
    before = client.events(session)
    status, written = call(client, "POST", f"/sessions/{session}/prompts/everything/args-prompt", {"arguments": {"city": "Paris", "state": "TX"}})
    assert status == 200, written
    assert written == {"content": [{"type": "text", "text": "What's weather in Paris, TX?"}]}
    status, resource = call(client, "POST", f"/sessions/{session}/prompts/everything/resource-prompt", {"arguments": {"resourceType": "Text", "resourceId": "2"}})
    assert status == 200, resource
    first, embedded = resource["content"]
    assert first["type"] == "text" and "Text resource with id: 2" in first["text"], resource
    assert embedded["type"] == "resource" and embedded["resource"]["uri"].endswith("/2"), resource
    assert embedded["resource"]["text"].startswith("Resource 2: This is a plaintext resource"), resource
    assert client.events(session) == before, "writing a prompt out stores nothing"

    # Sent as the message of a turn, it is the log's user message, block for block.
    client.post(session, {"type": "user.message", "content": resource["content"]})
    events = client.wait_for(session, idle_after(1), what="the turn to end")
    [message] = of_type(events, "user.message")
    assert message["content"] == resource["content"]
    [idle] = of_type(events, "session.status_idle")
    assert idle["stop_reason"]["type"] == "end_turn", idle


def test_a_prompt_the_server_cannot_write_is_a_clear_error_and_stores_nothing(client):
    session = client.session("tools")
    before = client.events(session)
    path = f"/sessions/{session}/prompts"
    status, missing = call(client, "POST", f"{path}/everything/args-prompt", {"arguments": {}})
    assert status == 400 and "MCP server everything: prompts/get of args-prompt" in missing["error"]["message"], missing
    status, unknown = call(client, "POST", f"{path}/everything/no-such-prompt", {})
    assert status == 400 and "no-such-prompt" in unknown["error"]["message"], unknown
    status, no_server = call(client, "POST", f"{path}/nowhere/simple-prompt", {})
    assert status == 404 and "nowhere" in no_server["error"]["message"], no_server
    status, not_text = call(client, "POST", f"{path}/everything/args-prompt", {"arguments": {"city": 1}})
    assert status == 400 and "arguments" in not_text["error"]["message"], not_text
    status, stray = call(client, "POST", f"{path}/everything/simple-prompt", {"args": {}})
    assert status == 400 and "args" in stray["error"]["message"], stray
    status, unknown_session = call(client, "GET", "/sessions/no-such-session/prompts")
    assert status == 404, unknown_session
    assert client.events(session) == before, "nothing is stored"


def test_a_server_that_cannot_start_is_named_and_the_others_prompts_still_listed(client):
    session = client.session("halfway")
    status, listed = call(client, "GET", f"/sessions/{session}/prompts")
    assert status == 200, listed
    assert {p["name"] for p in listed["prompts"] if p["server"] == "everything"} >= EVERYTHING_PROMPTS, listed
    assert not [p for p in listed["prompts"] if p["server"] == "nothing"], listed
    [unavailable] = listed["unavailable"]
    assert unavailable["server"] == "nothing" and "could not start" in unavailable["error"], listed
    # Writing one of its prompts out says the server is out of reach (503), not that the request was wrong.
    status, down = call(client, "POST", f"/sessions/{session}/prompts/nothing/any", {})
    assert status == 503 and "could not start" in down["error"]["message"], down

"""Starts the real turnlog binary on a free loopback port with a temp data dir, two API keys
and a configured agent whose calculator asks for permission, and gives tests the official
`anthropic` SDK pointed at it, in strict mode."""

import pathlib
import sys
import tempfile

import anthropic
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from turnlog_server import Server, keys  # noqa: E402

ALICE, BOB = "alice-key", "bob-key"

CONFIG = keys(alice=ALICE, bob=BOB) + """
[agents.assistant]
description = "Scripted, with a calculator that asks and a clock that does not"
model = { provider = "scripted", name = "scripted" }
tools = { calculator = "ask", current_time = "allow" }
"""


@pytest.fixture(scope="session")
def server():
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, CONFIG)
        yield running.url
        running.stop()


@pytest.fixture
def own_server():
    """A server of the test's own, which it may restart (on the same port)."""
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, CONFIG)
        yield running
        running.stop()


def sdk(server: str, key: str = ALICE, cls=anthropic.Anthropic):
    return cls(base_url=server, api_key=key, max_retries=0, timeout=30, _strict_response_validation=True)


@pytest.fixture
def client(server):
    return sdk(server)


@pytest.fixture
def other(server):
    """Another subject: it must never see alice's sessions."""
    return sdk(server, BOB)


@pytest.fixture
def environment(client):
    return client.beta.environments.create(name="test")


WEATHER = {
    "type": "custom",
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def agent(client):
    return client.beta.agents.create(name="weather", model="scripted", system="Be brief.", tools=[WEATHER])


@pytest.fixture
def session(client, agent, environment):
    return client.beta.sessions.create(agent=agent.id, environment_id=environment.id)


def message(text: str) -> dict:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


def until_idle(stream, *, stop_on_action: bool = True) -> list:
    """The stream's events up to the session going idle (ending its turn, or waiting for
    the client when `stop_on_action`)."""
    events = []
    for event in stream:
        events.append(event)
        if event.type == "session.status_idle":
            if stop_on_action or event.stop_reason.type != "requires_action":
                return events
    raise AssertionError(f"the stream ended before the session went idle: {[e.type for e in events]}")


def turn(client, session_id: str, events: list, **stream_options) -> list:
    """Opens the stream (live from now), sends `events`, and reads until idle."""
    stream = client.beta.sessions.events.stream(session_id, **stream_options)
    try:
        client.beta.sessions.events.send(session_id, events=events)
        return until_idle(stream)
    finally:
        stream.close()


def said(events: list) -> list:
    return ["".join(block.text for block in e.content) for e in events if e.type == "agent.message"]

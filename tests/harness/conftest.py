"""Starts the real turnlog binary on a free loopback port with a temp data dir, two API keys
and a configured agent with a calculator that asks for permission, a clock that does not,
and a client-side weather tool; gives tests the official `truefoundry-gateway-sdk` pointed
at it. The SDK logs a warning for any frame it cannot parse and skips it: a test fails on
any warning."""

import logging
import pathlib
import sys
import tempfile

import pytest
from truefoundry_gateway_sdk.agents import AgentSessionClient, merge_event_delta

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from turnlog_server import Server, keys, sha256  # noqa: E402

ALICE, BOB, OPS = "alice-key", "bob-key", "ops-key"

CONFIG = keys(alice=ALICE, bob=BOB) + f"""
[[auth.keys]]
subject = "ops"
sha256 = "{sha256(OPS)}"
admin = true
""" + """
[agents.helper]
description = "Scripted, with a calculator that asks, a clock that does not, and the client's weather"
model = { provider = "scripted", name = "scripted" }
tools = { calculator = "ask", current_time = "allow" }
client_tools = [{ name = "get_weather", description = "Weather for a city", input_schema = { type = "object", properties = { city = { type = "string" } }, required = ["city"] } }]
"""


@pytest.fixture(scope="session")
def server():
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, CONFIG)
        yield running.url
        running.stop()


def sdk(server: str, key: str = ALICE, **options) -> AgentSessionClient:
    return AgentSessionClient(base_url=server, api_key=key, **({"max_retries": 0, "timeout": 30} | options))


@pytest.fixture
def client(server):
    return sdk(server)


@pytest.fixture
def other(server):
    """Another subject: it must never see alice's sessions."""
    return sdk(server, BOB)


@pytest.fixture
def session(client):
    return client.create_session(agent_name="helper")


@pytest.fixture(autouse=True)
def no_skipped_frames(caplog):
    """The SDK skips a frame it cannot parse with a WARNING on the root logger."""
    caplog.set_level(logging.WARNING)
    yield
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, f"the SDK warned: {warnings}"


def message(text) -> list:
    return [{"type": "user.message", "content": text}]


def run(session, items, **options) -> list:
    """A streamed turn, and every (sequence number, event) of its stream to the end."""
    turn = session.prepare_turn(input=items, **options)
    return turn, [(i.sequence_number, i.event) for i in turn.execute()]


def merged(frames) -> list:
    """The turn's messages, each folded from its first empty frame and its deltas, as a
    client does with the SDK's `merge_event_delta`."""
    messages = {}
    for _, event in frames:
        if event.type == "model.message":
            messages[event.id] = event.model_copy(deep=True)
        elif event.type == "model.message.delta":
            merge_event_delta(messages[event.id], event)
    return list(messages.values())


def types(frames) -> list:
    return [event.type for _, event in frames]


def answers(turn, *, allow=True, reason=None, response="Sunny") -> list:
    """An answer for each action the paused turn waits for."""
    items = []
    for action in turn.state.required_actions:
        for call in action.tool_calls:
            if action.type == "tool.approval_required":
                approval = {"status": "allow"} if allow else {"status": "deny", "reason": reason}
                items.append({"type": "user.tool_approval", "thread_id": "main", "tool_call_id": call.id,
                              "approval": approval})
            else:
                items.append({"type": "user.tool_response", "thread_id": "main", "tool_call_id": call.id,
                              "content": response})
    return items

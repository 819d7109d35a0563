"""Idempotency keys through the official SDK (its `request_options`' `additional_headers`):
a session made twice with one key is one session; a turn started twice with one key is one
turn, its stream given again from the turn's start, also while it runs and after a SIGKILL
and a restart; the same key with another input is refused (422) and starts nothing."""

import time
import uuid

import httpx
import pytest
from truefoundry_gateway_sdk import TrueFoundryGateway
from truefoundry_gateway_sdk.core.api_error import ApiError
from truefoundry_gateway_sdk.errors import UnprocessableEntityError

from conftest import ALICE, BOB, CONFIG, message, sdk
from turnlog_server import own_server


@pytest.fixture
def killable():
    """A server of the test's own (killing it disturbs no other test)."""
    with own_server(CONFIG) as running:
        yield running


@pytest.fixture
def two_agents():
    """A server of the test's own with a second agent, for a body that differs."""
    with own_server(CONFIG + '\n[agents.other]\nmodel = { provider = "scripted", name = "scripted" }\n') as running:
        yield running


def keyed(key: str) -> dict:
    return {"additional_headers": {"Idempotency-Key": key}}


def fresh_key() -> str:
    return f"test-{uuid.uuid4()}"


def streamed(session, items, key: str):
    """A streamed turn started with `key`, and every (sequence number, event) of its stream."""
    turn = session.prepare_turn(input=items)
    return turn, [(i.sequence_number, i.event) for i in turn.execute(request_options=keyed(key))]


def dumped(frames) -> list:
    return [(n, e.model_dump()) for n, e in frames]


def native_events(url: str, session_id: str, kind: str) -> list:
    """The session's events of `kind` as the native log holds them."""
    response = httpx.get(
        f"{url}/sessions/{session_id}/events",
        params={"type": kind, "limit": 1000},
        headers={"authorization": f"Bearer {ALICE}"},
    )
    assert response.status_code == 200, response.text
    return response.json()["data"]


def until_ended(session, turn_id: str, deadline_s: float = 30):
    """The turn, read until it is no longer running, or fails after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        turn = session.get_turn(turn_id)
        if turn.state.status != "running":
            return turn
        assert time.monotonic() < deadline, f"turn {turn_id} still runs after {deadline_s} s"
        time.sleep(0.02)


def test_a_session_made_twice_with_one_key_is_one_session(client):
    key = fresh_key()
    first = client.create_session(agent_name="helper", request_options=keyed(key))
    again = client.create_session(agent_name="helper", request_options=keyed(key))
    assert (again.id, again.created_at) == (first.id, first.created_at)
    other_key = client.create_session(agent_name="helper", request_options=keyed(fresh_key()))
    assert other_key.id != first.id, "another key makes another session"
    unkeyed = [client.create_session(agent_name="helper").id for _ in range(2)]
    assert len(set(unkeyed)) == 2, "without a key, each request makes a session"


def test_keys_that_make_sessions_are_the_callers(server, client):
    key = fresh_key()
    alices = client.create_session(agent_name="helper", request_options=keyed(key))
    bobs = sdk(server, BOB).create_session(agent_name="helper", request_options=keyed(key))
    assert bobs.id != alices.id and bobs.created_by_subject.subject_id == "bob"
    assert client.create_session(agent_name="helper", request_options=keyed(key)).id == alices.id


def test_a_turn_started_twice_with_one_key_is_one_turn_given_again_whole(server, session):
    key = fresh_key()
    first, frames = streamed(session, message("once"), key)
    assert [e.type for _, e in frames][-1] == "turn.done"
    again, replay = streamed(session, message("once"), key)
    assert again.id == first.id, "the same turn"
    assert dumped(replay) == dumped(frames), "its stream from the turn's start, as it was"
    assert again.state.status == "done" and again.state.output.content == "echo: once"

    assert [t.id for t in session.list_turns()] == [first.id], "one turn"
    kinds = [(i.turn_id, i.event.type) for i in session.list_events()]
    assert kinds.count((first.id, "turn.created")) == 1 and len(kinds) == 3, kinds
    assert len(native_events(server, session.id, "turn.started")) == 1
    assert [m["content"] for m in native_events(server, session.id, "user.message")] == [
        [{"type": "text", "text": "once"}]
    ], "the input stored once"


def test_a_turn_sent_again_while_it_runs_streams_it_from_its_start(server, session):
    key = fresh_key()
    items = message("/delay 20\n/words 10")
    first = session.prepare_turn(input=items)
    stream = first.execute(request_options=keyed(key))
    head = [next(stream)]
    assert head[0].event.type == "turn.created"
    again, replay = streamed(session, items, key)
    assert again.id == first.id, "the running turn, not a new one"
    assert [e.type for _, e in replay][0] == "turn.created" and [e.type for _, e in replay][-1] == "turn.done"
    rest = [(i.sequence_number, i.event) for i in stream]
    assert dumped([(i.sequence_number, i.event) for i in head] + rest) == dumped(replay), "one turn, two readers"
    assert again.state.output.content == "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"
    assert [t.id for t in session.list_turns()] == [first.id]
    assert len(native_events(server, session.id, "turn.started")) == 1


def test_a_turn_not_streamed_sent_again_answers_the_same_turn(server, session):
    gateway = TrueFoundryGateway(base_url=server, api_key=ALICE, max_retries=0, timeout=30)
    key = fresh_key()
    started = gateway.agents.sessions.create_turn(session.id, input=message("plain"), request_options=keyed(key))
    again = gateway.agents.sessions.create_turn(session.id, input=message("plain"), request_options=keyed(key))
    assert again.data.id == started.data.id
    assert again.data.created_at == started.data.created_at
    ended = until_ended(session, started.data.id)
    assert ended.state.status == "done" and ended.state.output.content == "echo: plain"
    third = gateway.agents.sessions.create_turn(session.id, input=message("plain"), request_options=keyed(key))
    assert third.data.id == started.data.id, "still the same after it ended"
    assert [t.id for t in session.list_turns()] == [started.data.id]

    # The key names its request as a whole: the same input streamed is another request.
    with pytest.raises(ApiError) as refused:
        streamed(session, message("plain"), key)
    assert refused.value.status_code == 422
    assert len(native_events(server, session.id, "turn.started")) == 1


def test_the_same_key_with_another_input_is_refused_and_starts_nothing(server, session):
    key = fresh_key()
    first, _ = streamed(session, message("first"), key)
    with pytest.raises(ApiError) as refused:
        streamed(session, message("changed"), key)
    # The SDK's spec has no 422 for a turn: its base ApiError, with the status and body.
    assert type(refused.value) is ApiError and refused.value.status_code == 422
    error = refused.value.body["error"]
    assert (error["code"], error["type"]) == ("idempotency_key_reused", "invalid_request_error"), error
    assert "Idempotency-Key" in error["message"] and "different request" in error["message"], error
    assert key in error["message"]
    assert [t.id for t in session.list_turns()] == [first.id], "nothing was started"
    assert len(native_events(server, session.id, "turn.started")) == 1
    again, _ = streamed(session, message("first"), key)
    assert again.id == first.id, "the refusal kept the key's first answer"


def test_a_session_key_used_for_another_agent_is_refused(two_agents):
    client = sdk(two_agents.url)
    key = fresh_key()
    made = client.create_session(agent_name="helper", request_options=keyed(key))
    with pytest.raises(UnprocessableEntityError) as reused:
        client.create_session(agent_name="other", request_options=keyed(key))
    error = reused.value.body.error
    assert (error.code, error.type) == ("idempotency_key_reused", "invalid_request_error")
    assert "Idempotency-Key" in error.message and "different request" in error.message, error
    assert client.create_session(agent_name="helper", request_options=keyed(key)).id == made.id
    assert [s.id for s in client.list_sessions(agent_name="other")] == [], "no session for the other agent"


def test_keyed_writes_sent_again_after_a_sigkill_and_a_restart_answer_as_before(killable):
    client = sdk(killable.url)
    session_key, turn_key = fresh_key(), fresh_key()
    session = client.create_session(agent_name="helper", request_options=keyed(session_key))
    first, frames = streamed(session, message("before the crash"), turn_key)
    assert [e.type for _, e in frames][-1] == "turn.done"

    killable.kill()
    killable.start()
    client = sdk(killable.url)

    again = client.create_session(agent_name="helper", request_options=keyed(session_key))
    assert (again.id, again.created_at) == (session.id, session.created_at), "the same session"
    resent, replay = streamed(again, message("before the crash"), turn_key)
    assert resent.id == first.id, "the same turn"
    assert dumped(replay) == dumped(frames), "answered as the first time"
    with pytest.raises(ApiError) as refused:
        streamed(again, message("another"), turn_key)
    assert refused.value.status_code == 422

    assert [t.id for t in again.list_turns()] == [first.id], "nothing stored twice"
    assert len(native_events(killable.url, session.id, "turn.started")) == 1
    assert len(native_events(killable.url, session.id, "user.message")) == 1

"""Idempotency keys through the official SDK, strict: a write sent again with its key is
answered as the first was and stored once, also after a SIGKILL and a restart; the same key
with another body is refused (422, naming the key) and a bad key too (400); a session made
with a key is the same session every time, its initial events stored once; keys that make
sessions are the caller's."""

import uuid

import anthropic
import pytest

from conftest import BOB, CONFIG, message, sdk
from turnlog_server import own_server, until


@pytest.fixture
def killable():
    """A server of the test's own (killing it disturbs no other test)."""
    with own_server(CONFIG) as running:
        yield running


def keyed(key: str) -> dict:
    return {"extra_headers": {"Idempotency-Key": key}}


def fresh_key() -> str:
    return f"test-{uuid.uuid4()}"



def idle_log(client, session_id: str, turns: int = 1) -> list:
    """The session's events once `turns` turns have ended (polled with a deadline)."""

    def ended():
        listed = list(client.beta.sessions.events.list(session_id))
        return listed if [e.type for e in listed].count("session.status_idle") >= turns else None

    return until(f"{turns} turn(s) end", ended)


def user_messages(events: list) -> list:
    return ["".join(block.text for block in e.content) for e in events if e.type == "user.message"]


def test_events_sent_again_with_their_key_are_answered_the_same_and_stored_once(client, session):
    key = fresh_key()
    first = client.beta.sessions.events.send(session.id, events=[message("once")], **keyed(key))
    again = client.beta.sessions.events.send(session.id, events=[message("once")], **keyed(key))
    assert first.data and [e.id for e in again.data] == [e.id for e in first.data], "the same event ids"
    assert again.model_dump() == first.model_dump(), "the same answer"

    events = idle_log(client, session.id)
    assert user_messages(events) == ["once"], [e.type for e in events]
    assert [e.id for e in events if e.type == "user.message"] == [first.data[0].id]
    replies = ["".join(b.text for b in e.content) for e in events if e.type == "agent.message"]
    assert replies == ["echo: once"], "one turn ran"

    third = client.beta.sessions.events.send(session.id, events=[message("once")], **keyed(key))
    assert [e.id for e in third.data] == [e.id for e in first.data], "still the same after the turn ended"
    assert [e.id for e in client.beta.sessions.events.list(session.id)] == [e.id for e in events], "nothing new"


def test_the_same_key_with_another_body_is_refused_and_stores_nothing(client, session):
    key = fresh_key()
    first = client.beta.sessions.events.send(session.id, events=[message("first")], **keyed(key))
    before = [e.id for e in idle_log(client, session.id)]
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        client.beta.sessions.events.send(session.id, events=[message("changed")], **keyed(key))
    assert refused.value.status_code == 422
    # Anthropic's error shape has a type and no code: `idempotency_key_reused` is the
    # other views' code; here it is the 422 and its message.
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error", error
    assert "Idempotency-Key" in error["message"] and "different request" in error["message"], error
    assert key in error["message"], "it names the key"
    assert [e.id for e in client.beta.sessions.events.list(session.id)] == before, "nothing stored"
    assert user_messages(list(client.beta.sessions.events.list(session.id))) == ["first"]

    again = client.beta.sessions.events.send(session.id, events=[message("first")], **keyed(key))
    assert [e.id for e in again.data] == [e.id for e in first.data], "the refusal kept the key's first answer"


def test_a_bad_key_is_refused_naming_the_header(client, session):
    for bad in ("x" * 256, ""):
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.beta.sessions.events.send(session.id, events=[message("hi")], **keyed(bad))
        assert "Idempotency-Key" in refused.value.body["error"]["message"], refused.value.body
    assert list(client.beta.sessions.events.list(session.id)) == [], "nothing stored"


def test_a_session_made_with_a_key_is_the_same_session_with_its_initial_events_once(client, agent, environment):
    key = fresh_key()
    request = dict(
        agent=agent.id, environment_id=environment.id, title="keyed", initial_events=[message("from the start")]
    )
    first = client.beta.sessions.create(**request, **keyed(key))
    again = client.beta.sessions.create(**request, **keyed(key))
    assert again.id == first.id and again.created_at == first.created_at

    events = idle_log(client, first.id)
    assert user_messages(events) == ["from the start"], [e.type for e in events]
    replies = ["".join(b.text for b in e.content) for e in events if e.type == "agent.message"]
    assert replies == ["echo: from the start"], "one turn ran"
    third = client.beta.sessions.create(**request, **keyed(key))
    assert third.id == first.id
    assert [e.id for e in client.beta.sessions.events.list(first.id)] == [e.id for e in events], "nothing new"
    mine = [s.id for s in client.beta.sessions.list(agent_id=agent.id)]
    assert mine.count(first.id) == 1 and len(mine) == 1, mine

    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        client.beta.sessions.create(**dict(request, title="another"), **keyed(key))
    assert "Idempotency-Key" in refused.value.body["error"]["message"]
    assert [s.id for s in client.beta.sessions.list(agent_id=agent.id)] == [first.id], "no second session"


def test_keys_that_make_sessions_are_the_callers(server, client, agent, environment):
    """Two subjects' equal keys make two sessions; the key's session is not the other's."""
    bob = sdk(server, BOB)
    bobs_agent = bob.beta.agents.create(name="bob's", model="scripted")
    bobs_environment = bob.beta.environments.create(name="bob's")
    key = fresh_key()
    alices = client.beta.sessions.create(agent=agent.id, environment_id=environment.id, **keyed(key))
    bobs = bob.beta.sessions.create(agent=bobs_agent.id, environment_id=bobs_environment.id, **keyed(key))
    assert bobs.id != alices.id
    assert bob.beta.sessions.retrieve(bobs.id).id == bobs.id
    with pytest.raises(anthropic.NotFoundError):
        bob.beta.sessions.retrieve(alices.id)
    again = bob.beta.sessions.create(agent=bobs_agent.id, environment_id=bobs_environment.id, **keyed(key))
    assert again.id == bobs.id


def test_keyed_writes_sent_again_after_a_sigkill_and_a_restart_answer_as_before(killable):
    client = sdk(killable.url)
    environment = client.beta.environments.create(name="crash")
    agent = client.beta.agents.create(name="keyed", model="scripted")
    session_key, send_key = fresh_key(), fresh_key()
    request = dict(agent=agent.id, environment_id=environment.id, initial_events=[message("start")])
    session = client.beta.sessions.create(**request, **keyed(session_key))
    idle_log(client, session.id)
    sent = client.beta.sessions.events.send(session.id, events=[message("after")], **keyed(send_key))
    before = idle_log(client, session.id, turns=2)
    assert user_messages(before) == ["start", "after"]

    killable.kill()
    killable.start()
    client = sdk(killable.url)

    again = client.beta.sessions.create(**request, **keyed(session_key))
    assert (again.id, again.created_at) == (session.id, session.created_at), "the same session"
    resent = client.beta.sessions.events.send(session.id, events=[message("after")], **keyed(send_key))
    assert [e.id for e in resent.data] == [e.id for e in sent.data], "the same event ids"
    assert resent.model_dump() == sent.model_dump()
    with pytest.raises(anthropic.UnprocessableEntityError):
        client.beta.sessions.events.send(session.id, events=[message("other")], **keyed(send_key))

    after = list(client.beta.sessions.events.list(session.id))
    assert [e.id for e in after] == [e.id for e in before], "nothing stored twice"
    assert user_messages(after) == ["start", "after"]
    assert [s.id for s in client.beta.sessions.list(agent_id=agent.id)] == [session.id], "one session"

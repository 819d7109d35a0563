"""Sessions through the official SDK, strict: create from an agent id, a pinned version or
an agent with extra custom tools; retrieve, update (metadata is a patch), list with its
filters and pages, archive and delete; ownership; errors."""

import anthropic
import pytest

from conftest import WEATHER, message, turn


def test_create_retrieve_update_archive_delete(client, agent, environment):
    session = client.beta.sessions.create(
        agent=agent.id, environment_id=environment.id, title="first", metadata={"team": "a", "drop": "me"}
    )
    assert session.status == "idle"
    assert session.environment_id == environment.id
    assert (session.agent.id, session.agent.version, session.agent.model.id) == (agent.id, 1, "scripted")
    assert [t.name for t in session.agent.tools] == ["get_weather"]
    assert session.metadata == {"team": "a", "drop": "me"}

    fetched = client.beta.sessions.retrieve(session.id)
    assert (fetched.id, fetched.title, fetched.created_at) == (session.id, "first", session.created_at)

    updated = client.beta.sessions.update(session.id, title="renamed", metadata={"drop": None, "new": "x"})
    assert updated.title == "renamed"
    assert updated.metadata == {"team": "a", "new": "x"}, "a null value deletes its key"

    archived = client.beta.sessions.archive(session.id)
    assert archived.archived_at is not None
    with pytest.raises(anthropic.ConflictError):
        client.beta.sessions.events.send(session.id, events=[message("hi")])

    deleted = client.beta.sessions.delete(session.id)
    assert (deleted.type, deleted.id) == ("session_deleted", session.id)
    for call in (
        lambda: client.beta.sessions.retrieve(session.id),
        lambda: client.beta.sessions.events.list(session.id),
        lambda: client.beta.sessions.delete(session.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            call()


def test_a_session_pins_its_agent_version_and_may_add_custom_tools(client, agent, environment):
    updated = client.beta.agents.update(agent.id, version=1, system="Be briefer.")
    assert updated.version == 2
    latest = client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    assert latest.agent.version == 2 and latest.agent.system == "Be briefer."
    pinned = client.beta.sessions.create(agent={"type": "agent", "id": agent.id, "version": 1}, environment_id=environment.id)
    assert pinned.agent.version == 1 and pinned.agent.system == "Be brief."
    extra = dict(WEATHER, name="get_time")
    overridden = client.beta.sessions.create(
        agent={"type": "agent_with_overrides", "id": agent.id, "tools": [extra]}, environment_id=environment.id
    )
    assert [t.name for t in overridden.agent.tools] == ["get_weather", "get_time"]
    configured = client.beta.sessions.create(agent="assistant", environment_id=environment.id)
    assert (configured.agent.id, configured.agent.version) == ("assistant", 1)


def test_the_list_pages_newest_first_with_filters(client, agent, environment):
    made = [client.beta.sessions.create(agent=agent.id, environment_id=environment.id, title=f"s{i}") for i in range(5)]
    ids = [s.id for s in made]
    first = client.beta.sessions.list(limit=2, agent_id=agent.id)
    assert [s.id for s in first.data] == ids[::-1][:2]
    assert first.next_page is not None
    everything = [s.id for s in client.beta.sessions.list(limit=2, agent_id=agent.id)]
    assert everything == ids[::-1], "auto-paging reaches the end and stops"
    oldest = [s.id for s in client.beta.sessions.list(limit=2, agent_id=agent.id, order="asc")]
    assert oldest == ids

    client.beta.sessions.archive(ids[0])
    listed = [s.id for s in client.beta.sessions.list(agent_id=agent.id)]
    assert ids[0] not in listed, "archived sessions are left out unless asked for"
    assert ids[0] in [s.id for s in client.beta.sessions.list(agent_id=agent.id, include_archived=True)]

    since = made[2].created_at
    after = [s.id for s in client.beta.sessions.list(agent_id=agent.id, created_at_gte=since)]
    assert after == ids[::-1][:3]
    strictly = [s.id for s in client.beta.sessions.list(agent_id=agent.id, created_at_gt=since)]
    assert strictly == ids[::-1][:2]

    running = client.beta.sessions.list(agent_id=agent.id, statuses=["running"])
    assert running.data == [] and running.next_page is None
    idle = [s.id for s in client.beta.sessions.list(agent_id=agent.id, statuses=["idle"])]
    assert idle == ids[::-1][:4]


def test_another_subject_sees_nothing(client, other, session):
    for call in (
        lambda: other.beta.sessions.retrieve(session.id),
        lambda: other.beta.sessions.events.list(session.id),
        lambda: other.beta.sessions.events.send(session.id, events=[message("hi")]),
        lambda: other.beta.sessions.archive(session.id),
        lambda: other.beta.sessions.delete(session.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            call()
    assert session.id not in [s.id for s in other.beta.sessions.list()]
    assert client.beta.sessions.retrieve(session.id).id == session.id


def test_bad_input_is_refused_in_anthropics_shape_and_stores_nothing(client, session):
    before = [e.id for e in client.beta.sessions.events.list(session.id)]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.beta.sessions.events.send(session.id, events=[{"type": "user.message", "content": 5}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "events[0]" in refused.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.beta.sessions.events.send(session.id, events=[{"type": "agent.message", "content": []}])
    assert "events[0].type" in refused.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.beta.sessions.create(agent="nobody", environment_id="env_x")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.beta.sessions.retrieve("sess_01J00000000000000000000000")
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert [e.id for e in client.beta.sessions.events.list(session.id)] == before


def test_a_conflict_is_not_retried(server, session):
    """The SDK retries a 409 unless told not to: turnlog's conflicts are answers."""
    sent = []
    counting = anthropic.DefaultHttpxClient(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    retrying = anthropic.Anthropic(
        base_url=server, api_key="alice-key", max_retries=2, http_client=counting, _strict_response_validation=True
    )
    waiting = turn(retrying, session.id, [message('/tool get_weather {"city": "Oslo"}')])
    assert waiting[-1].stop_reason.type == "requires_action"
    sent.clear()
    with pytest.raises(anthropic.ConflictError) as conflict:
        retrying.beta.sessions.events.send(session.id, events=[message("are you there?")])
    assert conflict.value.response.headers["x-should-retry"] == "false"
    assert "get_weather" in conflict.value.body["error"]["message"], "it names the call that waits"
    assert sent == [f"/v1/sessions/{session.id}/events"], "sent once, not retried"

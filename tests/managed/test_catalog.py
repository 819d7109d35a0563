"""Agents and environments through the official SDK, strict: versions, archive, lists;
sessions' initial events and outcomes."""

import time

import anthropic
import pytest

from conftest import WEATHER, message


def test_agents_are_versioned_archived_and_listed(client):
    first = client.beta.agents.create(name="v", model="scripted", metadata={"k": "1"}, tools=[WEATHER])
    second = client.beta.agents.update(first.id, version=1, name="v2", metadata={"k": None, "j": "2"})
    assert (second.version, second.name, second.metadata) == (2, "v2", {"j": "2"})
    with pytest.raises(anthropic.ConflictError):
        client.beta.agents.update(first.id, version=1, name="stale")
    assert client.beta.agents.retrieve(first.id, version=1).name == "v"
    assert [a.version for a in client.beta.agents.versions.list(first.id)] == [1, 2]
    assert first.id in [a.id for a in client.beta.agents.list()]
    archived = client.beta.agents.archive(first.id)
    assert archived.archived_at is not None
    assert first.id not in [a.id for a in client.beta.agents.list()]
    assert first.id in [a.id for a in client.beta.agents.list(include_archived=True)]
    with pytest.raises(anthropic.BadRequestError):
        client.beta.sessions.create(agent=first.id, environment_id=client.beta.environments.create(name="e").id)
    with pytest.raises(anthropic.NotFoundError):
        client.beta.agents.retrieve("agent_01J00000000000000000000000")


def test_environments_are_made_updated_archived_and_deleted(client):
    made = client.beta.environments.create(
        name="limited", config={"type": "cloud", "networking": {"type": "limited", "allowed_hosts": ["example.com"]}}
    )
    assert made.config.networking.allowed_hosts == ["example.com"]
    updated = client.beta.environments.update(made.id, description="d", metadata={"a": "1"})
    assert (updated.description, updated.metadata) == ("d", {"a": "1"})
    assert made.id in [e.id for e in client.beta.environments.list()]
    archived = client.beta.environments.archive(made.id)
    assert archived.archived_at is not None
    assert made.id not in [e.id for e in client.beta.environments.list()]
    deleted = client.beta.environments.delete(made.id)
    assert (deleted.type, deleted.id) == ("environment_deleted", made.id)
    with pytest.raises(anthropic.NotFoundError):
        client.beta.environments.retrieve(made.id)


def test_initial_events_run_and_outcomes_are_kept(client, agent, environment):
    outcome = {"type": "user.define_outcome", "description": "be right", "rubric": {"type": "text", "content": "r"}}
    session = client.beta.sessions.create(
        agent=agent.id, environment_id=environment.id, initial_events=[outcome, message("from the start")]
    )
    events = []
    for _ in range(500):
        events = list(client.beta.sessions.events.list(session.id))
        if any(e.type == "session.status_idle" for e in events):
            break
        time.sleep(0.01)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["user.define_outcome", "user.message"], kinds
    defined = events[0]
    assert (defined.description, defined.rubric.content) == ("be right", "r")
    assert defined.outcome_id
    replies = ["".join(b.text for b in e.content) for e in events if e.type == "agent.message"]
    assert replies == ["echo: from the start"]


def test_deleted_environments_leave_the_list_and_it_ends(client):
    made = [client.beta.environments.create(name=f"e{i}") for i in range(5)]
    for environment in made[2:]:
        client.beta.environments.delete(environment.id)
    listed = [e.id for e in client.beta.environments.list(limit=1)]
    mine = [e.id for e in made]
    assert [i for i in listed if i in mine] == [made[1].id, made[0].id], "newest first, the deleted ones left out"


def test_another_subject_cannot_see_or_use_what_alice_made(client, other, agent, environment):
    for call in (
        lambda: other.beta.agents.retrieve(agent.id),
        lambda: other.beta.agents.update(agent.id, name="taken"),
        lambda: other.beta.agents.archive(agent.id),
        lambda: other.beta.environments.retrieve(environment.id),
        lambda: other.beta.environments.delete(environment.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            call()
    assert agent.id not in [a.id for a in other.beta.agents.list()]
    assert environment.id not in [e.id for e in other.beta.environments.list()]
    with pytest.raises(anthropic.NotFoundError):
        other.beta.sessions.create(agent=agent.id, environment_id=other.beta.environments.create(name="b").id)

"""A turn that outlives its server, through the official SDK, strict: killed (SIGKILL) while
it streams a reply, the server starts again and the turn goes on from its log. The list
shows `session.status_rescheduled` (Anthropic's event for a session scheduled again), then
the whole reply once, and the turn ends."""


import httpx2
import pytest
from anthropic.types.beta.sessions import BetaManagedAgentsSessionStatusRescheduledEvent

from conftest import ALICE, CONFIG, message, sdk
from turnlog_server import own_server, until

WORDS = " ".join(f"w{i}" for i in range(1, 61))


@pytest.fixture
def killable():
    """A server of the test's own (killing it disturbs no other test)."""
    with own_server(CONFIG) as running:
        yield running



def native_deltas(url: str, session_id: str) -> list:
    """The turn's `agent.message.delta`s as the native log holds them (the managed list
    has no deltas)."""
    response = httpx2.get(
        f"{url}/sessions/{session_id}/events",
        params={"type": "agent.message.delta", "limit": 1000},
        headers={"authorization": f"Bearer {ALICE}"},
    )
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_a_turn_killed_mid_reply_is_rescheduled_and_says_its_whole_reply_once(killable):
    client = sdk(killable.url)
    environment = client.beta.environments.create(name="crash")
    agent = client.beta.agents.create(name="slow", model="scripted")
    session = client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    client.beta.sessions.events.send(session.id, events=[message("/delay 40\n/words 60")])

    until("the turn runs", lambda: list(client.beta.sessions.events.list(session.id, types=["session.status_running"])))
    before = until("a few words streamed", lambda: (d := native_deltas(killable.url, session.id)) and len(d) >= 3 and d)
    assert len(before) < 60, "killed mid-reply"
    killable.kill()
    killable.start()

    def ended():
        listed = list(client.beta.sessions.events.list(session.id))
        return listed if any(e.type == "session.status_idle" for e in listed) else None

    events = until("the resumed turn ends", ended, 60)
    kinds = [e.type for e in events]
    assert kinds.count("session.status_rescheduled") == 1, kinds
    assert "session.error" not in kinds, kinds
    rescheduled = kinds.index("session.status_rescheduled")
    assert isinstance(events[rescheduled], BetaManagedAgentsSessionStatusRescheduledEvent), "the SDK's own model"
    assert "session.status_running" in kinds[rescheduled:], "running again after the reschedule"
    said = [e for e in events if e.type == "agent.message"]
    assert len(said) == 1 and kinds.index("agent.message") > rescheduled, kinds
    assert "".join(block.text for block in said[0].content) == WORDS, "the whole reply, under one message"
    idle = [e for e in events if e.type == "session.status_idle"]
    assert idle[-1].stop_reason.type == "end_turn"
    assert kinds.index("session.status_idle") > kinds.index("agent.message"), kinds

    filtered = list(client.beta.sessions.events.list(session.id, types=["session.status_rescheduled"]))
    assert [(e.type, e.id, e.processed_at) for e in filtered] == [
        (events[rescheduled].type, events[rescheduled].id, events[rescheduled].processed_at)
    ]

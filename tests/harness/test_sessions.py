"""Sessions through the official SDK: create, get, and list in pages, newest first or in
order, within time bounds; unknown agents and other subjects' sessions are not found."""

import pytest
from truefoundry_gateway_sdk.errors import NotFoundError, UnauthorizedError

from conftest import ALICE, BOB, sdk


def test_a_session_is_made_for_a_saved_agent_and_read_back(client):
    made = client.create_session(agent_name="helper")
    assert made.id.startswith("sess_") and made.agent_name == "helper" and made.type == "session"
    assert made.created_by_subject.subject_id == "alice"
    read = client.get_session(made.id)
    assert (read.id, read.agent_name, read.created_at, read.updated_at) == (
        made.id, "helper", made.created_at, made.updated_at,
    )


def test_sessions_list_newest_first_in_pages_of_the_asked_size(client):
    made = [client.create_session(agent_name="helper") for _ in range(5)]
    since = made[0].created_at
    pager = client.list_sessions(agent_name="helper", limit=2, start_timestamp=since)
    assert [s.id for s in pager] == [s.id for s in reversed(made)]
    pages = list(client.list_sessions(agent_name="helper", limit=2, start_timestamp=since).iter_pages())
    assert [len(p.items) for p in pages] == [2, 2, 1]
    assert [p.response.pagination.limit for p in pages] == [2, 2, 2]
    assert [bool(p.response.pagination.next_page_token) for p in pages] == [True, True, False]

    oldest_first = client.list_sessions(agent_name="helper", limit=3, order="asc", start_timestamp=since)
    assert [s.id for s in oldest_first] == [s.id for s in made]
    # Both bounds are inclusive.
    window = client.list_sessions(agent_name="helper", start_timestamp=made[1].created_at,
                                  end_timestamp=made[3].created_at)
    assert [s.id for s in window] == [made[3].id, made[2].id, made[1].id]


def test_an_admin_lists_one_creators_sessions_by_slug_in_pages_of_100_unless_asked(server, client, other):
    from conftest import OPS, sdk

    ops = sdk(server, OPS)
    mine = [client.create_session(agent_name="helper") for _ in range(2)]
    theirs = other.create_session(agent_name="helper")
    since = mine[0].created_at

    def listed(slug=None):
        extra = {"additional_query_parameters": {"created_by_subject_slug": slug}} if slug else None
        found = ops.list_sessions(agent_name="helper", start_timestamp=since, request_options=extra)
        return [s.id for s in found]

    assert listed("alice") == [s.id for s in reversed(mine)]
    assert listed("bob") == [theirs.id]
    assert listed("nobody") == []
    assert set(listed()) == {s.id for s in mine} | {theirs.id}, "no filter: everyone's, to an admin"
    assert [s.created_by_subject.subject_slug for s in ops.list_sessions(agent_name="helper", start_timestamp=since,
            request_options={"additional_query_parameters": {"created_by_subject_slug": "bob"}})] == ["bob"]
    # A subject that is not an admin sees only its own, whatever it filters by.
    assert [s.id for s in other.list_sessions(agent_name="helper", start_timestamp=since,
            request_options={"additional_query_parameters": {"created_by_subject_slug": "alice"}})] == []
    # The seed's default page size, when a client sends none.
    import httpx

    page = httpx.get(f"{server}/v1/agents/sessions", params={"agent_name": "helper"},
                     headers={"Authorization": f"Bearer {OPS}"}).json()
    assert page["pagination"]["limit"] == 100


def test_an_unknown_agent_is_not_found(client):
    with pytest.raises(NotFoundError) as error:
        client.create_session(agent_name="nobody")
    assert "nobody" in error.value.body.error.message
    with pytest.raises(NotFoundError):
        list(client.list_sessions(agent_name="nobody"))


def test_another_subject_never_sees_a_session(client, other):
    mine = client.create_session(agent_name="helper")
    with pytest.raises(NotFoundError):
        other.get_session(mine.id)
    theirs = other.create_session(agent_name="helper")
    listed = [s.id for s in other.list_sessions(agent_name="helper", start_timestamp=mine.created_at)]
    assert listed == [theirs.id]


def test_another_subject_reaches_nothing_of_a_session(server, client, session):
    from truefoundry_gateway_sdk import TrueFoundryGateway
    from truefoundry_gateway_sdk.core.api_error import ApiError

    turn = session.prepare_turn(input=[{"type": "user.message", "content": "mine"}])
    list(turn.execute())
    raw = TrueFoundryGateway(base_url=server, api_key=BOB, max_retries=0).agents.sessions
    calls = [
        lambda: raw.get(session.id),
        lambda: list(raw.list_turns(session.id)),
        lambda: raw.get_turn(session.id, turn.id),
        lambda: list(raw.list_turn_events(session.id, turn.id)),
        lambda: list(raw.list_events(session.id)),
        lambda: raw.cancel(session.id),
        lambda: raw.create_turn(session.id, input=[{"type": "user.message", "content": "theirs"}]),
        lambda: list(raw.subscribe_to_turn(session.id, turn.id)),
    ]
    for call in calls:
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status_code == 404
    assert [t.id for t in session.list_turns()] == [turn.id], "nothing was started"


def test_a_wrong_key_is_refused(server):
    with pytest.raises(UnauthorizedError):
        list(sdk(server, ALICE + "-not").list_sessions(agent_name="helper"))

"""Cancelling through the official SDK, as the seed says: `Session.cancel()` cancels the
session and any running turn, is idempotent, and after it `create_turn()` raises. The SDK's
`Turn.cancel()` calls the same route, so it ends the session too. A cancelled turn ends
`cancelled` by the client at once, keeping what was said; the session stays readable."""

import pytest
from truefoundry_gateway_sdk.core.api_error import ApiError

from conftest import merged, message, run


def refused_turn(session) -> ApiError:
    with pytest.raises(ApiError) as refused:
        session.prepare_turn(input=message("are you there?")).execute(stream=False)
    return refused.value


def test_a_turn_cancelled_mid_stream_ends_cancelled_by_the_client_and_closes_the_session(session):
    turn = session.prepare_turn(input=message("/delay 50\n/words 400"))
    stream = turn.execute()
    seen = []
    for item in stream:
        seen.append((item.sequence_number, item.event))
        if item.event.type == "model.message.delta":
            turn.cancel()
            break
    # The cancel is answered once the turn has ended: what follows is refused at once.
    error = refused_turn(session)
    assert error.status_code == 422 and "cancelled" in error.body["error"]["message"], error.body
    seen += [(i.sequence_number, i.event) for i in stream]
    done = seen[-1][1]
    assert done.type == "turn.done" and [e.type for _, e in seen].count("turn.done") == 1
    assert done.state.status == "cancelled" and done.state.reason == "client-cancelled"
    [said] = merged(seen)
    assert said.content.startswith("w1") and not said.content.endswith("w400"), "stopped early, kept what it said"
    assert session.get_turn(turn.id).state.reason == "client-cancelled"
    assert [t.id for t in session.list_turns()] == [turn.id], "the refused turn started nothing"


def test_a_sessions_cancel_is_idempotent_and_no_turn_follows_it(client, session):
    paused, _ = run(session, message('/tool calculator {"expression": "1"}'))
    session.cancel()
    session.cancel()
    for attempt in (message("hello"), [{"type": "user.tool_approval", "thread_id": "main",
                                        "tool_call_id": paused.state.required_actions[0].tool_calls[0].id,
                                        "approval": {"status": "allow"}}]):
        with pytest.raises(ApiError) as refused:
            session.prepare_turn(input=attempt).execute(stream=False)
        assert refused.value.status_code == 422, refused.value.body
        assert f"session {session.id} is closed (archived, or cancelled" in refused.value.body["error"]["message"]
    # Still there, as it was: listed, readable, its turns and events kept.
    assert client.get_session(session.id).id == session.id
    assert session.id in [s.id for s in client.list_sessions(agent_name="helper", start_timestamp=session.created_at)]
    assert [t.id for t in session.list_turns()] == [paused.id]
    assert session.get_turn(paused.id).state.status == "done"


def test_a_failed_turn_ends_in_error_with_the_reason(session):
    turn, frames = run(session, message("/error model_overloaded_error"))
    state = frames[-1][1].state
    assert state.status == "error" and "told to fail" in state.message
    assert session.get_turn(turn.id).state.status == "error"
    later, _ = run(session, message("still here"))
    assert later.state.output.content == "echo: still here"

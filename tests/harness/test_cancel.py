"""Cancelling through the official SDK: a turn cancelled mid-stream ends `cancelled` by the
client at once, keeping what was said; a session's cancel is idempotent, also with nothing
running, and later turns work."""

from conftest import merged, message, run


def test_a_turn_cancelled_mid_stream_ends_cancelled_by_the_client(session):
    turn = session.prepare_turn(input=message("/delay 50\n/words 400"))
    stream = turn.execute()
    seen = []
    for item in stream:
        seen.append((item.sequence_number, item.event))
        if item.event.type == "model.message.delta":
            turn.cancel()
            break
    # The cancel is answered once the turn has ended: the next turn starts at once.
    after, _ = run(session, message("and now?"))
    assert after.state.output.content == "echo: and now?"
    seen += [(i.sequence_number, i.event) for i in stream]
    done = seen[-1][1]
    assert done.type == "turn.done" and [e.type for _, e in seen].count("turn.done") == 1
    assert done.state.status == "cancelled" and done.state.reason == "client-cancelled"
    [said] = merged(seen)
    assert said.content.startswith("w1") and not said.content.endswith("w400"), "stopped early, kept what it said"
    assert session.get_turn(turn.id).state.reason == "client-cancelled"


def test_a_sessions_cancel_is_idempotent_and_later_turns_work(session):
    session.cancel()
    session.cancel()
    assert list(session.list_turns()) == [], "nothing ran, nothing started"
    paused, _ = run(session, message('/tool calculator {"expression": "1"}'))
    session.cancel()
    assert session.get_turn(paused.id).state.status == "done", "a turn that waits for the client has ended"
    assert len(session.get_turn(paused.id).state.required_actions) == 1, "and still waits"
    turn, _ = run(session, [{"type": "user.tool_approval", "thread_id": "main",
                             "tool_call_id": paused.state.required_actions[0].tool_calls[0].id,
                             "approval": {"status": "allow"}}])
    assert turn.state.output.content == "tool results: calculator=1"


def test_a_failed_turn_ends_in_error_with_the_reason(session):
    turn, frames = run(session, message("/error model_overloaded_error"))
    state = frames[-1][1].state
    assert state.status == "error" and "told to fail" in state.message
    assert session.get_turn(turn.id).state.status == "error"
    later, _ = run(session, message("still here"))
    assert later.state.output.content == "echo: still here"

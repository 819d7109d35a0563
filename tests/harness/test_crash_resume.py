"""A turn that outlives its server, through the official SDK: killed (SIGKILL) while it
streams a reply, the server starts again and the turn goes on from its log. A subscriber
that resumes the turn's stream after the last frame it saw gets the new attempt, numbered
on, and one `turn.done`; the turn's list holds the whole reply once, no half message."""

import time

import pytest

from conftest import CONFIG, merged, message, sdk
from turnlog_server import own_server

WORDS = " ".join(f"w{i}" for i in range(1, 61))


@pytest.fixture
def killable():
    """A server of the test's own (killing it disturbs no other test)."""
    with own_server(CONFIG) as running:
        yield running


def test_a_turn_killed_mid_reply_resumes_its_stream_with_the_new_attempt(killable):
    session = sdk(killable.url).create_session(agent_name="helper")
    turn = session.prepare_turn(input=message("/delay 40\n/words 60"))
    stream = turn.execute()
    head = []
    for item in stream:
        head.append((item.sequence_number, item.event))
        if sum(e.type == "model.message.delta" for _, e in head) >= 3:
            break
    stream.close()
    assert "turn.done" not in [e.type for _, e in head], "killed mid-reply"
    last = head[-1][0]
    killable.kill()
    killable.start()

    deadline = time.monotonic() + 60
    tail = []
    for item in turn.stream(after_sequence_number=last):
        tail.append((item.sequence_number, item.event))
        assert time.monotonic() < deadline, f"the resumed turn did not end in 60 s: {[e.type for _, e in tail]}"
    numbers = [n for n, _ in tail]
    assert numbers and numbers[0] > last, f"resumed strictly after {last}: {numbers[:5]}"
    assert numbers == sorted(set(numbers)), f"increasing, none twice: {numbers}"
    assert not set(numbers) & {n for n, _ in head}, "no number of before the crash is given again"
    kinds = [e.type for _, e in tail]
    assert kinds.count("turn.done") == 1 and kinds[-1] == "turn.done", kinds

    before = {e.id for _, e in head if e.type == "model.message"}
    attempts = [m for m in merged(head + tail) if m.id not in before]
    assert [m.content for m in attempts] == [WORDS], "a new message whose deltas make the whole reply"
    [attempt] = attempts
    done = tail[-1][1].state
    assert done.status == "done" and done.required_actions == [], done
    assert done.output.id == attempt.id and done.output.content == WORDS

    replay = [(i.sequence_number, i.event.model_dump()) for i in turn.stream(after_sequence_number=0)]
    assert replay == [(n, e.model_dump()) for n, e in head + tail], "the log replays what was seen, across the crash"

    listed = list(turn.list_events())
    assert [e.type for e in listed] == ["model.message"], [e.type for e in listed]
    assert (listed[0].id, listed[0].content, listed[0].finish_reason) == (attempt.id, WORDS, "stop")

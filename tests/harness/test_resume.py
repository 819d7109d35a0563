"""Resuming a turn's stream through the official SDK: after a sequence number in the body or
in `Last-Event-Id`, mid-turn, a new subscription gives exactly the frames not yet seen; a
finished turn replays the same frames, to the same `turn.done`."""

import pytest
from truefoundry_gateway_sdk.errors import BadRequestError

from conftest import message


def frames(stream) -> list:
    return [(i.sequence_number, i.event.model_dump()) for i in stream]


def cut_short(session, seen: int):
    """A slow turn whose stream is read for `seen` frames and then dropped."""
    turn = session.prepare_turn(input=message("/delay 50\n/words 60"))
    stream = turn.execute()
    head = [(i.sequence_number, i.event.model_dump()) for _, i in zip(range(seen), stream)]
    stream.close()
    return turn, head


@pytest.mark.parametrize("how", ["after_sequence_number", "Last-Event-Id"])
def test_a_dropped_stream_resumes_with_exactly_what_it_missed(session, how):
    turn, head = cut_short(session, 6)
    assert session.get_turn(turn.id).state.status == "running", "the turn goes on without its client"
    last = head[-1][0]
    if how == "after_sequence_number":
        tail = frames(turn.stream(after_sequence_number=last))
    else:
        tail = frames(turn.stream(request_options={"additional_headers": {"Last-Event-Id": str(last)}}))
    assert tail[0][0] > last and tail[-1][1]["type"] == "turn.done"
    whole = frames(turn.stream(after_sequence_number=0))
    assert head + tail == whole, "nothing lost, nothing twice, in the same order"
    text = "".join(e.get("content") or "" for _, e in whole if e["type"] == "model.message.delta")
    assert text == " ".join(f"w{i}" for i in range(1, 61))


def test_a_finished_turn_replays_its_frames_from_any_point(session):
    turn = session.prepare_turn(input=message("/tool calculator {\"expression\": \"6*7\"}"))
    live = frames(turn.execute())
    assert live[-1][1]["type"] == "turn.done"
    for k in range(len(live)):
        assert frames(turn.stream(after_sequence_number=live[k][0])) == live[k + 1:]
    assert frames(turn.stream()) == live, "no cursor: from the start"


def test_a_sequence_number_not_in_the_turn_is_refused(session):
    turn = session.prepare_turn(input=message("hi"))
    live = frames(turn.execute())
    with pytest.raises(BadRequestError) as refused:
        list(turn.stream(after_sequence_number=live[-1][0] + 1000))
    assert "after_sequence_number" in refused.value.body.error.message

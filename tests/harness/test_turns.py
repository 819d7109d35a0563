"""Turns through the official SDK: a streamed turn frame by frame, turns that chain, a turn
answered at once and polled to its end, turns listed and read back, a finished turn's
events in both orders and in pages, and a session's events across its turns."""

import time

import pytest
from truefoundry_gateway_sdk.errors import PreconditionFailedError

from conftest import merged, message, run, types


def test_a_streamed_turn_opens_with_turn_created_folds_its_deltas_and_ends_once(session):
    turn, frames = run(session, message("hello there"))
    numbers = [n for n, _ in frames]
    assert numbers == sorted(set(numbers)), "every frame has its own increasing integer id"
    assert types(frames)[0] == "turn.created" and types(frames).count("turn.done") == 1
    assert types(frames)[-1] == "turn.done", "the stream ends after turn.done"
    created = frames[0][1]
    assert created.turn_id == turn.id and created.previous_turn_id is None
    assert created.state.status == "running" and created.created_by.subject_id == "alice"
    assert [(i.type, i.content) for i in created.input] == [("user.message", "hello there")]
    # The message's first frame is empty and names it; its deltas carry its id.
    first = next(e for _, e in frames if e.type == "model.message")
    assert first.content is None and types(frames).index("model.message") < types(frames).index("model.message.delta")
    [whole] = merged(frames)
    assert (whole.content, whole.finish_reason, whole.usage.output_tokens) == ("echo: hello there", "stop", 3)
    done = frames[-1][1].state
    assert done.status == "done" and done.required_actions == []
    assert done.output.content == "echo: hello there" and done.output.id == whole.id
    assert turn.state.status == "done", "the prepared turn follows its stream"


def test_turns_chain_and_list_newest_first(session):
    first, _ = run(session, message("one"))
    second, frames = run(session, message("two"))
    assert frames[0][1].previous_turn_id == first.id
    listed = list(session.list_turns(limit=1))
    assert [t.id for t in listed] == [second.id, first.id]
    assert [t.previous_turn_id for t in listed] == [first.id, None]
    read = session.get_turn(second.id)
    assert read.state.status == "done" and read.state.output.content == "echo: two"
    assert read.input[0].content == "two" and read.created_at == frames[0][1].created_at


def test_a_turn_not_streamed_is_answered_running_and_polled_to_its_end(session):
    turn = session.prepare_turn(input=message("/delay 20\n/words 5"))
    state = turn.execute(stream=False)
    assert state.status == "done" and state.output.content == "w1 w2 w3 w4 w5"
    assert session.get_turn(turn.id).state.status == "done"


def test_a_turn_names_the_turn_it_follows_or_branches_from_an_earlier_one(server, session):
    import httpx
    from truefoundry_gateway_sdk.errors import NotFoundError

    from conftest import ALICE

    def conversation():
        history = httpx.get(f"{server}/sessions/{session.id}/history?type=full",
                            headers={"Authorization": f"Bearer {ALICE}"}).json()["history"]["full"]
        return [m["content"] for m in history]

    first, _ = run(session, message("one"))
    second, frames = run(session, message("two"), previous_turn_id=first.id)
    assert frames[0][1].previous_turn_id == first.id
    with pytest.raises(PreconditionFailedError) as refused:
        run(session, message("three"), previous_turn_id="none")
    assert second.id in refused.value.body.error.message
    with pytest.raises(NotFoundError):
        run(session, message("three"), previous_turn_id="turn_01J00000000000000000000000")
    assert [t.id for t in session.list_turns()] == [second.id, first.id], "nothing was started"

    # An earlier turn: the new turn goes on from the conversation as that turn left it.
    branch, frames = run(session, message("again"), previous_turn_id=first.id)
    assert frames[0][1].previous_turn_id == first.id
    assert session.get_turn(branch.id).previous_turn_id == first.id
    assert conversation() == ["one", "echo: one", "again", "echo: again"]
    assert [t.id for t in session.list_turns()] == [branch.id, second.id, first.id], "the other branch is kept"
    # `auto` follows the branch.
    after, frames = run(session, message("on"))
    assert frames[0][1].previous_turn_id == branch.id
    assert conversation() == ["one", "echo: one", "again", "echo: again", "on", "echo: on"]
    # The session's events follow the conversation back through the branch point.
    assert [i.turn_id for i in session.list_events() if i.event.type == "turn.created"] == [after.id, branch.id, first.id]


def test_a_finished_turns_events_list_whole_in_either_order_and_in_pages(session):
    turn, frames = run(session, message("/think about the time\n/tool current_time {}"))
    ascending = list(turn.list_events(limit=1))
    assert [e.type for e in ascending] == ["model.message", "tool.response", "model.message"]
    calling, answer, final = ascending
    assert calling.reasoning_content == "about the time" and calling.finish_reason == "tool_calls"
    assert calling.tool_calls[0].function.name == "current_time"
    assert answer.tool_call_id == calling.tool_calls[0].id
    assert final.content.startswith("tool results: current_time=")
    assert [e.model_dump() for e in merged(frames)] == [calling.model_dump(), final.model_dump()], (
        "the stream's deltas fold to exactly what the list holds"
    )
    pages = list(turn.list_events(limit=2).iter_pages())
    assert [len(p.items) for p in pages] == [2, 1]
    descending = list(turn.list_events(limit=2, order="desc"))
    assert [e.id for e in descending] == [e.id for e in reversed(ascending)]


def test_a_running_turns_events_are_refused_until_it_ends(session):
    turn = session.prepare_turn(input=message("/delay 50\n/words 40"))
    stream = turn.execute()
    next(stream)
    with pytest.raises(PreconditionFailedError) as refused:
        list(turn.list_events())
    assert "running" in refused.value.body.error.message
    turn.cancel()
    rest = [i.event for i in stream]
    assert rest[-1].type == "turn.done" and rest[-1].state.reason == "client-cancelled"
    assert [e.type for e in turn.list_events()] == ["model.message"], "what it said before the cancel"


def test_a_sessions_events_list_newest_first_across_its_turns(session):
    first, _ = run(session, message("one"))
    second, _ = run(session, message("two"))
    items = list(session.list_events(limit=2))
    assert [(i.turn_id, i.event.type) for i in items] == [
        (second.id, "turn.done"), (second.id, "model.message"), (second.id, "turn.created"),
        (first.id, "turn.done"), (first.id, "model.message"), (first.id, "turn.created"),
    ]
    older = list(session.list_events(last_turn_id=first.id))
    assert [i.turn_id for i in older] == [first.id] * 3
    # A turn that runs is left out: its stream has its events.
    running = session.prepare_turn(input=message("/delay 50\n/words 40"))
    stream = running.execute()
    next(stream)
    assert [i.event.id for i in session.list_events()] == [i.event.id for i in items]
    running.cancel()
    assert [i.event.type for i in stream][-1] == "turn.done"
    assert [i.turn_id for i in session.list_events(limit=3)][:3] == [running.id] * 3



def post_turn(server, session, content) -> "httpx.Response":
    """A turn posted as the seed's documents show it (the SDK's own types have no
    `file_upload`: it refuses the part before sending it)."""
    import httpx

    from conftest import ALICE

    body = {"input": [{"type": "user.message", "content": content}], "stream": False}
    return httpx.post(f"{server}/v1/agents/sessions/{session.id}/turns", json=body,
                      headers={"Authorization": f"Bearer {ALICE}"}, timeout=30)


def test_the_seeds_file_upload_part_is_taken_and_read_back_as_the_sdks_file_part(server, session):
    png = "data:image/png;base64,iVBORw0KGgo="
    upload = {"type": "file_upload", "file": {"filename": "shot.png", "file_data": png}}
    posted = post_turn(server, session, [{"type": "text", "text": "see"}, upload])
    assert posted.status_code == 200, posted.text
    turn_id = posted.json()["data"]["id"]
    done = session.get_turn(turn_id)
    deadline = time.monotonic() + 10
    while done.state.status == "running" and time.monotonic() < deadline:
        time.sleep(0.02)
        done = session.get_turn(turn_id)
    assert done.state.status == "done" and done.state.output.content == "echo: see"
    [item] = done.input
    text, file = item.content
    assert (text.type, text.text) == ("text", "see")
    assert (file.type, file.name, file.data) == ("file", "shot.png", png), "as the SDK's file part"


def test_a_file_upload_part_that_is_not_the_seeds_shape_is_refused_naming_it(server, session):
    for upload in ({"type": "file_upload", "file": {"filename": "a.png"}},
                   {"type": "file_upload", "file": {"filename": "a.png", "file_data": "not a data uri"}},
                   {"type": "file_upload", "filename": "a.png", "file_data": "data:image/png;base64,AAAA"}):
        refused = post_turn(server, session, [upload])
        assert refused.status_code == 400, refused.text
        assert "input[0].content[0]" in refused.json()["error"]["message"], refused.text
    assert list(session.list_turns()) == []

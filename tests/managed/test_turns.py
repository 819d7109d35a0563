"""Turns through the official SDK, strict: a streamed turn in order, a custom tool round
trip, confirmations allowed and denied, an interrupt mid-turn, a message queued while a turn
runs, and `event_deltas` previews."""

import anthropic

from conftest import message, said, turn, until_idle


def kinds(events):
    return [e.type for e in events]


def test_a_streamed_turn_arrives_in_order(client, session):
    events = turn(client, session.id, [message("hello there")])
    assert kinds(events) == [
        "user.message",
        "session.status_running",
        "span.model_request_start",
        "agent.message",
        "span.model_request_end",
        "session.status_idle",
    ]
    assert said(events) == ["echo: hello there"]
    assert events[-1].stop_reason.type == "end_turn"
    end = events[4]
    assert end.model_request_start_id == events[2].id
    assert end.model_usage.output_tokens == 3
    assert client.beta.sessions.retrieve(session.id).usage.output_tokens == 3


def test_a_custom_tool_round_trip(client, session):
    waiting = turn(client, session.id, [message('/tool get_weather {"city": "Oslo"}')])
    call = next(e for e in waiting if e.type == "agent.custom_tool_use")
    assert (call.name, call.input) == ("get_weather", {"city": "Oslo"})
    assert waiting[-1].stop_reason.type == "requires_action"
    assert waiting[-1].stop_reason.event_ids == [call.id]
    assert client.beta.sessions.retrieve(session.id).status == "idle"

    result = {"type": "user.custom_tool_result", "custom_tool_use_id": call.id, "content": [{"type": "text", "text": "cold"}]}
    answered = turn(client, session.id, [result])
    assert said(answered) == ["tool results: get_weather=cold"]
    assert answered[-1].stop_reason.type == "end_turn"


def test_a_confirmation_allowed_and_denied(client, environment):
    session = client.beta.sessions.create(agent="assistant", environment_id=environment.id)
    asking = turn(client, session.id, [message('/tool calculator {"expression": "6*7"}')])
    call = next(e for e in asking if e.type == "agent.tool_use")
    assert (call.name, call.evaluated_permission) == ("calculator", "ask")
    allowed = turn(client, session.id, [{"type": "user.tool_confirmation", "tool_use_id": call.id, "result": "allow"}])
    result = next(e for e in allowed if e.type == "agent.tool_result")
    assert (result.tool_use_id, result.content[0].text, result.is_error) == (call.id, "42", False)
    assert said(allowed) == ["tool results: calculator=42"]

    asking = turn(client, session.id, [message('/tool calculator {"expression": "1/0"}')])
    call = next(e for e in asking if e.type == "agent.tool_use")
    deny = {"type": "user.tool_confirmation", "tool_use_id": call.id, "result": "deny", "deny_message": "not now"}
    denied = turn(client, session.id, [deny])
    assert said(denied) == ["tool results: calculator=Tool call denied: not now"]


def test_resolving_some_of_several_calls_leaves_the_rest_waiting(client, session):
    both = '/tool get_weather {"city": "Oslo"}\n/tool get_weather {"city": "Rome"}'
    waiting = turn(client, session.id, [message(both)])
    calls = [e.id for e in waiting if e.type == "agent.custom_tool_use"]
    assert waiting[-1].stop_reason.event_ids == calls
    first = {"type": "user.custom_tool_result", "custom_tool_use_id": calls[0], "content": [{"type": "text", "text": "a"}]}
    still = turn(client, session.id, [first])
    assert still[-1].stop_reason.type == "requires_action"
    assert still[-1].stop_reason.event_ids == calls[1:]
    second = dict(first, custom_tool_use_id=calls[1], content=[{"type": "text", "text": "b"}])
    assert said(turn(client, session.id, [second])) == ["tool results: get_weather=a; get_weather=b"]


def test_an_interrupt_stops_the_turn_at_once(client, session):
    stream = client.beta.sessions.events.stream(session.id, event_deltas=["agent.message"])
    try:
        client.beta.sessions.events.send(session.id, events=[message("/delay 50\n/words 500")])
        events = []
        for event in stream:
            events.append(event)
            if event.type == "event_delta":
                client.beta.sessions.events.send(session.id, events=[{"type": "user.interrupt"}])
                break
        events += until_idle(stream)
    finally:
        stream.close()
    assert events[-1].stop_reason.type == "end_turn", "an interrupted turn ends its turn, as Anthropic's does"
    assert "user.interrupt" in kinds(events)
    text = "".join(said(events))
    assert text.startswith("w1") and "w500" not in text, "what was said before the interrupt is kept"


def test_a_message_sent_while_a_turn_runs_waits_for_the_next(client, session):
    turn(client, session.id, [message("a turn first")])
    stream = client.beta.sessions.events.stream(session.id)
    try:
        client.beta.sessions.events.send(session.id, events=[message("/delay 20\n/words 10")])
        events = [next(iter(stream)) for _ in range(2)]
        assert kinds(events) == ["user.message", "session.status_running"]
        queued = client.beta.sessions.events.send(session.id, events=[message("second")])
        assert queued.data[0].processed_at is None, "echoed unprocessed: it waits"
        events += until_idle(stream)
        assert events[-1].stop_reason.type == "end_turn"
        events += until_idle(stream)
    finally:
        stream.close()
    assert said(events) == ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", "echo: second"]
    listed = list(client.beta.sessions.events.list(session.id, types=["user.message"]))
    assert listed[2].id == queued.data[0].id
    assert listed[2].processed_at is not None, "it lists as processed once a turn took it"


def test_previews_join_to_the_final_message_and_never_list(client, session):
    events = turn(client, session.id, [message("/delay 5\n/think hm\n/words 12")], event_deltas=["agent.message", "agent.thinking"])
    starts = [e for e in events if e.type == "event_start"]
    assert [s.event.type for s in starts] == ["agent.thinking", "agent.message"]
    final = next(e for e in events if e.type == "agent.message")
    thinking = next(e for e in events if e.type == "agent.thinking")
    assert starts[0].event.id == thinking.id and starts[1].event.id == final.id
    deltas = [e for e in events if e.type == "event_delta"]
    assert all(d.event_id == final.id for d in deltas) and len(deltas) > 1
    assert "".join(d.delta.content.text for d in deltas) == said([final])[0]
    listed = kinds(client.beta.sessions.events.list(session.id))
    assert "event_start" not in listed and "event_delta" not in listed


def test_an_unknown_delta_kind_is_refused(client, session):
    try:
        client.beta.sessions.events.stream(session.id, event_deltas=["agent.tool_use"])
    except anthropic.BadRequestError as refused:
        assert "event_deltas" in refused.body["error"]["message"]
    else:
        raise AssertionError("event_deltas=agent.tool_use was accepted")

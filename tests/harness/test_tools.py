"""Tools through the official SDK: a paused turn is `done` with the actions it waits for;
the next turn answers them and chains to it: an approval allowed, one denied with a reason
the model is told, a client tool's response. Input that does not fit is refused."""

import pytest
from truefoundry_gateway_sdk.core.api_error import ApiError
from truefoundry_gateway_sdk.errors import BadRequestError, PreconditionFailedError

from conftest import answers, merged, message, run, types

CALCULATE = message('/tool calculator {"expression": "2+3"}')


def test_an_approval_allowed_runs_the_tool_in_the_next_turn(session):
    paused, frames = run(session, CALCULATE)
    state = paused.state
    assert state.status == "done" and types(frames)[-2:] == ["tool.approval_required", "turn.done"]
    [action] = state.required_actions
    [asked] = merged(frames)
    assert action.type == "tool.approval_required" and action.thread_id == "main"
    assert action.tool_calls[0].id == asked.tool_calls[0].id, "the call the model made"
    assert action.tool_calls[0].source_event_id == asked.id, "named by the message that carried it"
    assert asked.tool_calls[0].function.name == "calculator" and asked.finish_reason == "tool_calls"

    resumed, frames = run(session, answers(paused))
    created = frames[0][1]
    assert created.previous_turn_id == paused.id
    assert created.input[0].type == "user.tool_approval" and created.input[0].approval.status == "allow"
    responses = [e for _, e in frames if e.type == "tool.response"]
    assert [(r.tool_call_id, r.content) for r in responses] == [(action.tool_calls[0].id, "5")]
    assert resumed.state.output.content == "tool results: calculator=5"


def test_a_denial_and_its_reason_reach_the_model(session):
    paused, _ = run(session, CALCULATE)
    resumed, frames = run(session, answers(paused, allow=False, reason="not today"))
    assert frames[0][1].input[0].approval.reason == "not today"
    assert [e.content for _, e in frames if e.type == "tool.response"] == ["Tool call denied: not today"]
    assert types(frames).index("turn.created") < types(frames).index("tool.response")
    assert resumed.state.output.content == "tool results: calculator=Tool call denied: not today"


def test_a_client_tool_is_answered_with_its_response(session):
    paused, frames = run(session, message('/tool get_weather {"city": "Paris"}'))
    [action] = paused.state.required_actions
    assert action.type == "tool.response_required"
    [asked] = merged(frames)
    assert asked.tool_calls[0].function.arguments == '{"city":"Paris"}'
    resumed, frames = run(session, answers(paused, response="Sunny, 21 C"))
    assert frames[0][1].input[0].content == "Sunny, 21 C"
    assert resumed.state.output.content == "tool results: get_weather=Sunny, 21 C"


def test_both_kinds_wait_together_and_are_answered_together(session):
    paused, _ = run(session, message('/tool calculator {"expression": "1+1"}\n/tool get_weather {"city": "Oslo"}'))
    assert [a.type for a in paused.state.required_actions] == ["tool.approval_required", "tool.response_required"]
    resumed, _ = run(session, answers(paused, response="Snow"))
    assert resumed.state.output.content == "tool results: calculator=2; get_weather=Snow"


def test_input_that_does_not_fit_is_refused_and_stores_nothing(session):
    paused, _ = run(session, CALCULATE)
    approve = answers(paused)
    with pytest.raises(BadRequestError) as mixed:
        run(session, message("and also") + approve)
    assert "cannot be mixed" in mixed.value.body.error.message
    with pytest.raises(ApiError) as waiting:
        run(session, message("ignore the calculator"))
    assert waiting.value.status_code == 422 and "calculator" in waiting.value.body["error"]["message"]
    wrong_kind = [{"type": "user.tool_response", "thread_id": "main", "tool_call_id": approve[0]["tool_call_id"],
                   "content": "5"}]
    with pytest.raises(ApiError) as kind:
        run(session, wrong_kind)
    assert kind.value.status_code == 422 and "permission" in kind.value.body["error"]["message"]
    assert [t.id for t in session.list_turns()] == [paused.id]
    resumed, _ = run(session, approve)
    assert resumed.state.output.content == "tool results: calculator=5"


def test_a_turn_while_another_runs_is_refused_not_retried(server, session):
    from conftest import sdk

    retrying = sdk(server, max_retries=2).get_session(session.id)
    slow = session.prepare_turn(input=message("/delay 50\n/words 40"))
    stream = slow.execute()
    next(stream)
    with pytest.raises(PreconditionFailedError) as busy:
        retrying.prepare_turn(input=message("me too")).execute(stream=False)
    assert slow.id in busy.value.body.error.message
    slow.cancel()
    assert [i.event.type for i in stream][-1] == "turn.done"
    assert [t.id for t in session.list_turns()] == [slow.id]


def test_answers_may_be_sent_without_a_stream_and_polled(session):
    paused, _ = run(session, message('/tool get_weather {"city": "Lima"}'))
    state = session.prepare_turn(input=answers(paused, response="Mild")).execute(stream=False)
    assert state.status == "done" and state.output.content == "tool results: get_weather=Mild"

"""Outcomes through the official SDK: after a turn, the session's outcome is graded by a model
call between `span.outcome_evaluation_start` and `span.outcome_evaluation_end` (the SDK's own
event types), before the session goes idle; the verdict shows in the session's
`outcome_evaluations`. The scripted grader answers what the outcome's `/say` line tells it."""

from conftest import message, turn


def outcome(description: str, **more) -> dict:
    return {"type": "user.define_outcome", "description": description,
            "rubric": {"type": "text", "content": "the user was greeted"}, **more}


def evaluations(events: list) -> list:
    return [e for e in events if e.type.startswith("span.outcome_evaluation")]


def test_a_satisfied_outcome_is_graded_once_after_the_turn_and_shows_on_the_session(client, session):
    [defined] = client.beta.sessions.events.send(session.id, events=[outcome("/say SATISFIED: a greeting was given")]).data
    events = turn(client, session.id, [message("hello")])
    start, end = evaluations(events)
    assert (start.type, end.type) == ("span.outcome_evaluation_start", "span.outcome_evaluation_end")
    assert start.outcome_id == end.outcome_id == defined.outcome_id
    assert (start.iteration, end.iteration) == (0, 0)
    assert end.outcome_evaluation_start_id == start.id
    assert (end.result, end.explanation) == ("satisfied", "a greeting was given")
    assert end.usage.input_tokens > 0, "grading is a model call, and costs"
    kinds = [e.type for e in events]
    assert kinds.index("agent.message") < kinds.index("span.outcome_evaluation_start") < kinds.index("session.status_idle")
    [evaluated] = client.beta.sessions.retrieve(session.id).outcome_evaluations
    assert (evaluated.type, evaluated.outcome_id, evaluated.result) == ("outcome_evaluation", defined.outcome_id, "satisfied")
    assert evaluated.description == "/say SATISFIED: a greeting was given"
    assert evaluated.completed_at is not None and evaluated.explanation == "a greeting was given"
    # A verdict ends it: the next turn grades nothing.
    assert evaluations(turn(client, session.id, [message("and again")])) == []


def test_an_outcome_that_needs_revision_is_graded_after_each_turn_until_its_iterations_run_out(client, session):
    client.beta.sessions.events.send(session.id, events=[outcome("/say NEEDS_REVISION: not yet", max_iterations=2)])
    first = evaluations(turn(client, session.id, [message("one")]))[-1]
    assert (first.result, first.iteration, first.explanation) == ("needs_revision", 0, "not yet")
    [running] = client.beta.sessions.retrieve(session.id).outcome_evaluations
    assert (running.result, running.iteration, running.completed_at) == ("running", 0, None)
    second = evaluations(turn(client, session.id, [message("two")]))[-1]
    assert (second.result, second.iteration) == ("max_iterations_reached", 1)
    [ended] = client.beta.sessions.retrieve(session.id).outcome_evaluations
    assert (ended.result, ended.iteration) == ("max_iterations_reached", 1) and ended.completed_at is not None
    assert evaluations(turn(client, session.id, [message("three")])) == []


def test_a_new_outcome_replaces_the_one_before_and_the_list_keeps_both_verdicts(client, session):
    client.beta.sessions.events.send(session.id, events=[outcome("/say FAILED: cannot be done")])
    assert evaluations(turn(client, session.id, [message("try")]))[-1].result == "failed"
    client.beta.sessions.events.send(session.id, events=[outcome("/say SATISFIED: done")])
    assert evaluations(turn(client, session.id, [message("try again")]))[-1].result == "satisfied"
    listed = client.beta.sessions.retrieve(session.id).outcome_evaluations
    assert [e.result for e in listed] == ["failed", "satisfied"]
    # The stored log holds the same, as every view reads it.
    stored = [e.type for e in client.beta.sessions.events.list(session.id)]
    assert stored.count("span.outcome_evaluation_end") == 2

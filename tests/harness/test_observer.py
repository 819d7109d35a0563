"""One log under every view: an observer on the native event stream of a session the
harness drives sees each step live, as the log has it, and the harness's sequence numbers
name the log's turn sequence numbers."""

import json
import queue
import threading

import httpx

from conftest import ALICE, merged, message, run


def observe(server: str, session_id: str, events: "queue.Queue"):
    """Reads the session's native SSE stream into `events` (each frame's JSON data), every
    delta as the log has it (not merged)."""
    headers = {"Authorization": f"Bearer {ALICE}"}
    url = f"{server}/sessions/{session_id}/events/stream?delta_flush_interval_ms=0"
    with httpx.stream("GET", url, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                events.put(event)
                if event["type"] == "session.status_idle" and event["stop_reason"]["type"] != "requires_action":
                    return


class Observer:
    """The native stream of a session, read on a thread; `until` waits for an event."""

    def __init__(self, server: str, session_id: str):
        self.queue: queue.Queue = queue.Queue()
        self.seen: list = []
        self.thread = threading.Thread(target=observe, args=(server, session_id, self.queue), daemon=True)
        self.thread.start()

    def until(self, kind: str) -> dict:
        while True:
            event = self.queue.get(timeout=20)
            self.seen.append(event)
            if event["type"] == kind:
                return event


def test_a_native_observer_sees_a_harness_turn_live(server, session):
    observer = Observer(server, session.id)
    observer.until("session.created")

    turn = session.prepare_turn(input=message("/delay 40\n/words 50"))
    stream = turn.execute()
    harness = [(i.sequence_number, i.event) for i in [next(stream)]]
    # The observer has the turn's first delta while the turn still runs: live, not replayed.
    first_delta = observer.until("agent.message.delta")
    assert session.get_turn(turn.id).state.status == "running"
    assert first_delta["turn_id"] == turn.id
    harness += [(i.sequence_number, i.event) for i in stream]
    observer.until("session.status_idle")
    native = [e for e in observer.seen if e["type"] != "session.created"]
    assert [e["type"] for e in native][:3] == ["turn.started", "user.message", "session.status_running"]
    assert {e["turn_id"] for e in native} == {turn.id}
    native_text = "".join(e["delta"] for e in native if e["type"] == "agent.message.delta")
    [whole] = merged(harness)
    assert whole.content == native_text == " ".join(f"w{i}" for i in range(1, 51))
    numbers = {e["turn_sequence_number"] for e in native}
    assert {n // 10 for n, _ in harness} <= numbers, (
        "each harness frame comes from an event of the turn, named by its turn sequence number"
    )


def test_a_paused_and_resumed_turn_shows_on_the_native_stream_as_stored(server, session):
    paused, _ = run(session, message('/tool get_weather {"city": "Rome"}'))
    call = paused.state.required_actions[0].tool_calls[0].id
    resumed, _ = run(session, [{"type": "user.tool_response", "thread_id": "main", "tool_call_id": call,
                                "content": "Warm"}])
    log = httpx.get(f"{server}/sessions/{session.id}/events", headers={"Authorization": f"Bearer {ALICE}"},
                    params={"limit": 100}).json()["data"]
    [use] = [e for e in log if e["type"] == "agent.custom_tool_use"]
    [result] = [e for e in log if e["type"] == "user.custom_tool_result"]
    assert use["turn_id"] == paused.id and use["tool_call_id"] == call
    assert result["turn_id"] == resumed.id and result["custom_tool_use_id"] == use["id"]
    assert result["tool_call_id"] == call and result["content"] == [{"type": "text", "text": "Warm"}]

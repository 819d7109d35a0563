"""What the tests read of turnlog, over plain HTTP: AAP turns (`POST /sessions/{id}/turns`,
SSE), the native log (`GET /sessions/{id}/events`) and its live stream."""

import json
import threading
import time

import httpx

TIMEOUT = httpx.Timeout(120, connect=10)


def create(url: str, agent: str, tools: list | None = None) -> str:
    body = {"agent": {"name": agent}} | ({"tools": tools} if tools else {})
    response = httpx.post(f"{url}/sessions", json=body, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["sessionId"]


def frames(lines):
    """SSE frames as (event, data as JSON) from an iterator of lines."""
    name, data = None, []
    for line in lines:
        if line == "":
            if data:
                yield name, json.loads("\n".join(data))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def aap_turn(url: str, session: str, messages, on_frame=None) -> list[tuple[str, dict]]:
    """An AAP delta turn to its `turn_stop`: every frame, each also given to `on_frame`
    (with the time it arrived) as it comes."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    body = {"stream": "delta", "messages": messages}
    out = []
    with httpx.stream("POST", f"{url}/sessions/{session}/turns", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.read().decode()
        for frame in frames(response.iter_lines()):
            out.append(frame)
            if on_frame:
                on_frame(frame, time.monotonic())
            if frame[0] == "turn_stop":
                break
    return out


def text_of(frames_) -> str:
    return "".join(data["delta"] for name, data in frames_ if name == "text_delta")


def stop_of(frames_) -> str:
    assert frames_[-1][0] == "turn_stop", frames_
    return frames_[-1][1]["stopReason"]


def events(url: str, session: str) -> list[dict]:
    """The session's whole log, oldest first."""
    out, after = [], None
    while True:
        params = {"limit": 1000} | ({"after_id": after} if after else {})
        page = httpx.get(f"{url}/sessions/{session}/events", params=params, timeout=30).json()
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["last_id"]


def post_events(url: str, session: str, *items: dict) -> list[dict]:
    response = httpx.post(f"{url}/sessions/{session}/events", json={"events": list(items)}, timeout=30)
    assert response.status_code in (200, 201), response.text
    return response.json()["data"]


def last_turn(log: list[dict]) -> list[dict]:
    """The events of the log's last turn, from its `turn.started`."""
    start = max(i for i, e in enumerate(log) if e["type"] == "turn.started")
    turn = log[start]["turn_id"]
    return [e for e in log[start:] if e.get("turn_id") == turn]


class NativeStream:
    """The native live stream of a session from `after_id`, read on a thread, until
    `session.status_idle` (or `terminated`)."""

    def __init__(self, url: str, session: str, after_id: str | None = None):
        self.events: list[tuple[dict, float]] = []
        self.opened = threading.Event()
        self.done = threading.Event()
        # Every delta as the log has it, not merged by the stream's 50 ms default.
        params = {"delta_flush_interval_ms": 0} | ({"after_id": after_id} if after_id else {})
        self.thread = threading.Thread(target=self._read, args=(url, session, params), daemon=True)
        self.thread.start()
        assert self.opened.wait(30), "the native stream did not open"

    def _read(self, url, session, params):
        with httpx.stream("GET", f"{url}/sessions/{session}/events/stream", params=params, timeout=TIMEOUT) as r:
            assert r.status_code == 200
            self.opened.set()
            for name, data in frames(r.iter_lines()):
                self.events.append((data, time.monotonic()))
                if name in ("session.status_idle", "terminated"):
                    break
        self.done.set()

    def wait(self, timeout: float = 120) -> list[dict]:
        assert self.done.wait(timeout), "the native stream did not see the turn end"
        return [event for event, _ in self.events]

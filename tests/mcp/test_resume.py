"""Durable turns against the real binary: turnlog is SIGKILLed while an MCP call runs (after
its `agent.tool_use`, before its result), started again over the same data dir, and goes on
with the turn by itself. A call that may run twice (the server annotates the tool
`idempotentHint` or `readOnlyHint`, or the config declares the server `idempotent = true`)
runs again; any other is answered as interrupted and not run again. The calls go to
`counting_server.py`, which counts the calls it starts in a file per tool."""

import os
import pathlib
import signal
import sys
import tempfile
import time

import pytest
from conftest import Client, of_type
from turnlog_server import Server

COUNTING = str(pathlib.Path(__file__).resolve().parent / "counting_server.py")

# What the log answers for a call that was interrupted and not run again.
INTERRUPTED = (
    "Tool call interrupted: the server stopped while this call was running, so it may or may not have "
    "taken effect. It was not run again."
)


def config(counts: pathlib.Path) -> str:
    """An agent with two counting servers: `counting`, which turnlog trusts as far as its
    tools' annotations go, and `trusted`, which the config declares idempotent. Each counts
    in a folder of its own."""
    return f"""
[agents.counting]
model = {{ provider = "scripted", name = "scripted" }}

[agents.counting.mcp_servers.counting]
command = "{sys.executable}"
args = ["{COUNTING}", "{counts / 'counting'}"]
permission = "allow"

[agents.counting.mcp_servers.trusted]
command = "{sys.executable}"
args = ["{COUNTING}", "{counts / 'trusted'}"]
permission = "allow"
idempotent = true
"""


def counting_processes(counts: pathlib.Path):
    """The counting servers of this test (their command line names its own folder): pids."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if COUNTING in command and str(counts) in command and state != "Z":
            out.append(int(entry))
    return out


def end_counting_processes(counts: pathlib.Path):
    """SIGKILLs the counting servers of this test that still run (the one whose call was cut
    off outlives turnlog: it sleeps on), and waits until they are gone."""
    for pid in counting_processes(counts):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while counting_processes(counts):
        assert time.monotonic() < deadline, "the counting servers did not die of SIGKILL within 10 s"
        time.sleep(0.05)


class Rig:
    """A turnlog of its own over a temp dir, with the counting servers."""

    def __init__(self, root: str):
        self.root = pathlib.Path(root)
        self.counts = self.root / "counts"
        for server in ("counting", "trusted"):
            (self.counts / server).mkdir(parents=True)
        self.server = Server(root, config(self.counts))

    def client(self) -> Client:
        return Client(self.server.url)

    def starts(self, server: str, tool: str) -> list:
        """The calls of `tool` that began, each as the pid of the server process that ran it."""
        path = self.counts / server / tool
        return path.read_text().splitlines() if path.exists() else []

    def call(self, server: str, tool: str):
        """Makes the model call `server__tool` (sleeping 30 s): the session and its log once the
        call is in the server's handler."""
        client = self.client()
        session = client.session("counting")
        client.post(session, {"type": "user.message", "content": f'/tool {server}__{tool} {{"seconds": 30}}'})
        deadline = time.monotonic() + 20
        while not self.starts(server, tool):
            assert time.monotonic() < deadline, f"{server}__{tool} did not start within 20 s: {client.events(session)}"
            time.sleep(0.02)
        # The call is logged before it is made.
        return session, client.wait_for(session, lambda events: of_type(events, "agent.tool_use"), what="the call's agent.tool_use")

    def call_and_crash(self, server: str, tool: str):
        """`call`, then SIGKILLs turnlog while the call runs."""
        session, before = self.call(server, tool)
        self.server.kill()
        return session, before

    def resume(self, session: str):
        """Starts turnlog again over the same data dir (and address): the log once the resumed
        turn has stopped."""
        self.server.start()
        return self.client().wait_for(
            session, lambda events: of_type(events, "session.status_idle"), seconds=30, what="the resumed turn's end"
        )

    def close(self):
        if self.server.process.poll() is None:
            self.server.stop()
        end_counting_processes(self.counts)


@pytest.fixture
def rig():
    with tempfile.TemporaryDirectory() as root:
        running = Rig(root)
        try:
            yield running
        finally:
            running.close()


def check_crashed_mid_call(before, name: str):
    """The log as turnlog died: the call made, no result, the turn still running. Its call."""
    [use] = of_type(before, "agent.tool_use")
    assert use["name"] == name, use
    assert of_type(before, "agent.tool_result") == [], "the kill landed before the call's result"
    assert of_type(before, "session.status_idle") == [], "the kill landed while the turn ran"
    return use


def check_one_turn_resumed_once(events, use) -> dict:
    """One turn, which was resumed once and ended `end_turn` without an error: its
    `turn.resumed`."""
    [started] = of_type(events, "turn.started")
    [resumed] = of_type(events, "turn.resumed")
    assert resumed["turn_id"] == started["turn_id"] == use["turn_id"], (resumed, use)
    assert resumed["attempt"] == 1, resumed
    assert resumed.get("discarded", []) == [], "the model's request had ended before the call: nothing to retract"
    assert resumed["sequence_number"] > use["sequence_number"], "turn.resumed comes after the call it names"
    assert of_type(events, "session.error") == [], of_type(events, "session.error")
    [idle] = of_type(events, "session.status_idle")
    assert idle["turn_id"] == started["turn_id"] and idle["stop_reason"]["type"] == "end_turn", idle
    # The model was asked again after the resumption and made no new call.
    assert len(of_type(events, "agent.tool_use")) == 1, of_type(events, "agent.tool_use")
    return resumed


def final_message(events) -> str:
    message = of_type(events, "agent.message")[-1]
    return "".join(block["text"] for block in message["content"] if block["type"] == "text")


@pytest.mark.parametrize(
    ("server", "tool"),
    [("counting", "idem"), ("counting", "readonly"), ("trusted", "once")],
    ids=["idempotentHint", "readOnlyHint", "declared-idempotent"],
)
def test_a_call_that_may_run_twice_runs_again_when_its_turn_resumes(rig, server, tool):
    name = f"{server}__{tool}"
    session, before = rig.call_and_crash(server, tool)
    use = check_crashed_mid_call(before, name)
    assert use.get("idempotent") is True, f"the call is logged as safe to run twice: {use}"
    [first] = rig.starts(server, tool)
    # The server of the cut-off call sleeps on: it is gone before turnlog starts again.
    end_counting_processes(rig.counts)

    events = rig.resume(session)
    resumed = check_one_turn_resumed_once(events, use)
    assert resumed["rerun"] == [use["id"]], resumed
    assert resumed.get("interrupted", []) == [], resumed
    # Run again, by a new server process: the second start answered.
    starts = rig.starts(server, tool)
    assert len(starts) == 2 and starts[0] == first and starts[1] != first, starts
    [result] = of_type(events, "agent.tool_result")
    assert result["tool_use_id"] == use["id"] and result["tool_call_id"] == use["tool_call_id"], result
    assert result["is_error"] is False, result
    assert result["content"] == [{"type": "text", "text": f"{tool}: start 2"}], result
    assert result["mcp"] == {"server": server, "tool": tool}, result
    assert result["sequence_number"] > resumed["sequence_number"], "the result comes from the run after the resumption"
    assert final_message(events) == f"tool results: {name}={tool}: start 2"


def test_a_call_that_may_not_run_twice_is_answered_as_interrupted(rig):
    session, before = rig.call_and_crash("counting", "once")
    use = check_crashed_mid_call(before, "counting__once")
    assert "idempotent" not in use, f"a tool without hints, of a server not declared idempotent: {use}"
    [first] = rig.starts("counting", "once")
    end_counting_processes(rig.counts)

    events = rig.resume(session)
    resumed = check_one_turn_resumed_once(events, use)
    assert resumed["interrupted"] == [use["id"]], resumed
    assert resumed.get("rerun", []) == [], resumed
    [result] = of_type(events, "agent.tool_result")
    assert result["tool_use_id"] == use["id"] and result["tool_call_id"] == use["tool_call_id"], result
    assert result["is_error"] is True, result
    assert result["content"] == [{"type": "text", "text": INTERRUPTED}], result
    # The model read the answer: the scripted model says what its tools answered.
    assert final_message(events) == f"tool results: counting__once={INTERRUPTED}"
    # Not run again: the one start is still the one before the crash, once the turn is over.
    assert rig.starts("counting", "once") == [first]


def listening_socket(port: int) -> str:
    """The socket listening on 127.0.0.1:`port`, as /proc names it (`socket:[inode]`)."""
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if local == f"0100007F:{port:04X}" and state == "0A":
            return f"socket:[{inode}]"
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def sockets(pid: int) -> set:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def test_turnlog_listens_again_while_an_mcp_server_it_started_outlives_it(rig):
    """A stdio MCP server must not inherit turnlog's listening socket: a server whose call
    was cut off by a crash sleeps on, and turnlog started again on its address must listen
    there (and resume the turn)."""
    session, _ = rig.call("counting", "once")
    [pid] = rig.starts("counting", "once")
    listener = listening_socket(rig.server.port)
    held = listener in sockets(int(pid))
    rig.server.kill()
    assert int(pid) in counting_processes(rig.counts), "the server of the cut-off call outlives turnlog"
    try:
        rig.server.start()
        error = None
    except AssertionError as failed:
        error = failed
    log = [line.strip() for line in (rig.root / "server.log").read_text().splitlines() if "could not listen" in line]
    assert not held and error is None, (
        f"the MCP server (pid {pid}) holds turnlog's listening socket {listener}: {held}; "
        f"turnlog started again on {rig.server.url} while it still ran: {error or 'yes'} {log}"
    )
    events = rig.client().wait_for(
        session, lambda events: of_type(events, "session.status_idle"), seconds=30, what="the resumed turn's end"
    )
    assert of_type(events, "session.status_idle")[-1]["stop_reason"]["type"] == "end_turn"

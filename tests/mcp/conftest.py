"""The real turnlog binary with agents whose tools come from the reference MCP servers, run
as they are: `mcp-server-time` (PyPI, stdio, installed beside this suite's Python) and
`@modelcontextprotocol/server-everything` (npm, stdio and Streamable HTTP). Tests drive
turns through the turn API (AAP) and watch the log through the native event API."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from turnlog_server import Server  # noqa: E402

TIME = str(pathlib.Path(sys.executable).parent / "mcp-server-time")
EVERYTHING = str(HERE / "node_modules" / ".bin" / "mcp-server-everything")
SLOW = str(HERE / "slow_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def everything_http():
    """server-everything over Streamable HTTP, on a free port: its `/mcp` URL."""
    port = free_port()
    process = subprocess.Popen(
        [EVERYTHING, "streamableHttp"], env=os.environ | {"PORT": str(port)}, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None, "server-everything (HTTP) exited"
            assert time.monotonic() < deadline, "server-everything (HTTP) did not listen within 20 s"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=10)


CONFIG = f"""
[agents.tools]
description = "Scripted, with MCP tools"
model = {{ provider = "scripted", name = "scripted" }}

[agents.tools.mcp_servers.time]
command = "{TIME}"
args = ["--local-timezone", "UTC"]
permission = "allow"
tools = {{ convert_time = "ask" }}

# A name no model provider takes inside a tool name: the model sees `time_utc__…`.
[agents.tools.mcp_servers."time.utc"]
command = "{TIME}"
args = ["--local-timezone", "Etc/UTC"]
permission = "allow"

[agents.tools.mcp_servers.everything]
command = "{EVERYTHING}"
args = ["stdio"]
permission = "allow"
tools = {{ get-env = "deny" }}

[agents.tools.mcp_servers.hasty]
command = "{EVERYTHING}"
args = ["stdio"]
permission = "allow"
timeout_secs = 1

[agents.broken]
model = {{ provider = "scripted", name = "scripted" }}
[agents.broken.mcp_servers.nothing]
command = "/nonexistent/mcp-server-nothing"

# One server that works and one that cannot start.
[agents.halfway]
model = {{ provider = "scripted", name = "scripted" }}
[agents.halfway.mcp_servers.everything]
command = "{EVERYTHING}"
args = ["stdio"]
[agents.halfway.mcp_servers.nothing]
command = "/nonexistent/mcp-server-nothing"
"""


@pytest.fixture(scope="session")
def cancelled_mark():
    """The file the `slow` server writes `started` to as a call begins, and `cancelled` to
    when the call is cancelled."""
    with tempfile.TemporaryDirectory() as root:
        yield pathlib.Path(root) / "cancelled"


@pytest.fixture(scope="session")
def server(everything_http, cancelled_mark):
    config = CONFIG + f"""
[agents.tools.mcp_servers.slow]
command = "{sys.executable}"
args = ["{SLOW}", "{cancelled_mark}"]
permission = "allow"

[agents.remote]
model = {{ provider = "scripted", name = "scripted" }}
[agents.remote.mcp_servers.everything]
url = "{everything_http}"
permission = "allow"
"""
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, config)
        yield running
        running.stop()


class Client:
    """JSON over the turn API and the native event API of one server."""

    def __init__(self, url: str):
        self.url = url

    def call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{method} {path}: {error.code} {error.read().decode()}") from None

    def session(self, agent: str) -> str:
        return self.call("POST", "/sessions", {"agent": {"name": agent}})["sessionId"]

    def turn(self, session: str, text: str):
        """A whole turn (stream `none`)."""
        return self.call("POST", f"/sessions/{session}/turns", {"stream": "none", "messages": [{"role": "user", "content": text}]})

    def post(self, session: str, *events):
        return self.call("POST", f"/sessions/{session}/events", {"events": list(events)})["data"]

    def events(self, session: str):
        return self.call("GET", f"/sessions/{session}/events?limit=1000")["data"]

    def wait_for(self, session: str, check, seconds: float = 20, what: str = "an event"):
        """The log once `check(events)` holds, polled; fails after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            events = self.events(session)
            if check(events):
                return events
            assert time.monotonic() < deadline, f"{what} within {seconds} s; the log: {[e['type'] for e in events]}"
            time.sleep(0.05)


@pytest.fixture
def client(server) -> Client:
    return Client(server.url)


def of_type(events, kind: str):
    return [e for e in events if e["type"] == kind]


def idle_after(n: int):
    """A check: the log has at least `n` `session.status_idle` events."""
    return lambda events: len(of_type(events, "session.status_idle")) >= n

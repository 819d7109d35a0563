"""Turn latency with an MCP tool, beside a built-in tool and no tool, on one agent whose
tools come from `mcp-server-time` (stdio). Each turn is a new session's first, through the
AAP turn API (`stream: none`), one at a time; the first 10 of each kind warm up. Prints
median and p95 per kind. The agent has an MCP server, so every turn (tool or not) lists its
tools first: compare with `turnlog-load turns` for an agent without one.

    scripts/test   # once: builds target/venv/mcp with mcp-server-time
    cargo build --release --bin turnlog
    TURNLOG_BIN=target/release/turnlog target/venv/mcp/bin/python load/mcp_turns.py
"""

import json
import pathlib
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from turnlog_server import Server
TIME = str(pathlib.Path(sys.executable).parent / "mcp-server-time")
config = f'''
[agents.tools]
model = {{ provider = "scripted", name = "scripted" }}
tools = {{ current_time = "allow" }}
[agents.tools.mcp_servers.time]
command = "{TIME}"
args = ["--local-timezone", "UTC"]
permission = "allow"
'''
def call(url, path, body):
    r = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"})
    with urllib.request.urlopen(r, timeout=60) as resp:
        return json.loads(resp.read())
with tempfile.TemporaryDirectory() as root:
    s = Server(root, config)
    for label, text in [("built-in current_time", "/tool current_time {}"), ("MCP time__get_current_time", '/tool time__get_current_time {"timezone": "UTC"}'), ("no tool", "hello")]:
        times = []
        for i in range(60):
            sid = call(s.url, "/sessions", {"agent": {"name": "tools", "tools": [{"name": "current_time", "trust": True}]}})["sessionId"]
            t = time.perf_counter()
            out = call(s.url, f"/sessions/{sid}/turns", {"stream": "none", "messages": [{"role": "user", "content": text}]})
            times.append((time.perf_counter() - t) * 1000)
            assert out["stopReason"] == "end_turn", out
        times = times[10:]
        times.sort()
        print(f"{label}: median {statistics.median(times):.2f} ms, p95 {times[int(len(times)*0.95)-1]:.2f} ms over {len(times)} turns (one new session each)")
    s.stop()

"""A turnlog cluster for the managed suite: three nats-servers started by
`scripts/nats-cluster` (JetStream, streams with three replicas) and three real turnlog nodes
on them, each in a temp dir of its own; everything is stopped at the end, also on failure."""

import contextlib
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import time
import urllib.request

from turnlog_server import ROOT, Server

SCRIPT = ROOT / "scripts" / "nats-cluster"
NATS = os.environ.get("NATS_SERVER", "/usr/sbin/nats-server")


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def jsz(port: int, query: str = "") -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/jsz{query}", timeout=2) as response:
        return json.load(response)


class Nats:
    """`scripts/nats-cluster 3 DIR BASE`: client ports BASE..BASE+2, routes BASE+100..,
    monitoring BASE+200..; servers n0, n1, n2. The script leaves them running detached, so
    they are found (and killed) by pid: the processes whose command line is the config
    file of this cluster's own dir, nothing else."""

    def __init__(self, root: pathlib.Path):
        self.pids: dict[int, int] = {}
        for attempt in range(5):
            self.base = random.randrange(20000, 29700)
            ports = [self.base + offset + i for offset in (0, 100, 200) for i in range(3)]
            if not all(port_free(p) for p in ports):
                continue
            self.dir = root / f"nats{attempt}"
            out = subprocess.run(
                [str(SCRIPT), "3", str(self.dir), str(self.base)],
                capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": os.environ["PATH"] + ":/usr/sbin"},
            )
            self.pids = self.find_pids()
            if out.returncode == 0 and len(self.pids) == 3 and self.all_ready():
                self.servers = json.loads(out.stdout.strip().removeprefix("servers = "))
                return
            self.stop()  # a port taken in between: another base
        raise AssertionError(f"no nats cluster could start; last output: {out.stdout} {out.stderr}")

    def find_pids(self) -> dict[int, int]:
        found = {}
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            for i in range(3):
                if len(args) >= 3 and args[0].endswith(b"nats-server") and args[2] == str(self.dir / f"n{i}.conf").encode():
                    found[i] = int(entry.name)
        return found

    def monitor(self, i: int) -> int:
        return self.base + 200 + i

    def all_ready(self) -> bool:
        for i in range(3):
            try:
                if not jsz(self.monitor(i)).get("meta_cluster", {}).get("leader"):
                    return False
            except OSError:
                return False
        return True

    def stream_leader(self, stream: str = "TURNLOG_EVENTS") -> int:
        """The server (its index) leading `stream` now: the one that says it leads it, else
        what most live servers say."""
        views = {}
        for i in self.pids:
            try:
                for account in jsz(self.monitor(i), "?accounts=true&streams=true").get("account_details", []):
                    for detail in account.get("stream_detail") or []:
                        if detail["name"] == stream and (detail.get("cluster") or {}).get("leader"):
                            views[i] = detail["cluster"]["leader"]
            except OSError:
                continue
        for i, leader in views.items():
            if leader == f"n{i}":
                return i
        assert views, f"no live server knows {stream}'s leader"
        leader = max(set(views.values()), key=list(views.values()).count)
        return int(leader.removeprefix("n"))

    def kill(self, i: int):
        """SIGKILL server `i`, and waits until it is gone (or a zombie nobody reaps)."""
        pid = self.pids.pop(i, None)
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                return
            if state in ("Z", "X"):
                return
            time.sleep(0.02)

    def stop(self):
        for i in list(self.pids):
            self.kill(i)


class Node(Server):
    """A turnlog node; one that fails to start is not left running."""

    def start(self):
        try:
            super().start()
        except BaseException:
            if getattr(self, "process", None) is not None and self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            raise


def node_config(base: str, servers: list, node: str) -> str:
    return base + f"""
[store]
backend = "jetstream"
[store.jetstream]
servers = {json.dumps(servers)}
replicas = 3
node = "{node}"
lease_ttl_secs = 2
"""


@contextlib.contextmanager
def cluster(root: pathlib.Path, config: str, names=("a", "b", "c")):
    """Yields (nats, nodes): the servers and a turnlog node on them per name. Stops the
    nodes (then the servers) at the end; a node that does not stop cleanly is killed, and
    its exit code is kept in `node.exit_code` for the test to see."""
    nats = None
    nodes = []
    try:
        nats = Nats(root)
        for name in names:
            (root / name).mkdir()
            nodes.append(Node(str(root / name), node_config(config, nats.servers, name)))
        yield nats, nodes
    finally:
        for node in nodes:
            try:
                node.process.terminate()
                node.exit_code = node.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.exit_code = node.process.wait()
        if nats is not None:
            nats.stop()

"""The real turnlog binary for the Python suites (managed agents, harness): started on a
free loopback port with a temp data dir and a config of the suite's own."""

import contextlib
import hashlib
import os
import pathlib
import signal
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BINARY = os.environ.get("TURNLOG_BIN", str(ROOT / "target" / "debug" / "turnlog"))


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys(**subjects: str) -> str:
    """`[[auth.keys]]` entries: subject name → API key."""
    return "".join(
        f'\n[[auth.keys]]\nsubject = "{subject}"\nsha256 = "{sha256(key)}"\n' for subject, key in subjects.items()
    )


class Server:
    """The real binary on `port` (0: any free one) over `root`'s data dir, with `config`;
    `restart` keeps both."""

    def __init__(self, root: str, config: str, port: int = 0):
        self.root = pathlib.Path(root)
        (self.root / "config.toml").write_text(config)
        self.port = port
        self.start()

    def start(self):
        log = open(self.root / "server.log", "a")
        self.process = subprocess.Popen(
            [BINARY, "serve", "--addr", f"127.0.0.1:{self.port}", "--data-dir", str(self.root / "data"),
             "--config", str(self.root / "config.toml")],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        line = self.process.stdout.readline()
        assert line.startswith("listening on "), f"turnlog did not start: {line!r}"
        self.url = line.removeprefix("listening on ").strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def stop(self):
        self.process.terminate()
        assert self.process.wait(timeout=30) == 0, "turnlog stops cleanly"

    def restart(self):
        self.stop()
        self.start()

    def kill(self):
        """SIGKILL, as a crash: no turn gets to record anything. Waits for the process to be
        gone; `start` runs it again over the same data dir."""
        self.process.kill()
        assert self.process.wait(timeout=30) == -signal.SIGKILL, "turnlog died of the SIGKILL"
        self.process.stdout.close()


@contextlib.contextmanager
def own_server(config: str):
    """A server of a test's own, in a temp dir of its own (killing it disturbs no other
    test); stopped at the end if it is still running."""
    with tempfile.TemporaryDirectory() as root:
        running = Server(root, config)
        yield running
        if running.process.poll() is None:
            running.stop()


def until(what: str, probe, deadline_s: float = 30, every_s: float = 0.02):
    """`probe()` until it gives something true, which it answers, or fails after
    `deadline_s` naming `what`."""
    deadline = time.monotonic() + deadline_s
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {deadline_s} s: {what}"
        time.sleep(every_s)

"""llama.cpp's `llama-server` with the SmolLM2-135M model, both from `scripts/llama` (built
and cached once per machine): started on a free loopback port, its log kept in a file,
stopped by its pid."""

import pathlib
import re
import signal
import subprocess
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The name turnlog's agents give the model; llama-server answers to it (`--alias`).
ALIAS = "smol"


def paths() -> dict[str, str]:
    """The server binary, the model file and the tool-call template, from `scripts/llama`
    (fast once cached)."""
    out = subprocess.run([ROOT / "scripts" / "llama"], check=True, capture_output=True, text=True, timeout=3600)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


class Llama:
    """One llama-server. `slots` requests run at once, each with `context // slots` tokens of
    context; `port` 0 picks a free one (`restart` keeps the one it got). With `tool_calls`,
    its chat template is one whose tool calls start the reply (see `scripts/llama`)."""

    def __init__(self, log: pathlib.Path, port: int = 0, slots: int = 2, context: int = 4096, tool_calls=False):
        found = paths()
        self.binary, self.model = found["server"], found["model"]
        self.template = found["tool_template"] if tool_calls else None
        self.log_path = log
        self.port = port
        self.slots = slots
        self.context = context
        self.start()

    def start(self):
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        args = [
            self.binary, "--model", self.model, "--alias", ALIAS, "--host", "127.0.0.1", "--port", str(self.port),
            # Tool calls follow the model's chat template (`--jinja`); the slots and the
            # counters are read by the tests.
            "--jinja", "--ctx-size", str(self.context), "--parallel", str(self.slots), "--slots", "--metrics",
            "--threads", "2", "--no-webui",
        ] + (["--chat-template-file", self.template] if self.template else [])
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log()[offset:])
            if found:
                self.port = int(found.group(1))
                break
            time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"llama-server did not listen within 120 s:\n{self.log()[-4000:]}")
        # It listens before the model is loaded; /health is 503 until then.
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"llama-server did not load its model within 120 s:\n{self.log()[-4000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)

    def kill(self):
        """SIGKILL: every open response is cut where it is."""
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(timeout=15) == -signal.SIGKILL

    def restart(self):
        self.stop()
        self.start()

    def counters(self) -> dict[str, float]:
        """Its Prometheus counters (`--metrics`), e.g. `llamacpp:tokens_predicted_total`."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            name: float(value)
            for name, value in re.findall(r"^([a-z_:]+) ([0-9.e+-]+)$", text, flags=re.MULTILINE)
        }

    def busy_slots(self) -> list[int]:
        """The ids of the slots working on a request now (`--slots`)."""
        slots = httpx.get(f"{self.url}/slots", timeout=10).json()
        return [slot["id"] for slot in slots if slot.get("is_processing")]

    def wait_logged(self, text: str, since: int = 0, timeout: float = 10):
        """Waits until the log has `text` after offset `since` (it is written by a thread of
        its own, a little after the fact)."""
        deadline = time.monotonic() + timeout
        while text not in self.log()[since:]:
            assert time.monotonic() < deadline, f"llama-server did not log {text!r} within {timeout} s"
            time.sleep(0.05)

    def wait_idle(self, timeout: float = 10) -> float:
        """Waits until no slot works on a request; answers how long that took."""
        started = time.monotonic()
        while self.busy_slots():
            assert time.monotonic() - started < timeout, f"a slot is still busy after {timeout} s"
            time.sleep(0.05)
        return time.monotonic() - started

    def prompt_tokens(self, messages: list[dict]) -> int:
        """How many tokens the server makes of `messages` through its chat template."""
        prompt = httpx.post(f"{self.url}/apply-template", json={"messages": messages}, timeout=30).json()["prompt"]
        tokens = httpx.post(f"{self.url}/tokenize", json={"content": prompt}, timeout=30).json()["tokens"]
        return len(tokens)


"""Real servers: `python -m server serve` in a subprocess on 127.0.0.1 (RemoteServer), and what tests read from or
do to a running one (metric, abandon, its memory: tree_rss_mib, gpu_memory_mib).

RemoteServer is the one way a real server is started, by the end-to-end tests' fixtures (tests/e2e/conftest.py)
and by the HTTP benchmarks (benchmarks/http_load.py and benchmarks/soak.py, their --spawn). Nothing here imports
pytest at module level: the benchmarks import this module where only the server's own dependencies are installed.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 600  # first start may load weights from a cold disk
REQUEST_TIMEOUT_S = 600


def process_tree(pid: int) -> list[int]:
    """The process `pid` and all its descendants (Linux /proc), those gone meanwhile left out."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            todo += [
                int(c) for task in Path(f"/proc/{p}/task").iterdir() for c in (task / "children").read_text().split()
            ]
        except OSError:
            continue
        tree.append(p)
    return tree


def tree_rss_mib(pid: int) -> float:
    """Resident memory of the process `pid` and all its descendants, MiB (Linux /proc)."""
    total = 0
    for p in process_tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
        except (OSError, StopIteration):
            continue
    return total / 1024


def child_names(pid: int) -> list[str]:
    """The names (as ps shows them) of the process `pid`'s children (Linux /proc)."""
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                names.append(Path(f"/proc/{child}/comm").read_text().strip())
            except OSError:  # gone meanwhile
                continue
    return names


def gpu_memory_mib() -> float | None:
    """Memory in use on this machine's GPUs, MiB, as nvidia-smi reports it (every process's); None without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return float(sum(int(line) for line in out.split()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerStartError(RuntimeError):
    """The server exited, or did not answer /health with 200 in time; the message ends with its log's tail."""


class RemoteServer:
    """`whisper-server serve ARGS` in a subprocess (vLLM's RemoteOpenAIServer pattern); waits for /health.

    `args` are serve's flags; `--host 127.0.0.1 --port PORT` come after them, so they win over any in `args`.
    `env` is added to this process's environment; `port` is a free one unless given. The server runs from the
    repository root with its stdout and stderr in a temporary log file (log_tail()). The constructor returns once
    GET /health answers 200; when the server exits first or is not healthy within `startup_timeout_s`, it is
    stopped and ServerStartError raised. stop() ends it (SIGTERM, SIGKILL after 30 s) and removes the log; a
    `with` block calls it on the way out. `verbose` prints the command and the time to healthy on stderr.
    """

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        port: int | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        verbose: bool = False,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        self.cmd = [sys.executable, "-m", "server", "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        if verbose:
            print(f"spawning: {shlex.join(self.cmd)}", file=sys.stderr)
        # Open for the server's whole life; stop() closes and removes it.
        self.log = tempfile.NamedTemporaryFile(prefix="whisper-server-", suffix=".log", delete=False)  # noqa: SIM115
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        try:
            elapsed = self._wait_healthy(startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        if verbose:
            print(f"server healthy after {elapsed:.1f} s", file=sys.stderr)

    def _wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; ServerStartError (with the log's tail) if it did not."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                raise ServerStartError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise ServerStartError(f"server not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, num_chars: int = 6000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-num_chars:]

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S, **kwargs
        )

    def async_client(self, **kwargs) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S, **kwargs
        )

    def stop(self) -> None:
        """Ends the server and removes its log; calling it again does nothing."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
            os.unlink(self.log.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def spawn_or_exit(flags: str) -> RemoteServer:
    """A benchmark's --spawn: `python -m server serve FLAGS` on a free local port, healthy; if it does not get there,
    the script ends with the server's log tail."""
    try:
        return RemoteServer(*shlex.split(flags), verbose=True)
    except ServerStartError as exc:
        raise SystemExit(str(exc)) from None


def metric(server, name: str, labels: str = "") -> float:
    """One sample of the server's /metrics (0 when absent)."""
    text = httpx.get(f"{server.url}/metrics").text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def abandon(server, path: Path) -> None:
    """Upload a long clip for transcription and hang up 3 s into the wait for its answer."""
    import pytest  # here, not at the top: the benchmarks import this module without pytest installed

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/audio/transcriptions",
            files={"file": (path.name, path.read_bytes(), "audio/flac")},
            data={"model": "whisper-1"},
            timeout=httpx.Timeout(30, read=3),
        )

"""Real servers for end-to-end tests: `python -m server serve` on 127.0.0.1, real weights, real audio.

`data_dir` (../shared/data) comes from tests/conftest.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest
from e2e_utils import REPO

STARTUP_TIMEOUT_S = 600  # first start may load weights from a cold disk
REQUEST_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RemoteServer:
    """`whisper-server serve` in a subprocess (vLLM's RemoteOpenAIServer pattern); waits for /health."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        # Open for the server's whole life; stop() closes and removes it.
        self.log = tempfile.NamedTemporaryFile(prefix="whisper-server-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [sys.executable, "-m", "server", "serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

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
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def server():
    """The default model (tiny.en, English-only)."""
    remote = RemoteServer()
    yield remote
    remote.stop()


@pytest.fixture(scope="session")
def base_server():
    """A multilingual model, for translations and language detection."""
    remote = RemoteServer("--model", "base")
    yield remote
    remote.stop()


@pytest.fixture(scope="session")
def small_upload_server():
    """Upload limit of 1 MiB, so that oversize uploads are cheap to send."""
    remote = RemoteServer("--max-upload-mb", "1")
    yield remote
    remote.stop()


@pytest.fixture(scope="session")
def process_server():
    """The default model with the engine in a child process (`--engine-process on`, the default on a GPU)."""
    remote = RemoteServer("--engine-process", "on")
    yield remote
    remote.stop()


@pytest.fixture
def doomed_process_server():
    """Like process_server, for a test that kills its engine process."""
    remote = RemoteServer("--engine-process", "on")
    yield remote
    remote.stop()

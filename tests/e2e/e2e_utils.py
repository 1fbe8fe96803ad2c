"""Shared helpers of the end-to-end tests."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest

REPO = Path(__file__).resolve().parents[2]

JFK = "g1_en_jfk.flac"
COMMON_ENGLISH = {
    "the",
    "a",
    "an",
    "is",
    "are",
    "and",
    "of",
    "to",
    "in",
    "it",
    "i",
    "you",
    "that",
    "this",
    "we",
    "for",
    "on",
    "with",
    "be",
    "was",
    "my",
    "not",
    "have",
    "what",
    "your",
    "our",
}


def words(text: str) -> list[str]:
    """Lowercase words without punctuation, for comparing transcripts loosely."""
    return re.findall(r"[a-z0-9']+", text.lower())


JFK_WORDS = words("ask not what your country can do for you ask what you can do for your country")


def contains_words(text: str, expected: list[str]) -> bool:
    """True when `expected` appears as a contiguous run of words in `text`."""
    got = words(text)
    n = len(expected)
    return any(got[i : i + n] == expected for i in range(len(got) - n + 1))


def metric(server, name: str, labels: str = "") -> float:
    """One sample of the server's /metrics (0 when absent)."""
    text = httpx.get(f"{server.url}/metrics").text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def abandon(server, path: Path) -> None:
    """Upload a long clip for transcription and hang up 3 s into the wait for its answer."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/audio/transcriptions",
            files={"file": (path.name, path.read_bytes(), "audio/flac")},
            data={"model": "whisper-1"},
            timeout=httpx.Timeout(30, read=3),
        )


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

"""Shared helpers of the end-to-end tests."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
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

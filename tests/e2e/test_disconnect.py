"""A client that goes away mid-request: its decoding is aborted and the server carries on."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from e2e_utils import JFK, JFK_WORDS, contains_words

LONG = "g2_en_ljspeech_LJ001-0001_to_0032_concat.flac"  # ~230 s: many windows, long enough to abandon


def metric(server, name: str, labels: str = "") -> float:
    text = httpx.get(f"{server.url}/metrics").text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_disconnect_aborts_and_frees_slots(server, data_dir):
    route = '{method="POST",route="/v1/audio/transcriptions",status="499"}'
    before = metric(server, "whisper_http_requests_total", route)
    files = {"file": (LONG, (data_dir / LONG).read_bytes(), "audio/flac")}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/audio/transcriptions",
            files=files,
            data={"model": "whisper-1"},
            timeout=httpx.Timeout(30, read=3),
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (
            metric(server, "whisper_http_requests_total", route) > before
            and metric(server, "whisper_running_sequences") == 0
        ):
            break
        time.sleep(0.5)
    assert metric(server, "whisper_http_requests_total", route) == before + 1
    assert metric(server, "whisper_running_sequences") == 0
    result = server.client().audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    assert contains_words(result.text, JFK_WORDS)

"""A client that goes away mid-request: its decoding is aborted and the server carries on."""

from __future__ import annotations

import time

import pytest

from tests.helpers.server import abandon, metric
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

LONG = "g2_en_ljspeech_LJ001-0001_to_0032_concat.flac"  # ~230 s: many windows, long enough to abandon


@pytest.mark.parametrize("which", ["server", "process_server"])  # the engine in the server's process, in its own
def test_disconnect_aborts_and_frees_slots(which, request, data_dir):
    server = request.getfixturevalue(which)
    route = '{method="POST",route="/v1/audio/transcriptions",status="499"}'
    before = metric(server, "whisper_http_requests_total", route)
    abandon(server, data_dir / LONG)
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

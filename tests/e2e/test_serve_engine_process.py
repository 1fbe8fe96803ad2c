"""`serve --engine-process on` (the default on a GPU), here on the CPU: the engine runs in a child process and the
API behaves as with the engine in the server's process: transcripts, streams, errors, /metrics (disconnects:
test_disconnect.py); a killed child is restarted (test_resilience.py)."""

from __future__ import annotations

import re

import openai
import pytest
from openai.types.audio import TranscriptionTextDoneEvent

from tests.helpers.server import metric
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words


def engine_pid(server) -> int:
    match = re.search(r"engine in process (\d+)", server.log_tail(100_000))
    assert match, server.log_tail()
    return int(match.group(1))


def test_transcripts_streams_and_errors(process_server, server, data_dir):
    """The same answers as the default server (engine in its process) for a transcript, a stream and a 400."""
    assert engine_pid(process_server) != process_server.proc.pid
    client = process_server.client()
    text = client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1").text
    assert contains_words(text, JFK_WORDS)
    assert text == server.client().audio.transcriptions.create(file=data_dir / JFK, model="whisper-1").text
    events = list(client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1", stream=True))
    assert isinstance(events[-1], TranscriptionTextDoneEvent) and events[-1].text == text
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1", language="de")
    error = caught.value.body
    assert error["param"] == "language" and "English-only" in error["message"]
    assert metric(process_server, 'whisper_engine_total{name="tokens"}') > 0
    assert metric(process_server, "whisper_decode_slots") > 0

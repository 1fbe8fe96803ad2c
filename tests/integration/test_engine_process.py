"""EngineProcess: the engine in a child process gives the in-process engine's results, refuses bad requests at
once in the caller, streams, aborts, and fails its requests (instead of leaving them waiting) when the child dies."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.processes.engine_process import EngineProcess
from engine.request import DecodeOptions, EngineDeadError, InvalidRequestError, RequestAbortedError
from tests.helpers.engine_runs import WAIT_S, submit_all

JFK = "g1_en_jfk.flac"
OPTIONS = DecodeOptions(temperatures=(0.0,))


def start(**config) -> EngineProcess:
    engine = EngineProcess(EngineConfig(model="tiny.en", device="cpu", **config))
    engine.start()
    return engine


@pytest.fixture(scope="module")
def process_engine(tiny_engine):  # tiny_engine: skips without the weights, and is the in-process reference
    engine = start()
    yield engine
    engine.shutdown()


def test_same_results_as_the_engine_in_process(process_engine, tiny_engine, short_english_clips, load_clip):
    assert process_engine.pid != os.getpid() and process_engine.is_alive
    clips = {row["file"]: load_clip(row["file"]) for row in short_english_clips[:4]}
    ours, reference = submit_all(process_engine, clips, OPTIONS), submit_all(tiny_engine, clips, OPTIONS)
    for name in clips:
        assert [s.tokens for s in ours[name].segments] == [s.tokens for s in reference[name].segments], name
        assert ours[name].text == reference[name].text, name
    assert "ask not what your country can do for you" in ours[JFK].text.lower()
    stats = process_engine.stats()
    assert stats.num_slots == tiny_engine.stats().num_slots and stats.num_waiting == 0
    assert stats.extra["tokens"] > 0


def test_bad_requests_are_refused_in_the_caller(process_engine):
    with pytest.raises(InvalidRequestError, match="English-only"):
        process_engine.submit(np.zeros(16000, np.float32), DecodeOptions(language="de"))
    with pytest.raises(InvalidRequestError, match="NaN"):
        process_engine.submit(np.full(16000, np.nan, np.float32), OPTIONS)


def test_events_stream_and_abort(process_engine, load_clip):
    """Segment events arrive as windows finish (a 3-window clip), and an aborted request ends with its error."""
    audio = np.concatenate([load_clip(JFK)] * 8)  # ~88 s: three windows

    async def run():  # as the server does: handles made inside an event loop, awaited there
        handle = process_engine.submit(audio, OPTIONS)
        events = [event async for event in handle.events()]
        result = await handle.result()
        assert len(events) >= 3 and sum(len(e.segments) for e in events) == len(result.segments)
        aborted = process_engine.submit(audio, OPTIONS)
        aborted.abort()
        with pytest.raises(RequestAbortedError):
            await aborted.result()
        return (await process_engine.submit(load_clip(JFK), OPTIONS).result()).text

    assert "ask not" in asyncio.run(run()).lower()  # and it still serves


def test_a_dead_child_fails_its_requests(tiny_engine, load_clip):
    engine = start()
    try:
        handle = engine.submit(np.concatenate([load_clip(JFK)] * 20), OPTIONS)  # minutes of decoding on a CPU
        deadline = time.monotonic() + WAIT_S
        while engine.stats().num_running == 0 and time.monotonic() < deadline:  # decoding inside the child
            time.sleep(0.05)
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="exit"):
            handle.wait(timeout=WAIT_S)
        deadline = time.monotonic() + 10
        while engine.is_alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.is_alive
        with pytest.raises(EngineDeadError):
            engine.submit(load_clip(JFK), OPTIONS)
    finally:
        engine.shutdown()


def test_load_errors_reach_the_caller(tiny_engine):
    with pytest.raises(FileNotFoundError, match="no-such-model"):  # the type Engine() raises, across the pipe
        EngineProcess(EngineConfig(model="./no-such-model", device="cpu"))

"""EngineProcess: the engine in a child process gives the in-process engine's results, refuses bad requests at
once in the caller, streams, aborts, and fails its requests (instead of leaving them waiting) when the child dies.
EngineClient: other connections to that child share its engine, each request answered on its own connection."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.processes.engine_process import EngineClient, EngineProcess
from engine.request import DecodeOptions, EngineDeadError, InvalidRequestError, RequestAbortedError
from tests.helpers.engine_runs import WAIT_S, submit_all

JFK = "g1_en_jfk.flac"
OPTIONS = DecodeOptions(temperatures=(0.0,))


CONFIG = EngineConfig(model="tiny.en", device="cpu")


def start(listen: tuple[str, bytes] | None = None) -> EngineProcess:
    engine = EngineProcess(CONFIG, listen=listen)
    engine.start()
    return engine


def connect(address: tuple[str, bytes]) -> EngineClient:
    client = EngineClient(CONFIG, address)
    client.start()
    return client


@pytest.fixture(scope="module")
def socket_dir():
    with tempfile.TemporaryDirectory(prefix="engine-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def process_engine(tiny_engine, socket_dir):  # tiny_engine: skips without the weights; the in-process reference
    engine = start(listen=(str(socket_dir / "engine.sock"), secrets.token_bytes(32)))
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


def test_clients_share_the_engine_and_each_gets_its_own_requests(process_engine, tiny_engine, short_english_clips,
                                                                  load_clip):  # fmt: skip
    """Two clients, each numbering its requests from req-0, and the parent submit different clips at once: each
    result is its own clip's, token for token the in-process engine's."""
    names = [row["file"] for row in short_english_clips[:3]]
    clips = {name: load_clip(name) for name in names}
    reference = submit_all(tiny_engine, clips, OPTIONS)
    first, second = connect(process_engine.address), connect(process_engine.address)
    try:
        assert first.tokenizer.eot == process_engine.tokenizer.eot and first.num_slots == process_engine.num_slots
        links = dict(zip(names, [process_engine, first, second]))
        handles = {name: link.submit(clips[name], OPTIONS) for name, link in links.items()}
        assert handles[names[1]].request_id == handles[names[2]].request_id  # the same id on both clients
        for name, handle in handles.items():
            result = handle.wait(timeout=WAIT_S)
            assert [s.tokens for s in result.segments] == [s.tokens for s in reference[name].segments], name
        assert first.stats().num_slots == process_engine.num_slots
    finally:
        first.shutdown()
        second.shutdown()
    assert "ask not" in process_engine.submit(load_clip(JFK), OPTIONS).wait(timeout=WAIT_S).text.lower()


def test_a_client_that_disconnects_has_its_requests_aborted(process_engine, load_clip):
    client = connect(process_engine.address)
    handle = client.submit(np.concatenate([load_clip(JFK)] * 20), OPTIONS)  # minutes of decoding on a CPU
    deadline = time.monotonic() + WAIT_S
    while process_engine.stats().num_running == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    client.shutdown()
    with pytest.raises(EngineDeadError, match="closed"):
        handle.wait(timeout=WAIT_S)
    deadline = time.monotonic() + 30
    while process_engine.stats().num_running and time.monotonic() < deadline:  # the engine let it go
        time.sleep(0.05)
    assert process_engine.stats().num_running == 0
    with pytest.raises(EngineDeadError):
        client.submit(load_clip(JFK), OPTIONS)


def test_a_client_needs_the_key(process_engine):
    path, key = process_engine.address
    with pytest.raises(multiprocessing.AuthenticationError):
        EngineClient(CONFIG, (path, bytes(len(key))))
    with pytest.raises(OSError):
        EngineClient(CONFIG, (path + ".nothing", key))


def test_a_dead_engine_fails_its_clients_requests(tiny_engine, socket_dir, load_clip):
    engine = start(listen=(str(socket_dir / "dying.sock"), secrets.token_bytes(32)))
    client = connect(engine.address)
    try:
        handle = client.submit(np.concatenate([load_clip(JFK)] * 20), OPTIONS)
        deadline = time.monotonic() + WAIT_S
        while client.stats().num_running == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="closed"):
            handle.wait(timeout=WAIT_S)
        assert not client.is_alive
        # a new engine on the same path (a restart) takes clients again, though the killed one left its socket
        assert os.path.exists(engine.address[0])
        again = start(listen=engine.address)
        try:
            assert "ask not" in connect(again.address).submit(load_clip(JFK), OPTIONS).wait(WAIT_S).text.lower()
        finally:
            again.shutdown()
        assert not os.path.exists(engine.address[0])  # removed as the engine stops
    finally:
        client.shutdown()
        engine.shutdown()

"""Backpressure, self-healing and draining on real servers: the queue bound holds against clients that retry, a
killed engine comes back, and SIGTERM ends within its drain timeout with clean answers."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.helpers.server import RemoteServer, metric
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

LONG = "g2_en_ljspeech_LJ001-0001_to_0032_concat.flac"  # 230 s of speech: still decoding when a test needs it


def start_long_request(server, path) -> tuple[threading.Thread, dict[str, object]]:
    """A long transcription in a thread, started once the engine runs it; the dict gets its status, its error
    code and when it ended."""
    client = server.client()
    outcome: dict[str, object] = {}

    def request() -> None:
        try:
            client.audio.transcriptions.create(file=path, model="whisper-1")
            outcome["status"] = 200
        except openai.APIStatusError as exc:
            outcome["status"] = exc.status_code
            outcome["code"] = exc.body.get("code") if isinstance(exc.body, dict) else None
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=request)
    thread.start()
    deadline = time.monotonic() + 60
    while metric(server, "whisper_running_sequences") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    return thread, outcome


def engine_pid(server) -> int:
    pids = re.findall(r"engine in process (\d+)", server.log_tail(1_000_000))
    assert pids, server.log_tail()
    return int(pids[-1])


@pytest.mark.parametrize("engine_process", ["off", "on"])
def test_max_waiting_bounds_what_is_queued_against_clients_that_retry(data_dir, engine_process):
    """8 clients that honour Retry-After against 2 slots and a queue of 4: the queue never holds more than 4."""
    remote = RemoteServer("--max-waiting", "4", "--max-num-seqs", "2", "--engine-process", engine_process)
    try:
        audio = (data_dir / JFK).read_bytes()
        depths: list[float] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                depths.append(metric(remote, "whisper_queue_depth"))
                time.sleep(0.05)

        results: list[str] = []
        refusals = []

        def client_loop() -> None:
            client = openai.OpenAI(base_url=remote.base_url, api_key="unused", max_retries=0, timeout=300)
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                try:
                    results.append(client.audio.transcriptions.create(file=(JFK, audio), model="whisper-1").text)
                    return
                except openai.RateLimitError as exc:
                    refusals.append(exc)
                    time.sleep(float(exc.response.headers["retry-after"]))

        watcher = threading.Thread(target=watch)
        watcher.start()
        clients = [threading.Thread(target=client_loop) for _ in range(8)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(timeout=300)
        done.set()
        watcher.join()
        assert len(results) == 8 and all(contains_words(text, JFK_WORDS) for text in results)
        assert refusals, "the bound was never reached"
        assert all(exc.body["code"] == "server_overloaded" for exc in refusals)
        assert max(depths) <= 4, max(depths)
    finally:
        remote.stop()


def test_a_killed_engine_process_is_restarted_and_serves_again(doomed_process_server, data_dir):
    remote = doomed_process_server
    thread, in_flight = start_long_request(remote, data_dir / LONG)
    first = engine_pid(remote)
    os.kill(first, signal.SIGKILL)
    thread.join(timeout=60)
    assert (in_flight["status"], in_flight["code"]) == (503, "engine_unavailable")  # only the request it held
    deadline = time.monotonic() + 120
    while httpx.get(f"{remote.url}/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(f"{remote.url}/health").status_code == 200, remote.log_tail()
    assert engine_pid(remote) != first
    again = remote.client().audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    assert contains_words(again.text, JFK_WORDS)
    assert metric(remote, "whisper_engine_restarts_total") == 1


def test_sigterm_drains_within_its_timeout_and_answers_503(data_dir):
    """A request still decoding when the drain timeout passes gets a clean 503; readiness is 503 at once."""
    remote = RemoteServer("--drain-timeout-s", "2")
    try:
        thread, outcome = start_long_request(remote, data_dir / LONG)
        with httpx.Client(timeout=10) as probe:
            assert probe.get(f"{remote.url}/health").status_code == 200
            signalled = time.monotonic()
            remote.proc.send_signal(signal.SIGTERM)
            try:  # on a connection uvicorn has not closed yet the server says it is not ready; else it is gone
                ready = probe.get(f"{remote.url}/health").status_code
            except httpx.TransportError:
                ready = None
            assert ready in (503, None)
        thread.join(timeout=30)
        code = remote.proc.wait(timeout=30)
        exited = time.monotonic()
        assert outcome["status"] == 503 and outcome["code"] == "server_shutting_down", outcome
        assert 1.5 < outcome["at"] - signalled < 6, outcome["at"] - signalled
        # uvicorn re-raises the signal once it has shut down cleanly, so the exit status is SIGTERM's (143), not
        # SIGKILL's (137, what an orchestrator's grace period running out gives)
        assert exited - signalled < 9 and code in (0, -signal.SIGTERM), (exited - signalled, code, remote.log_tail())
    finally:
        remote.stop()

"""`serve --api-servers 2`: two front-end processes on one port share one engine process. Each serves transcriptions
and realtime sessions on its own (the other stopped with SIGSTOP), a client secret minted by one opens one session
on the other, /metrics sums both, a killed front-end is started again and a restarted engine reached again by the
other front-end, and SIGTERM stops every process of the server."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.helpers.realtime import one_turn, pcm24k
from tests.helpers.server import RemoteServer, metric, process_tree
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

WAIT_S = 60
TRANSCRIPTIONS_OK = '{method="POST",route="/v1/audio/transcriptions",status="200"}'


@pytest.fixture(scope="module")
def two():
    remote = RemoteServer("--api-servers", "2")
    wait_for(lambda: remote.log_tail(100_000).count("Application startup complete") == 2, remote)
    yield remote
    remote.stop()


def wait_for(condition, server, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.1)


def front_ends(server) -> tuple[int, int]:
    """The first front-end's pid (the server's) and the other's (the last one started)."""
    started = re.findall(r"Started server process \[(\d+)\]", server.log_tail(100_000))
    others = [int(p) for p in started if int(p) != server.proc.pid]
    return server.proc.pid, others[-1]


@contextlib.contextmanager
def stopped(pid: int):
    """The process `pid` frozen (it accepts no connection): the other front-end must answer everything."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def transcribe(server, data_dir) -> str:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)  # new connections
    return client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1").text


def test_each_front_end_serves_on_its_own_and_metrics_sum_both(two, data_dir):
    before = metric(two, "whisper_http_requests_total", TRANSCRIPTIONS_OK)
    pcm = pcm24k(data_dir / JFK)
    for pid in front_ends(two):
        with stopped(pid):
            assert contains_words(transcribe(two, data_dir), JFK_WORDS)
            client = openai.OpenAI(base_url=two.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
            assert contains_words(one_turn(client, pcm, "whisper-1"), JFK_WORDS)
    assert metric(two, "whisper_http_requests_total", TRANSCRIPTIONS_OK) == before + 2  # either one sums both


def test_a_secret_minted_by_one_front_end_opens_one_session_on_the_other(two):
    first, other = front_ends(two)
    with stopped(other):
        response = httpx.post(f"{two.base_url}/realtime/client_secrets", json={}, timeout=WAIT_S)
    assert response.status_code == 200, response.text
    secret = response.json()["value"]
    url = f"ws://127.0.0.1:{two.port}/v1/realtime?intent=transcription"
    with stopped(first):
        with connect(url, additional_headers={"Authorization": f"Bearer {secret}"}) as ws:
            assert '"session.created"' in ws.recv(timeout=WAIT_S)
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers={"Authorization": f"Bearer {secret}"})
        assert refused.value.response.status_code == 401


def test_models_stay_loaded(two):
    response = httpx.delete(f"{two.base_url}/models/whisper-1", timeout=WAIT_S)
    assert response.status_code == 403 and response.json()["error"]["code"] == "unload_disabled"


def test_a_killed_front_end_is_started_again_and_a_restarted_engine_reached_again(two, data_dir):
    first, other = front_ends(two)
    os.kill(other, signal.SIGKILL)
    wait_for(lambda: two.log_tail(100_000).count("Application startup complete") == 3, two)
    _, other = front_ends(two)
    engine = int(re.findall(r"engine in process (\d+)", two.log_tail(100_000))[-1])
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: "restarted" in two.log_tail(100_000), two)
    with stopped(first):  # the other front-end connects to the new engine process on its own
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                assert contains_words(transcribe(two, data_dir), JFK_WORDS)
                break
            except openai.APIStatusError as exc:  # 503 until it has connected again
                assert exc.status_code == 503 and time.monotonic() < deadline, two.log_tail()
                time.sleep(0.2)
    assert other in process_tree(first)


def test_sigterm_stops_every_process(two):
    tree = process_tree(two.proc.pid)
    assert len(tree) >= 4  # the two front-ends, the engine, the shared state
    two.stop()
    assert two.proc.returncode is not None

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not yet reaped by init

    deadline = time.monotonic() + 10  # the engine's process ends as it reads the end of its pipe
    while not all(gone(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in tree if not gone(pid)] == []

"""--data-parallel-size 2 on the CPU: two engine processes, each with one of the two cores, behind one server.
Requests are spread over both, transcripts equal one engine's, and a killed engine fails only what it held while
the other serves and the server brings it back."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.helpers.realtime import chunks, pcm24k, wav_bytes
from tests.helpers.server import RemoteServer, metric
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

CLIPS = [
    JFK,
    "g1_en_librispeech-test-clean_1089-134686-0001.wav",
    "g1_en_librispeech-test-clean_1221-135766-0002.wav",
    "g1_en_librispeech-dev-clean_1272-128104-0000.wav",
    "g1_en_librispeech-test-other_1688-142285-0000.flac",
    "g1_en_librispeech-test-clean_61-70968-0000.flac",
    "g1_en_librispeech-test-clean_1995-1837-0001.wav",
    "g1_en_librispeech-dev-clean_2412-153948-0000.flac",
]
LONG = "g2_en_ljspeech_LJ001-0001_to_0032_concat.flac"  # 230 s: still decoding when the engine is killed


@pytest.fixture(scope="module")
def two_engines():
    remote = RemoteServer("--data-parallel-size", "2")
    yield remote
    remote.stop()


def engine_pids(server) -> dict[int, int]:
    """Engine index -> its process, from the server's log (started, then each restart)."""
    log = server.log_tail(1_000_000)
    started = re.search(r"with 2 engines: process (\d+), process (\d+)", log)
    assert started, log
    pids = {0: int(started.group(1)), 1: int(started.group(2))}
    for index, pid in re.findall(r"engine (\d) restarted .*in process (\d+)", log):
        pids[int(index)] = int(pid)
    return pids


def steps(server, engine: int) -> float:
    return metric(server, "whisper_engine_member_total", f'{{engine="{engine}",name="steps"}}')


def test_requests_are_spread_over_both_engines_with_one_engines_transcripts(two_engines, server, data_dir):
    assert httpx.get(f"{two_engines.url}/health").json()["engines"] == "2/2"
    before = [steps(two_engines, i) for i in (0, 1)]
    client = two_engines.client()

    def ask(clip: str) -> str:
        return client.audio.transcriptions.create(file=data_dir / clip, model="whisper-1").text

    with ThreadPoolExecutor(len(CLIPS)) as pool:  # all at once: each engine gets several, batched
        texts = list(pool.map(ask, CLIPS))
    after = [steps(two_engines, i) for i in (0, 1)]
    assert all(a > b for a, b in zip(after, before)), (before, after)  # both engines decoded
    alone = [server.client().audio.transcriptions.create(file=data_dir / c, model="whisper-1").text for c in CLIPS]
    assert texts == alone
    # the unlabelled series are the engines' sums
    assert metric(two_engines, "whisper_decode_slots") == 2 * metric(server, "whisper_decode_slots")
    assert metric(two_engines, "whisper_engine_up", '{engine="0"}') == 1.0


def test_realtime_sessions_are_served_by_the_engines(two_engines, data_dir):
    """Two realtime sessions at once, each turn to the least loaded engine: each gets the HTTP transcript."""
    pcm = pcm24k(data_dir / JFK)
    http = two_engines.client().audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1")

    def session(_: int) -> str:
        with two_engines.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
            conn.recv()
            conn.session.update(session={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
            conn.recv()
            for piece in chunks(pcm, 48):
                conn.input_audio_buffer.append(audio=piece)
            conn.input_audio_buffer.commit()
            for ev in conn:
                if ev.type == "conversation.item.input_audio_transcription.completed":
                    return ev.transcript
        return ""

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(session, range(2))) == [http.text] * 2


def test_a_killed_engine_fails_only_its_requests_and_is_restarted(two_engines, data_dir):
    client = two_engines.client()
    outcome: dict[str, object] = {}

    def long_request() -> None:
        try:
            client.audio.transcriptions.create(file=data_dir / LONG, model="whisper-1")
            outcome["status"] = 200
        except openai.APIStatusError as exc:
            outcome["status"], outcome["code"] = exc.status_code, exc.body.get("code")

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 60
    running = None
    while running is None and time.monotonic() < deadline:
        busy = [i for i in (0, 1) if metric(two_engines, "whisper_engine_running_sequences", f'{{engine="{i}"}}')]
        running = busy[0] if busy else None
        time.sleep(0.1)
    assert running is not None
    pids = engine_pids(two_engines)
    os.kill(pids[running], signal.SIGKILL)
    # the other engine serves while the killed one is down, and /health stays ready
    served = client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    assert contains_words(served.text, JFK_WORDS)
    thread.join(timeout=60)
    assert (outcome["status"], outcome["code"]) == (503, "engine_unavailable")  # only the request it held
    deadline = time.monotonic() + 120
    while httpx.get(f"{two_engines.url}/health").json().get("engines") != "2/2" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(f"{two_engines.url}/health").json()["engines"] == "2/2", two_engines.log_tail()
    assert engine_pids(two_engines)[running] != pids[running]
    assert metric(two_engines, "whisper_engine_restarts_total") == 1
    with ThreadPoolExecutor(4) as pool:  # both serve again
        texts = list(pool.map(lambda _: client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1").text,
                              range(4)))  # fmt: skip
    assert all(contains_words(t, JFK_WORDS) for t in texts)


def test_requests_an_engine_had_not_started_go_to_the_other_when_it_dies(two_engines, data_dir):
    """An engine stopped (SIGSTOP) while requests are sent to it holds them unstarted; when it is killed they go to
    the other engine and are answered 200, not 503: none of them ran, so none can have killed it."""
    deadline = time.monotonic() + 120
    while httpx.get(f"{two_engines.url}/health").json().get("engines") != "2/2" and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = engine_pids(two_engines)
    client = two_engines.client()
    os.kill(pids[0], signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(client.audio.transcriptions.create, file=data_dir / JFK, model="whisper-1")
                       for _ in range(6)]  # fmt: skip
            time.sleep(3)  # sent: the stopped engine's share waits there
            assert sum(f.done() for f in futures) < 6  # some are held by the stopped engine
            os.kill(pids[0], signal.SIGKILL)
            texts = [f.result(timeout=120).text for f in futures]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)
    assert all(contains_words(t, JFK_WORDS) for t in texts)

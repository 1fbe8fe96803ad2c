"""A plain request beside long diarized_json ones keeps its speed: the diarization models run in a process of
their own at the lowest priority (--diarization-process, --diarization-nice) and yield the CPU to the engine, while
the diarized requests still get their speakers right.

A reliability bound, not a speed target (those live in benchmarks/diarization_beside_plain.py and BENCHMARKS.md).
Most of a plain request's slowdown beside long requests is their transcription, which shares the engine's batch as
any request does: on a shared 2-core machine about 3x its time alone, whether they are diarized or not, and that
ratio moves with the machine. So the plain request's median beside the diarized requests is held against its
median beside the same recordings transcribed without diarization, in the same run: what diarization adds. The
priorities of the threads, read from /proc, catch the old behaviour (threads of the server's process at its
priority) directly.
"""

from __future__ import annotations

import io
import os
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from tests.helpers.conversations import FOUR, RATE, assemble

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread priorities are Linux's"),
]

DIARIZED = 2  # long diarized_json requests at once
SECONDS = 75.0  # each: four speakers taking turns (about 85 s, each speaker in one or two turns); the plain requests
# beside them are timed through both the long requests' transcription and their diarization (the benchmark,
# benchmarks/diarization_beside_plain.py, measures ten-minute ones)
BESIDE_S = 60.0  # plain requests are timed for this long beside them (or until they are done)
BOUND = 2.0  # the plain request's median beside the diarized requests, at most this times its median beside the same
# recordings transcribed plainly (1.35-1.64x in four runs on a shared 2-core machine)


@pytest.fixture(scope="module")
def remote(diarization_preload_server):
    """A server of its own (not the session's `server`, whose diarizer other tests keep busy), the diarization models
    loaded at start-up (the default priority: lowest); test_diarization.py's start-up test shares it."""
    return diarization_preload_server


def wav(samples) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def post(server, name: str, data: bytes, response_format: str) -> httpx.Response:
    fields = {"model": "whisper-1", "response_format": response_format}
    response = httpx.post(f"{server.base_url}/audio/transcriptions", files={"file": (name, data)}, data=fields,
                          timeout=600)  # fmt: skip
    assert response.status_code == 200, response.text
    return response


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, name) of each process whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it ended
            continue
        if int(text.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(stat.parent.name), text[text.index("(") + 1 : text.rindex(")")]))
    return found


def nice_values(pid: int) -> set[int]:
    """The nice values of a process's threads."""
    values = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            values.add(os.getpriority(os.PRIO_PROCESS, int(task.name)))
        except OSError:  # it ended
            pass
    return values


def timed(server, plain: bytes) -> float:
    start = time.perf_counter()
    post(server, "jfk.flac", plain, "json")
    return time.perf_counter() - start


def beside(server, plain: bytes, recordings, response_format: str, during=None) -> tuple[list[float], list[dict]]:
    """The plain request's times while the recordings are transcribed at once in `response_format` (for at most
    BESIDE_S); `during()` is called while they still run. Returns the times and the long requests' bodies."""
    answers: list[dict] = [{}] * len(recordings)

    def run(i: int) -> None:
        answers[i] = post(server, f"long{i}.wav", wav(recordings[i][0]), response_format).json()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(recordings))]
    for t in threads:
        t.start()
    times, deadline = [], time.monotonic() + BESIDE_S
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        times.append(timed(server, plain))
    if during is not None:
        during()
    for t in threads:
        t.join()
    assert len(times) >= 5, times
    return times, answers


def test_plain_requests_keep_their_speed_beside_long_diarized_ones(remote, data_dir):
    plain = (data_dir / "g1_en_jfk.flac").read_bytes()
    recordings = [assemble(FOUR, SECONDS, seed=i) for i in range(DIARIZED)]
    post(remote, "warm.wav", wav(assemble(FOUR, 20, seed=99)[0]), "diarized_json")
    timed(remote, plain)
    alone = statistics.median(timed(remote, plain) for _ in range(5))

    def priorities() -> None:
        # the diarization models' threads, all of them, at the lowest priority in a process of their own; the
        # server's (the engine's among them) at theirs
        diarizers = [p for p, name in children(remote.proc.pid) if name == "whisper-diarize"]
        assert len(diarizers) == 1 and nice_values(diarizers[0]) == {19}, children(remote.proc.pid)
        assert nice_values(remote.proc.pid) == {os.getpriority(os.PRIO_PROCESS, 0)}  # this test's, as it started it

    transcribed, _ = beside(remote, plain, recordings, "json")
    diarized, answers = beside(remote, plain, recordings, "diarized_json", priorities)
    assert statistics.median(diarized) <= BOUND * statistics.median(transcribed), (alone, transcribed, diarized)
    # diarization still does its work: each recording's four readers found, turns at most a few seconds off
    for (_, turns), body in zip(recordings, answers):
        assert len({s["speaker"] for s in body["segments"]}) == len(FOUR), body["segments"]
        first = {}
        for s in body["segments"]:
            first.setdefault(s["speaker"], s["start"])
        starts = sorted(first.values())
        truth = sorted({name: start for start, _, name in reversed(turns)}.values())
        assert all(abs(a - b) < 3.0 for a, b in zip(starts, truth)), (starts, truth)

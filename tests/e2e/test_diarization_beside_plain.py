"""A plain request beside long diarized_json ones keeps its speed: the diarization models run in a process of
their own at the lowest priority (--diarization-process, --diarization-nice) and yield the CPU to the engine, while
the diarized requests still get their speakers right.

A reliability bound, not a speed target (those live in benchmarks/diarization_beside_plain.py and BENCHMARKS.md):
medians against a generous bound, so that a busy 2-core machine passes. Most of what is left of the slowdown is
the diarized requests' own transcription, which shares the engine's batch as any request does, so the bound alone
does not always catch the old behaviour (threads of the server's process at its priority: 2.0-3.3x in three runs
on a shared 2-core machine, against 0.7-2.4x in five now); the priorities of the threads, read from /proc, do.
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
BOUND = 3.0  # the plain request's median beside them, at most this times its median alone


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


def test_plain_requests_keep_their_speed_beside_long_diarized_ones(remote, data_dir):
    plain = (data_dir / "g1_en_jfk.flac").read_bytes()
    recordings = [assemble(FOUR, SECONDS, seed=i) for i in range(DIARIZED)]
    post(remote, "warm.wav", wav(assemble(FOUR, 20, seed=99)[0]), "diarized_json")
    timed(remote, plain)
    alone = statistics.median(timed(remote, plain) for _ in range(5))

    answers: list[dict | None] = [None] * DIARIZED

    def diarize(i: int) -> None:
        answers[i] = post(remote, f"long{i}.wav", wav(recordings[i][0]), "diarized_json").json()

    threads = [threading.Thread(target=diarize, args=(i,)) for i in range(DIARIZED)]
    for t in threads:
        t.start()
    beside, deadline = [], time.monotonic() + BESIDE_S
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        beside.append(timed(remote, plain))
    # the diarization models' threads, all of them, at the lowest priority in a process of their own; the server's
    # (the engine's among them) at theirs
    diarizers = [p for p, name in children(remote.proc.pid) if name == "whisper-diarize"]
    assert len(diarizers) == 1 and nice_values(diarizers[0]) == {19}, children(remote.proc.pid)
    assert nice_values(remote.proc.pid) == {os.getpriority(os.PRIO_PROCESS, 0)}  # this test's, as it started it
    for t in threads:
        t.join()

    assert len(beside) >= 5, beside
    assert statistics.median(beside) <= BOUND * alone, (alone, beside)
    # diarization still does its work: each recording's four readers found, turns at most a few seconds off
    for (_, turns), body in zip(recordings, answers):
        assert len({s["speaker"] for s in body["segments"]}) == len(FOUR), body["segments"]
        first = {}
        for s in body["segments"]:
            first.setdefault(s["speaker"], s["start"])
        starts = sorted(first.values())
        truth = sorted({name: start for start, _, name in reversed(turns)}.values())
        assert all(abs(a - b) < 3.0 for a, b in zip(starts, truth)), (starts, truth)

"""Diarization's threads at a low OS priority (engine/diarization/priority.py): the pass's thread, the per-recording
CPU stages' threads, the OpenMP team torch gives a niced thread and every thread of the diarizer's own process,
while the caller's (the engine's) threads keep theirs."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from engine import DiarizationJob, DiarizerProcess, SpeakerDiarizer, SpeakerTurn
from engine.diarization.priority import MAX_NICE, lower_priority
from server.speakers import DiarizationWorker

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def tasks() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def test_a_niced_thread_and_the_torch_team_it_starts_run_at_its_priority():
    x = torch.randn(512, 512)
    torch.mm(x, x)  # this thread's own team exists before
    before = tasks()
    seen = {}

    def diarization_thread():
        lower_priority(MAX_NICE)
        for _ in range(20):
            torch.mm(x, x)  # libgomp starts a team for this thread: it inherits the thread's nice value
        seen["own"] = nice_of(threading.get_native_id())
        seen["new"] = {t: nice_of(t) for t in tasks() - before}

    thread = threading.Thread(target=diarization_thread)
    thread.start()
    thread.join()
    assert seen["own"] == MAX_NICE
    if torch.get_num_threads() > 1:  # a team of one is the calling thread alone
        assert len(seen["new"]) >= 2 and set(seen["new"].values()) == {MAX_NICE}
    assert nice_of(threading.get_native_id()) == 0  # the caller's (the engine's) priority is untouched


def test_nice_zero_leaves_a_thread_alone():
    with ThreadPoolExecutor(1, initializer=lower_priority, initargs=(0,)) as pool:
        assert pool.submit(lambda: nice_of(threading.get_native_id())).result() == 0


def test_the_diarizers_pass_and_cpu_stages_run_niced_whoever_calls():
    diarizer = SpeakerDiarizer(nice=MAX_NICE)  # the models load on first use: none here
    own = lambda: nice_of(threading.get_native_id())
    assert diarizer._passes.submit(own).result() == MAX_NICE
    assert diarizer._cores.submit(own).result() == MAX_NICE
    old = SpeakerDiarizer(nice=0)
    assert old._passes.submit(own).result() == 0 and old._cores.submit(own).result() == 0
    assert DiarizationWorker(diarizer).pool.submit(own).result() == 0  # the server's waiting thread keeps its own


def test_every_thread_of_the_diarizer_process_runs_niced():
    diarizer = DiarizerProcess(nice=MAX_NICE)
    try:
        # under a second of audio: one speaker, no model loaded, but the child is up
        (result,) = diarizer.diarize_many([DiarizationJob(np.zeros(8000, np.float32))])
        assert result.turns == [SpeakerTurn(0.0, 0.5, 0)]
        pid = diarizer._child.process.pid
        assert {nice_of(int(t)) for t in os.listdir(f"/proc/{pid}/task")} == {MAX_NICE}
        assert nice_of(threading.get_native_id()) == 0
    finally:
        diarizer.close()
    assert not os.path.exists(f"/proc/{pid}")


def test_a_nice_value_out_of_range_is_refused():
    with pytest.raises(ValueError, match="nice"):
        SpeakerDiarizer(nice=20)
    with pytest.raises(ValueError, match="nice"):
        DiarizerProcess(nice=-1)

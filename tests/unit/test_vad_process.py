"""Live Silero streams in a child process (engine/transcription/vad_process.py) against the same streams in this
process: the same probabilities, the same frame positions, streams dropped with their stand-ins, a new child after
a crash."""

from __future__ import annotations

import gc
import os
import signal

import numpy as np
import pytest

from engine.transcription.vad import VoiceActivityDetector, push_many
from engine.transcription.vad_process import SpeechStreamsProcess
from tests.helpers.realtime import stream_rounds

CLIP = "g2_en_earnings22_4483589_261-321s.wav"  # 60 s of a conference call, with pauses


@pytest.fixture(scope="module")
def audio(load_clip) -> np.ndarray:
    return load_clip(CLIP)


@pytest.fixture(scope="module")
def remote():
    process = SpeechStreamsProcess()
    yield process
    process.close()


def test_streams_in_the_child_get_what_they_get_here(audio, remote):
    vad = VoiceActivityDetector()
    clips = [audio[i * 48_000 : (i + 1) * 48_000] for i in range(3)]  # 3 s each, different speech
    here = [vad.stream() for _ in clips]
    there = [remote.stream() for _ in clips]
    got_here: list[list[float]] = [[] for _ in clips]
    got_there: list[list[float]] = [[] for _ in clips]
    for pieces in stream_rounds(clips, 2):
        for i, probs in enumerate(push_many(here, pieces)):
            got_here[i] += probs
        for i, probs in enumerate(remote.push_many(there, pieces)):
            got_there[i] += probs
        assert [s.frames_done for s in there] == [s.frames_done for s in here]
    for a, b in zip(got_here, got_there):
        assert len(a) == len(b) > 50
        assert np.abs(np.array(a) - np.array(b)).max() < 1e-6


def test_a_pass_over_many_streams_gets_what_it_gets_here_on_a_quarter_of_the_cores(audio, remote):
    """Past PARALLEL_STREAMS a pass runs on up to a quarter of the cores (one on a 4-core machine or smaller)."""
    from engine.transcription.vad_process import MAX_PASS_THREADS, PARALLEL_STREAMS, pass_threads

    assert pass_threads(PARALLEL_STREAMS - 1, 64) == 1 and pass_threads(PARALLEL_STREAMS, 2) == 1
    assert pass_threads(PARALLEL_STREAMS, 8) == 2 and pass_threads(1000, 64) == MAX_PASS_THREADS
    vad = VoiceActivityDetector()
    clips = [audio[i * 4_000 : i * 4_000 + 8_000] for i in range(PARALLEL_STREAMS)]  # 0.5 s each, overlapping
    here = [vad.stream() for _ in clips]
    there = [remote.stream() for _ in clips]
    for pieces in ([c[:1_600] for c in clips], [c[1_600:] for c in clips]):  # a microphone's 100 ms, then the rest
        for a, b in zip(push_many(here, pieces), remote.push_many(there, pieces)):
            assert len(a) == len(b)
            assert np.abs(np.array(a) - np.array(b)).max(initial=0) < 1e-5


def test_a_stream_goes_from_the_child_with_its_stand_in(audio, remote):
    local = VoiceActivityDetector().stream()
    kept, dropped = remote.stream(), remote.stream()
    remote.push_many([kept, dropped], [audio[:4000], audio[4000:8000]])
    local.push(audio[:4000])
    before = remote.live_streams()
    del dropped
    gc.collect()
    assert remote.live_streams() == before - 1
    # the other streams go on untouched
    assert np.allclose(remote.push_many([kept], [audio[4000:9000]])[0], local.push(audio[4000:9000]), atol=1e-6)


def test_after_the_child_dies_a_new_one_goes_on_where_each_stream_was(audio, remote):
    stream = remote.stream()
    first = audio[:10_000]  # ends inside a frame
    probs = remote.push_many([stream], [first])[0]
    pid = remote._child.process.pid
    os.kill(pid, signal.SIGKILL)
    remote._child.process.join()
    assert stream.frames_done == len(probs) == 10_000 // 512
    later = remote.push_many([stream], [audio[10_000:20_000]])[0]
    assert remote._child.process.pid != pid
    assert stream.frames_done == 20_000 // 512
    assert len(later) == 20_000 // 512 - 10_000 // 512  # the same frames as one stream would complete
    assert all(0.0 <= p <= 1.0 for p in later)

"""Running the engine in tests: batched submission, step counts, tokens and scores of a result, and
faster-whisper as the reference (its model on a CPU, its greedy transcript, a cache of transcripts per clip)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import pytest

from engine.request import DecodeOptions, TranscriptionResult

# Greedy, one window, no timestamps: the setting in which our tokens must equal faster-whisper's.
GREEDY = DecodeOptions(without_timestamps=True, temperatures=(0.0,))
WAIT_S = 600  # a hung request fails the test instead of blocking the run


@dataclass(frozen=True, slots=True)
class Reference:
    """faster-whisper's output for one clip."""

    tokens: list[int]
    text: str
    language: str
    language_probability: float


def submit_all(
    engine, audios: dict[str, np.ndarray], options: DecodeOptions = GREEDY
) -> dict[str, TranscriptionResult]:
    """Submits every clip before waiting on any, so the engine batches them."""
    handles = {name: engine.submit(audio, options) for name, audio in audios.items()}
    return {name: handle.wait(timeout=WAIT_S) for name, handle in handles.items()}


def settled_steps(engine) -> int:
    """The engine's step (launch) count once its last one has ended (a result is sent before the step counts
    itself)."""
    while True:
        steps = engine.num_steps
        time.sleep(0.05)
        if engine.num_steps == steps:
            return steps


def scores(result: TranscriptionResult) -> list[float]:
    """Each segment's average log-probability and no-speech probability (float sums: compared approximately)."""
    return [x for s in result.segments for x in (s.avg_logprob, s.no_speech_prob)]


def tokens_of(result: TranscriptionResult) -> list[int]:
    return [t for segment in result.segments for t in segment.tokens]


def faster_whisper_transcribe(model, audio: np.ndarray) -> Reference:
    """faster-whisper's greedy transcript, decoded the way the engine's GREEDY options decode."""
    segments, info = model.transcribe(audio, beam_size=1, temperature=0, without_timestamps=True, vad_filter=False)
    segments = list(segments)
    tokens = [t for segment in segments for t in segment.tokens]
    text = "".join(segment.text for segment in segments).strip()
    return Reference(tokens, text, info.language, info.language_probability)


def first_difference(ours: list[int], theirs: list[int]) -> int:
    """Index of the first differing token (the shorter length when one is a prefix of the other)."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))


def faster_whisper_model(model_dir):
    """faster-whisper at float32, the precision our CPU engine runs at."""
    fw = pytest.importorskip("faster_whisper")
    # Its default of 4 threads oversubscribes a 2-core CI runner.
    num_threads = min(4, os.cpu_count() or 1)
    return fw.WhisperModel(str(model_dir), device="cpu", compute_type="float32", cpu_threads=num_threads)


class TranscriptCache:
    """name -> transcript, computed on first request for the names still missing (in one batch) and then kept."""

    def __init__(self, compute):
        self._compute = compute  # list of clip names -> {name: transcript}
        self._done: dict = {}

    def __call__(self, names) -> dict:
        if missing := [name for name in names if name not in self._done]:
            self._done.update(self._compute(missing))
        return {name: self._done[name] for name in names}

"""Silero for every live session in one pass: turn detection that scales with the sessions.

Each append of each session needs the speech probabilities of the 32 ms frames it completes, a few frames at a
time. Run per append, Silero's fixed cost per call (about a millisecond of CPU for three frames) caps a server at
a few dozen microphones. Here the appends that arrive while one pass runs wait for the next, which runs all of
them together (VoiceActivityDetector.push_many, in passes.py's worker thread): the more sessions, the bigger the
batch, and a pass costs about what one stream's does.
"""

from __future__ import annotations

import numpy as np

from engine import VoiceActivityDetector

from .passes import WorkerPasses


class SpeechBatcher:
    def __init__(self, vad: VoiceActivityDetector):
        self.vad = vad
        self.passes = WorkerPasses(self._pass)

    def stream(self):
        return self.vad.stream()

    async def push(self, stream, samples: np.ndarray) -> list[float]:
        """The probabilities of the frames `samples` completes in `stream` (one push per stream at a time)."""
        return await self.passes.run((stream, samples))

    def _pass(self, items: list[tuple[object, np.ndarray]]) -> list[list[float]]:
        streams, audio = zip(*items)
        return self.vad.push_many(list(streams), list(audio))

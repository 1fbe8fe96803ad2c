"""The speech models of every live session, each run for all of them in one pass: turn detection that scales with
the sessions.

Each append of each session needs the speech probabilities of the 32 ms frames it completes, a few frames at a
time. Run per append, Silero's fixed cost per call (about a millisecond of CPU for three frames) caps a server at
a few dozen microphones. Here the appends that arrive while one pass runs wait for the next, which runs all of
them together (VoiceActivityDetector.push_many, in passes.py's worker thread): the more sessions, the bigger the
batch, and a pass costs about what one stream's does. semantic_vad's question, whether a turn that paused is
complete (EndOfTurnModel, about 50 ms of CPU), is batched the same way in passes of its own, so that Silero's
frames never wait behind it.

On a GPU server Silero's streams live in a process of their own (`--realtime-vad-process`, engine's
SpeechStreamsProcess), so that a pass does not hold the GIL the event loop needs; on a CPU, in the server's
process, as the end-of-turn model does.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from engine import EndOfTurnModel, SpeechStreamsProcess, VoiceActivityDetector

from .passes import WorkerPasses

log = logging.getLogger(__name__)


class SpeechBatcher:
    """`vad`: a VoiceActivityDetector or a SpeechStreamsProcess (the same stream, push_many, start and close)."""

    def __init__(self, vad: VoiceActivityDetector | SpeechStreamsProcess, end_of_turn: EndOfTurnModel):
        self.vad = vad
        self.passes = WorkerPasses(self._pass)
        self.end_of_turn = WorkerPasses(end_of_turn.probabilities)  # loads its weights on the first question
        self._started = False

    def stream(self):
        """A new stream; the first one starts Silero (its process) in the background if start() has not, so that
        the session's first pass does not wait for it."""
        self.start()
        return self.vad.stream()

    def start(self) -> None:
        """Silero loaded (its process started) in the background, once."""
        if not self._started:
            self._started = True
            threading.Thread(target=self._start, name="vad-start", daemon=True).start()

    def _start(self) -> None:
        try:
            self.vad.start()
        except Exception:  # the first pass raises it again, to its sessions
            log.exception("could not start the voice activity detector")

    def close(self) -> None:
        self.vad.close()

    async def push(self, stream, samples: np.ndarray) -> list[float]:
        """The probabilities of the frames `samples` completes in `stream` (one push per stream at a time)."""
        return await self.passes.run((stream, samples))

    async def turn_complete(self, audio: np.ndarray) -> float:
        """The probability that the turn whose 16 kHz audio so far is `audio` is complete."""
        return await self.end_of_turn.run(audio)

    def _pass(self, items: list[tuple[object, np.ndarray]]) -> list[list[float]]:
        streams, audio = zip(*items)
        return self.vad.push_many(list(streams), list(audio))

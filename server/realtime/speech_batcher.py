"""Silero for every live session in one pass: turn detection that scales with the sessions.

Each append of each session needs the speech probabilities of the 32 ms frames it completes, a few frames at a
time. Run per append, Silero's fixed cost per call (about a millisecond of CPU for three frames) caps a server at
a few dozen microphones. Here the appends that arrive while one pass runs wait for the next, which runs all of
them together (VoiceActivityDetector.push_many, in a worker thread): the more sessions, the bigger the batch,
and a pass costs about what one stream's does.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from engine import VoiceActivityDetector


class SpeechBatcher:
    def __init__(self, vad: VoiceActivityDetector):
        self.vad = vad
        self.pending: list[tuple[object, np.ndarray, asyncio.Future]] = []
        self.wake: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None

    def stream(self):
        return self.vad.stream()

    async def push(self, stream, samples: np.ndarray) -> list[float]:
        """The probabilities of the frames `samples` completes in `stream` (one push per stream at a time)."""
        if self.worker is None or self.worker.done():
            self.wake = asyncio.Event()
            self.worker = asyncio.ensure_future(self._run())
        future = asyncio.get_running_loop().create_future()
        self.pending.append((stream, samples, future))
        self.wake.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, []
            if not batch:
                continue
            streams, audio, futures = zip(*batch)
            try:
                results = await asyncio.to_thread(self.vad.push_many, list(streams), list(audio))
            except Exception as exc:  # noqa: BLE001 - handed to every session of the pass
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for future, probs in zip(futures, results):
                if not future.done():  # a session that went away cancelled its wait
                    future.set_result(probs)

    async def close(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker

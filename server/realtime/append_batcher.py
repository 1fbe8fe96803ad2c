"""Every live session's small appends decoded in one worker-thread pass, beside the event loop.

An open microphone appends 100 ms of audio ten times a second, and each append's base64 and FFmpeg work (PyAV:
decoding and resampling to 16 kHz, with the session's own resampler state) costs the thread that runs it some
60 us. In the event loop, hundreds of sessions' appends are most of its time, and every other event of every
session (and /health) waits behind them. Here the appends that arrive while one pass runs wait for the next, which
decodes all of them in a worker thread, as speech_batcher.py runs Silero: the loop only hands them over. A session
has one append in flight at a time (it reads its next event once this one is handled), so its audio stays in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np


class AppendBatcher:
    def __init__(self) -> None:
        self.pending: list[tuple[Callable[[str], np.ndarray], str, asyncio.Future]] = []
        self.wake: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None

    async def decode(self, append: Callable[[str], np.ndarray], data: str) -> np.ndarray:
        """append(data) (a session's InputAudio.append_base64) in the next pass; what it returns or raises."""
        if self.worker is None or self.worker.done():
            self.wake = asyncio.Event()
            self.worker = asyncio.ensure_future(self._run())
        future = asyncio.get_running_loop().create_future()
        self.pending.append((append, data, future))
        self.wake.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, []
            if batch:
                outcomes = await asyncio.to_thread(_decode_all, [(append, data) for append, data, _ in batch])
                for (_, _, future), (samples, exc) in zip(batch, outcomes):
                    if future.done():  # a session that went away cancelled its wait
                        continue
                    if exc is not None:
                        future.set_exception(exc)
                    else:
                        future.set_result(samples)


def _decode_all(
    work: list[tuple[Callable[[str], np.ndarray], str]],
) -> list[tuple[np.ndarray | None, Exception | None]]:
    outcomes: list[tuple[np.ndarray | None, Exception | None]] = []
    for append, data in work:
        try:
            outcomes.append((append(data), None))
        except Exception as exc:  # noqa: BLE001 - the session's own error (bad base64), raised at its await
            outcomes.append((None, exc))
    return outcomes

"""diarized_json's speakers: turns from the diarizer beside the engine's decode, or one speaker per channel.

A call recording often puts each party on its own channel. When a diarized_json upload's two channels differ
(`channels_differ`), or the request says `speaker_per_channel=true`, each channel is transcribed as its own request
(both in the engine's shared batch), the left channel's segments are speaker A's and the right's B's, and the
segments are interleaved by time; no diarization model runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from starlette.requests import Request

from engine import (
    SAMPLE_RATE,
    DecodeOptions,
    Diarization,
    DiarizationJob,
    DiarizedSegment,
    EngineLike,
    SpeakerCount,
    SpeakerDiarizer,
    TranscriptionResult,
    decode_channels,
)

from .drain import Drain
from .errors import APIError
from .metrics import Metrics
from .parsing.audio import decode_upload
from .streaming import submit, wait_result

log = logging.getLogger(__name__)

# Channels count as different speakers when their difference carries at least half the energy of their mean
# (identical channels: 0; two unrelated voices: ~4; the data set's mono-as-stereo files: below 0.001).
CHANNELS_DIFFER_RATIO = 0.5
# The most audio one diarization pass takes (all its recordings and references together): what bounds the
# models' memory (about 1 GiB of filterbanks) and the wait of a pass's first caller.
PASS_SECONDS = 4 * 3600.0


class DiarizationWorker:
    """The diarizer behind a thread of its own, in passes: the recordings that arrive while a pass runs wait for the
    next, which takes all of them (up to PASS_SECONDS of audio) through each model together
    (SpeakerDiarizer.diarize_many). Those waiting wait here, not in the event loop's default executor (which
    decodes every upload)."""

    def __init__(self, diarizer: SpeakerDiarizer | None = None, metrics: Metrics | None = None) -> None:
        self.diarizer = diarizer or SpeakerDiarizer()
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diarization")
        self.pending: list[tuple[DiarizationJob, asyncio.Future]] = []
        self.wake: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None

    async def diarize(
        self, audio: np.ndarray, known: list[tuple[str, np.ndarray]], count: SpeakerCount | None
    ) -> Diarization:
        """The recording's speaker turns (and known speakers' names); a failure fails this request only."""
        if self.worker is None or self.worker.done():
            self.wake = asyncio.Event()
            self.worker = asyncio.ensure_future(self._run())
        metrics, start = self.metrics, time.perf_counter()
        if metrics is not None:
            metrics.diarization_pending.inc()
        outcome = "failed"
        future = asyncio.get_running_loop().create_future()
        self.pending.append((DiarizationJob(audio, known, count), future))
        self.wake.set()
        try:
            result = await future
            outcome = "ok"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:  # any failure of the diarization models fails this request only
            log.error("speaker diarization failed", exc_info=exc)
            raise APIError(500, "Speaker diarization failed for this audio.", type="server_error") from exc
        finally:
            if metrics is not None:
                metrics.diarization_pending.dec()
                metrics.diarizations.labels(outcome).inc()
                metrics.diarization_latency.observe(time.perf_counter() - start)

    def _next_pass(self) -> list[tuple[DiarizationJob, asyncio.Future]]:
        """The waiting recordings whose callers still wait, oldest first, up to PASS_SECONDS of audio (at least
        one); the rest stay for the pass after."""
        waiting = [(job, f) for job, f in self.pending if not f.done()]
        taken, seconds = 0, 0.0
        for job, _ in waiting:
            seconds += len(job.audio) / SAMPLE_RATE + sum(len(r) for _, r in job.known or ()) / SAMPLE_RATE
            if taken and seconds > PASS_SECONDS:
                break
            taken += 1
        self.pending = waiting[taken:]
        return waiting[:taken]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.wake.wait()
            self.wake.clear()
            while batch := self._next_pass():
                jobs, futures = zip(*batch)
                if self.metrics is not None:
                    self.metrics.diarization_pass.observe(len(jobs))
                try:
                    results = await loop.run_in_executor(self.pool, self.diarizer.diarize_many, list(jobs))
                except Exception as exc:  # noqa: BLE001 - a shared stage failed: handed to every job of the pass
                    results = [exc] * len(futures)
                for future, result in zip(futures, results):
                    if future.done():  # its caller went away
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)


def channels_differ(channels: np.ndarray) -> bool:
    left, right = channels.astype(np.float64)
    mean = np.mean(((left + right) / 2) ** 2)
    return bool(mean > 0 and np.mean((left - right) ** 2) > CHANNELS_DIFFER_RATIO * mean)


async def decode_two_channels(data: bytes, max_audio_seconds: float) -> np.ndarray:
    """The upload as (2, samples): its left and right channels (a mono file's one channel twice)."""
    return await decode_upload(data, max_audio_seconds, decoder=decode_channels)


async def transcribe_channels(
    engine: EngineLike, channels: np.ndarray, options: DecodeOptions, request: Request, drain: Drain
) -> tuple[TranscriptionResult, list[DiarizedSegment], list[TranscriptionResult]]:
    """Each channel transcribed as its own request, side by side in the engine: the combined result (texts in time
    order), its segments with speaker 0 (left) and 1 (right), and each channel's own result."""
    handles = [submit(engine, np.ascontiguousarray(c), options, drain) for c in channels]
    waits = [asyncio.ensure_future(wait_result(h, request, drain)) for h in handles]
    try:
        results = await asyncio.gather(*waits)
    except BaseException:
        for h, w in zip(handles, waits):
            w.cancel()
            h.abort()
        raise
    segments = sorted(
        (DiarizedSegment(s.start, s.end, s.text.strip(), speaker) for speaker, r in enumerate(results)
         for s in r.segments if s.text.strip()),
        key=lambda s: (s.start, s.speaker),
    )  # fmt: skip
    first = results[0]
    combined = TranscriptionResult(
        text=" ".join(s.text for s in segments),
        segments=[],
        language=first.language,
        duration=max(r.duration for r in results),
        num_tokens=sum(r.num_tokens for r in results),
    )
    return combined, segments, list(results)

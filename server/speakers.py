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
    DecodeOptions,
    Diarization,
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
from .parsing import decode_upload
from .streaming import submit, wait_result

log = logging.getLogger(__name__)

# Channels count as different speakers when their difference carries at least half the energy of their mean
# (identical channels: 0; two unrelated voices: ~4; the data set's mono-as-stereo files: below 0.001).
CHANNELS_DIFFER_RATIO = 0.5


class DiarizationWorker:
    """The diarizer behind a thread of its own: recordings go through its one pipeline one at a time, and those
    waiting for it wait here, not in the event loop's default executor (which decodes every upload)."""

    def __init__(self, diarizer: SpeakerDiarizer | None = None, metrics: Metrics | None = None) -> None:
        self.diarizer = diarizer or SpeakerDiarizer()
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diarization")

    async def diarize(
        self, audio: np.ndarray, known: list[tuple[str, np.ndarray]], count: SpeakerCount | None
    ) -> Diarization:
        """The recording's speaker turns (and known speakers' names); a failure fails this request only."""
        loop = asyncio.get_running_loop()
        metrics, start = self.metrics, time.perf_counter()
        if metrics is not None:
            metrics.diarization_pending.inc()
        outcome = "failed"
        try:
            result = await loop.run_in_executor(self.pool, self.diarizer.diarize, audio, known, count)
            outcome = "ok"
            return result
        except Exception as exc:  # any failure of the diarization model fails this request only
            log.exception("speaker diarization failed")
            raise APIError(500, "Speaker diarization failed for this audio.", type="server_error") from exc
        finally:
            if metrics is not None:
                metrics.diarization_pending.dec()
                metrics.diarizations.labels(outcome).inc()
                metrics.diarization_latency.observe(time.perf_counter() - start)


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

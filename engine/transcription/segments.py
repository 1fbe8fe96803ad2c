"""Timestamp tokens -> segments, and where the next window starts (openai/whisper's seek rule)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from engine.audio.constants import HOP_LENGTH, SAMPLE_RATE
from engine.model.tokenizer import TIME_PRECISION

FRAME_SECONDS = HOP_LENGTH / SAMPLE_RATE  # 0.01 s per mel frame
INPUT_STRIDE = 2  # mel frames per encoder position (conv2 has stride 2)


@dataclass(slots=True)
class RawSegment:
    start: float
    end: float
    tokens: list[int]  # including the bounding timestamp tokens
    first: int = 0  # index of tokens[0] in the window's tokens


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def split_by_timestamps(
    tokens: list[int], ts_begin: int, seek: int, segment_size: int
) -> tuple[list[RawSegment], int]:
    """Cut a window's tokens at consecutive timestamp pairs; return the segments and the next seek (frames)."""
    time_offset = seek * FRAME_SECONDS
    single_timestamp_ending = len(tokens) >= 2 and tokens[-2] < ts_begin <= tokens[-1]
    consecutive = [i for i in range(1, len(tokens)) if tokens[i] >= ts_begin and tokens[i - 1] >= ts_begin]
    segments: list[RawSegment] = []
    if consecutive:
        slices = consecutive + ([len(tokens)] if single_timestamp_ending else [])
        last = 0
        for cut in slices:
            piece = tokens[last:cut]
            start = time_offset + (piece[0] - ts_begin) * TIME_PRECISION
            end = time_offset + (piece[-1] - ts_begin) * TIME_PRECISION
            segments.append(RawSegment(start, end, piece, last))
            last = cut
        if single_timestamp_ending:
            # a lone timestamp at the end means no speech after it: move on a whole window
            next_seek = seek + segment_size
        else:
            # the last segment is unfinished: restart the next window at its opening timestamp
            next_seek = seek + (tokens[last - 1] - ts_begin) * INPUT_STRIDE
    else:
        duration = segment_size * FRAME_SECONDS
        timestamps = [t for t in tokens if t >= ts_begin]
        if timestamps and timestamps[-1] != ts_begin:
            duration = (timestamps[-1] - ts_begin) * TIME_PRECISION
        segments.append(RawSegment(time_offset, time_offset + duration, tokens))
        next_seek = seek + segment_size
    return segments, next_seek

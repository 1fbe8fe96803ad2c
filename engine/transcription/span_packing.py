"""Speech spans → windows: consecutive spans packed end to end (the silence between them dropped), with the map
from a position inside a window back to the original audio.

Positions are integers in one unit throughout (the chunked mode uses mel frames); nothing here knows about audio.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Piece:
    """The original range [start, end), placed in its window at `offset`."""

    start: int
    end: int
    offset: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Window:
    """Pieces laid end to end: window position `piece.offset + k` is original position `piece.start + k`."""

    pieces: tuple[Piece, ...]

    @property
    def length(self) -> int:
        last = self.pieces[-1]
        return last.offset + last.length

    @property
    def start(self) -> int:
        return self.pieces[0].start

    @property
    def end(self) -> int:
        return self.pieces[-1].end

    def to_original(self, position: float, is_end: bool = False) -> float:
        """Original position of a window position (clamped to the window).

        A position on a join belongs to the piece after it, unless it is the end of something (`is_end`), which
        then ends with the piece before it: a segment never stretches over the silence that was cut out.
        """
        offsets = [p.offset for p in self.pieces]
        find = bisect.bisect_left if is_end else bisect.bisect_right
        piece = self.pieces[max(find(offsets, position) - 1, 0)]
        return piece.start + min(max(position - piece.offset, 0), piece.length)

    def span_to_original(self, start: float, end: float, margin: int = 0) -> tuple[float, float]:
        """Original (start, end) of the window range [start, end].

        A range that crosses a join between pieces apart in the original by at most `margin` on its shorter side
        is moved wholly to the longer side: the audio around a join is padding, not speech, so a segment that
        starts just before a join is the speech after it, and one that ends just after a join the speech before.
        """
        for before, after in itertools.pairwise(self.pieces):
            join = after.offset
            if before.end == after.start or not start < join < end:
                continue  # contiguous in the original audio (no gap to jump), or not crossing this join
            if join - start <= min(margin, end - join):
                start = join
            elif end - join <= min(margin, join - start):
                end = join
        return self.to_original(start), self.to_original(end, is_end=True)


def split_long(spans: Sequence[tuple[int, int]], max_length: int) -> list[tuple[int, int]]:
    """Spans longer than `max_length` cut into the fewest equal parts that fit."""
    parts: list[tuple[int, int]] = []
    for start, end in spans:
        num_parts = max(1, -(-(end - start) // max_length))
        bounds = [start + (end - start) * k // num_parts for k in range(num_parts + 1)]
        parts.extend(itertools.pairwise(bounds))
    return parts


def pack_spans(spans: Sequence[tuple[int, int]], max_length: int) -> list[Window]:
    """Pack sorted, disjoint [start, end) spans, in order, into windows of at most `max_length` positions."""
    windows: list[Window] = []
    pieces: list[Piece] = []
    used = 0
    previous_end = None
    for start, end in split_long(spans, max_length):
        assert start <= end and (previous_end is None or previous_end <= start), (previous_end, start, end)
        previous_end = end
        if start == end:
            continue
        if used + end - start > max_length:
            windows.append(Window(tuple(pieces)))
            pieces, used = [], 0
        pieces.append(Piece(start, end, used))
        used += end - start
    if pieces:
        windows.append(Window(tuple(pieces)))
    return windows

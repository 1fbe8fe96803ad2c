"""A transcript's words attributed to speaker turns, and segments that never hold two speakers.

Each word goes to the speaker active at its midpoint (the turn that contains it, else the nearest turn: words
often start a little before the diarizer's turn does), as WhisperX assigns them; a Whisper segment is split
wherever consecutive words change speaker. A segment without word times goes whole to the speaker it overlaps
most.
"""

from __future__ import annotations

import bisect
import string
from dataclasses import dataclass

from engine.diarization.pipeline import SpeakerTurn
from engine.request import Segment, Word


@dataclass(frozen=True, slots=True)
class DiarizedSegment:
    start: float
    end: float
    text: str
    speaker: int


class _Turns:
    def __init__(self, turns: list[SpeakerTurn]):
        self.turns = sorted(turns, key=lambda t: t.start)
        self.starts = [t.start for t in self.turns]

    def at(self, time: float) -> int:
        """The speaker of the turn containing `time`, else of the nearest turn (0 when there are none)."""
        if not self.turns:
            return 0
        i = bisect.bisect_right(self.starts, time)
        near = [self.turns[j] for j in (i - 1, i) if 0 <= j < len(self.turns)]
        return min(
            near, key=lambda t: 0.0 if t.start <= time <= t.end else min(abs(time - t.start), abs(time - t.end))
        ).speaker

    def most(self, start: float, end: float) -> int:
        """The speaker with the most time in [start, end] (the one nearest its middle when none overlaps)."""
        overlap: dict[int, float] = {}
        for t in self.turns:
            if t.start < end and t.end > start:
                overlap[t.speaker] = overlap.get(t.speaker, 0.0) + min(end, t.end) - max(start, t.start)
        return max(overlap, key=overlap.__getitem__) if overlap else self.at((start + end) / 2)


def diarized_segments(segments: list[Segment], turns: list[SpeakerTurn]) -> list[DiarizedSegment]:
    """The transcript's segments, split where the speaker changes, each with its speaker; empty texts dropped."""
    index = _Turns(turns)
    out: list[DiarizedSegment] = []
    for segment in segments:
        if not segment.words:
            if segment.text.strip():
                out.append(DiarizedSegment(segment.start, segment.end, segment.text.strip(),
                                           index.most(segment.start, segment.end)))  # fmt: skip
            continue
        run: list[Word] = []
        speaker = -1
        for word in segment.words:
            who = index.at((word.start + word.end) / 2)
            if run and who != speaker:
                out.append(_joined(run, speaker))
                run = []
            run.append(word)
            speaker = who
        if run:
            out.append(_joined(run, speaker))
    return [s for s in out if s.text]


def segment_speakers(segments: list[Segment], turns: list[SpeakerTurn]) -> list[int]:
    """One speaker per transcript segment, its boundaries kept (verbose_json): the speaker of most of its words,
    else the one it overlaps most."""
    index = _Turns(turns)
    out = []
    for segment in segments:
        votes: dict[int, int] = {}
        for word in segment.words or ():
            who = index.at((word.start + word.end) / 2)
            votes[who] = votes.get(who, 0) + 1
        out.append(max(votes, key=votes.__getitem__) if votes else index.most(segment.start, segment.end))
    return out


def _joined(words: list[Word], speaker: int) -> DiarizedSegment:
    return DiarizedSegment(words[0].start, words[-1].end, "".join(w.word for w in words).strip(), speaker)


def speaker_labels(count: int) -> list[str]:
    """OpenAI's labels for speakers without names: A, B, ..., Z, then AA, AB, ..."""
    return [speaker_label(i) for i in range(count)]


def speaker_label(index: int) -> str:
    """The label of speaker `index` (0: A, 25: Z, 26: AA)."""
    label, i = "", index + 1
    while i:
        i, r = divmod(i - 1, 26)
        label = string.ascii_uppercase[r] + label
    return label

"""ChunkedTranscription: speech found by VAD, packed into windows that all decode at once (chunking_strategy)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from engine.audio.constants import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES
from engine.model.tokenizer import Tokenizer
from engine.request import DecodeOptions, Segment, SegmentEvent, TranscriptionResult
from engine.runtime.sequence import Sequence, WindowJob
from engine.transcription.segments import FRAME_SECONDS
from engine.transcription.sequential import Transcription
from engine.transcription.span_packing import Window, pack_spans

JOIN_TOLERANCE_MS = 1000


class ChunkedTranscription(Transcription):
    """Decodes every window of a request at once, in the shared batch, instead of one after another.

    The windows hold only speech: VAD spans packed end to end, up to 30 s each. Each window is decoded by a
    `Transcription` of its own (Whisper's algorithm: temperature fallback, and a second decode of what a first
    one left unfinished), so no window is conditioned on another's text, only on the request's prompt; with no
    language given, each window detects its own. Segments go out in time order, their times mapped back to the
    original audio. The engine sees only this object: every window's job names it and carries its window index.
    Sampling at temperature > 0 draws from the window's own generator (seeded from the request's seed and the
    window's index), so the draws do not depend on the order in which the windows happen to run.
    """

    def __init__(
        self,
        request_id: str,
        mel: Tensor,
        duration: float,
        options: DecodeOptions,
        tokenizer: Tokenizer,
        n_text_ctx: int,
        emit: Callable[[object], None],
        spans: list[tuple[int, int]],
    ):
        """spans : speech (start, end) in samples of the 16 kHz audio, each at most 30 s long."""
        super().__init__(request_id, mel, duration, options, tokenizer, n_text_ctx, emit)
        frames = [(start // HOP_LENGTH, min(end // HOP_LENGTH, self.content_frames)) for start, end in spans]
        self.windows: list[Window] = pack_spans(frames, N_FRAMES)
        padding_ms = options.chunking.prefix_padding_ms if options.chunking is not None else 0
        # frames around a join where a segment boundary is taken to be the join: the non-speech kept around each
        # span, plus how far Whisper's segment boundaries stray (they come early, when a pause was cut short)
        self.margin = (padding_ms + JOIN_TOLERANCE_MS) * FRAMES_PER_SECOND // 1000
        self.parts = [self._part(index) for index in range(len(self.windows))]
        self.pending: list[list[Segment]] = [[] for _ in self.windows]  # mapped, not yet sent
        self.parts_done = [False] * len(self.windows)
        self.head = 0  # the earliest unfinished window: its segments go out as they come, later ones wait

    def _part(self, index: int) -> Transcription:
        window = self.windows[index]
        slices = [self.mel[:, p.start : p.end] for p in window.pieces]
        # Transcription takes a mel's last frame for STFT padding and never reads it
        mel = torch.cat([*slices, slices[-1][:, -1:]], dim=-1)
        duration = window.length * FRAME_SECONDS
        args = (self.request_id, mel, duration, self.options, self.tokenizer, self.n_text_ctx)
        part = Transcription(*args, emit=lambda item: self._on_part_output(index, item))
        part.seed = window_seed(self.options.seed, index)
        return part

    def _own(self, index: int, job: WindowJob) -> WindowJob:
        """A part's job (of this request's id, drawing from the part's generator), addressed to its window."""
        job.window_index = index
        return job

    def start_jobs(self) -> list[WindowJob]:
        jobs: list[WindowJob] = []
        for index, part in enumerate(self.parts):
            if self.aborted:
                return []
            part_jobs = part.start_jobs()
            if not part_jobs:  # nothing to decode in this window (cannot happen with non-empty pieces)
                part.finish()
            jobs += [self._own(index, job) for job in part_jobs]
        return jobs

    def tokens_to_align(self, seq: Sequence) -> list[int]:
        return self.parts[seq.job.window_index].tokens_to_align(seq)

    def on_window_done(self, seq: Sequence) -> list[WindowJob]:
        """The window's next decodes (a fallback retry or the rest of the window), or none."""
        index = seq.job.window_index
        return [self._own(index, job) for job in self.parts[index].on_window_done(seq)]

    def _on_part_output(self, index: int, item: object) -> None:
        if isinstance(item, SegmentEvent):
            self.pending[index].extend(self._to_original(index, segment) for segment in item.segments)
        elif isinstance(item, TranscriptionResult):
            self.parts_done[index] = True
        self._emit_in_order()
        if self.head == len(self.windows) and not self.done:
            self.finish()

    def _to_original(self, index: int, segment: Segment) -> Segment:
        window = self.windows[index]
        # whole frames (timestamps are 20 ms steps): a time on a join must land exactly on it
        start_frame, end_frame = round(segment.start * FRAMES_PER_SECOND), round(segment.end * FRAMES_PER_SECOND)
        start, end = window.span_to_original(start_frame, end_frame, self.margin)
        segment.seek = int(window.to_original(segment.seek))
        segment.end = round(min(end * FRAME_SECONDS, self.duration), 3)
        segment.start = round(min(start * FRAME_SECONDS, segment.end), 3)
        for word in segment.words or []:  # words inside the segment, mapped the same way
            w_start = window.to_original(round(word.start * FRAMES_PER_SECOND)) * FRAME_SECONDS
            w_end = window.to_original(round(word.end * FRAMES_PER_SECOND)) * FRAME_SECONDS
            word.start = round(min(max(w_start, segment.start), segment.end), 2)
            word.end = round(min(max(w_end, word.start), segment.end), 2)
        return segment

    def _emit_in_order(self) -> None:
        while self.head < len(self.windows):
            new, self.pending[self.head] = self.pending[self.head], []
            for segment in new:
                segment.id = len(self.segments)
                self.segments.append(segment)
            if new:
                self.emit(SegmentEvent(new))
            if not self.parts_done[self.head]:
                return
            self.head += 1

    def finish(self) -> None:
        if self.done:  # the last window finished while the request started: the engine calls finish() again
            return
        if self.language is None:  # like Whisper: the language of the first speech
            self.language = next((part.language for part in self.parts if part.language is not None), None)
        super().finish()


def window_seed(seed: int | None, index: int) -> int:
    """A window's sampling seed: distinct per window (their draws are not copies of each other) and fixed by the
    request's seed, whatever order the windows run in."""
    return ((seed or 0) * 1_000_003 + index) % 2**63

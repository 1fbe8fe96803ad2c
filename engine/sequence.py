"""Sequence: one decode stream over one 30 s window, holding one cache slot while it runs."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from engine.longform.alignment import AlignmentInput
    from engine.longform.transcription import Transcription

# `Sequence.pending` holds this in place of a token the GPU has sampled but the host has not read yet: the next
# step takes it from the previous step's output on the device (row `Sequence.row`), so it can be launched before
# that read (engine.Engine.step overlaps them).
ON_DEVICE = -1


@dataclass(slots=True)
class WindowJob:
    """A window waiting for a slot: its mel, its prompt and the temperature to decode it at."""

    transcription: Transcription
    mel: Tensor  # (n_mels, N_FRAMES)
    prompt: list[int]
    temperature: float
    detect_language: bool  # prompt ends at <|startoftranscript|>; the model picks the language token
    forced_after_language: list[int] = field(default_factory=list)  # task (+ notimestamps) after detection
    with_timestamps: bool = True
    max_new_tokens: int | None = None
    fixed_decode_tokens: int | None = None
    window_index: int = 0  # which of the request's windows (chunked mode decodes several at once)
    word_timestamps: bool = False
    num_frames: int = 0  # mel frames of real audio in the window (the rest is padding)


@dataclass(slots=True, eq=False)
class Sequence:
    job: WindowJob
    slot: int
    num_cached: int = 0  # positions written (or queued to be written) in this slot's self-attention cache
    pending: list[int] = field(default_factory=list)  # tokens to feed at the next forward (or ON_DEVICE)
    row: int | None = None  # row in the last launched decode step while its output is still only on the device
    num_launched: int = 0  # steps launched whose output is a sampled token (known before their results are)
    forced: deque[int] = field(default_factory=deque)  # prompt tokens still to feed after language detection
    detecting: bool = False  # next output is the language token
    tokens: list[int] = field(default_factory=list)  # sampled tokens (text + timestamps), EOT excluded
    sum_logprob: float = 0.0
    no_speech_prob: float = 0.0
    language: str | None = None
    last_timestamp: int = -1  # last sampled timestamp token, -1 if none
    finished: bool = False
    aborted: bool = False
    alignment: AlignmentInput | None = None  # word-timestamp inputs, read from the slot before it is reused

    @property
    def num_sampled(self) -> int:
        return len(self.tokens)

    @property
    def sampling(self) -> bool:
        """The next output is a sampled token (not a forced prompt token or a language pick)."""
        return not self.detecting and not self.forced

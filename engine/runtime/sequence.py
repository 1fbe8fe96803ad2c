"""Sequence: one decode stream over one 30 s window, holding one cache slot while it runs."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from engine.request import DecodeOptions

if TYPE_CHECKING:
    from engine.decoding.beam_search import BeamGroup
    from engine.transcription.alignment import AlignmentInput

# `Sequence.pending` holds this in place of a token the GPU has sampled but the host has not read yet: the next
# step takes it from the previous step's output on the device (row `Sequence.row`), so it can be launched before
# that read (engine.Engine.step overlaps them).
ON_DEVICE = -1


@dataclass(slots=True)
class WindowJob:
    """A window waiting for a slot: its mel, its prompt and the temperature to decode it at, and what the scheduler
    and the runner need of its request, its options among them, from which the logit rules and the beam search make
    their state (a plain record: the request's state stays in the engine's RequestTable)."""

    request_id: str
    mel: Tensor  # (n_mels, N_FRAMES), or fewer frames for a short context (DecodeOptions.context_margin_s)
    prompt: list[int]
    temperature: float
    detect_language: bool  # prompt ends at <|startoftranscript|>; the model picks the language token
    forced_after_language: list[int] = field(default_factory=list)  # task (+ notimestamps) after detection
    with_timestamps: bool = True
    fixed_decode_tokens: int | None = None
    window_index: int = 0  # which of the request's windows (chunked mode decodes several at once)
    word_timestamps: bool = False
    num_frames: int = 0  # mel frames of real audio in the window (the rest is padding)
    options: DecodeOptions = field(default_factory=DecodeOptions)  # the request's, as the engine prepared them
    candidate: int = 0  # which of an attempt's best_of samples
    beam_size: int = 1  # above 1: beam search (engine/decoding/beam_search.py), one slot per beam
    background: bool = False  # a background request's (DecodeOptions.background): only slots no other window needs
    generator: torch.Generator | None = None  # what sampling above temperature 0 draws from
    # A short context's cap on its sampled tokens (timestamps included): such a decode repeats itself more often
    # than a full window's, and a repetition would otherwise run to the context limit. None: no cap.
    max_tokens: int | None = None


@dataclass(slots=True, eq=False)
class Sequence:
    job: WindowJob
    slot: int  # its row in the running batch, and the row's self-attention cache
    cross_slot: int = 0  # where its window's cross-attention cache lives (a beam search's rows share one)
    num_cached: int = 0  # positions written (or queued to be written) in this slot's self-attention cache
    pending: list[int] = field(default_factory=list)  # tokens to feed at the next forward (or ON_DEVICE)
    row: int | None = None  # row in the last launched decode step while its output is still only on the device
    num_launched: int = 0  # steps launched whose output is a sampled token (known before their results are)
    forced: deque[int] = field(default_factory=deque)  # prompt tokens still to feed after language detection
    detecting: bool = False  # next output is the language token
    tokens: list[int] = field(default_factory=list)  # sampled tokens (text + timestamps), EOT excluded
    logprobs: list[float] = field(default_factory=list)  # each of `tokens`' log-probability
    sum_logprob: float = 0.0
    no_speech_prob: float = 0.0
    language: str | None = None
    last_timestamp: int = -1  # last sampled timestamp token, -1 if none
    finished: bool = False
    aborted: bool = False
    alignment: AlignmentInput | None = None  # word-timestamp inputs, read from the slot before it is reused
    beam: BeamGroup | None = None  # the window's beams, when it decodes with beam search
    # each logit rule's state for this row, as (rule index, state) for the rules that apply to its window
    # (engine/decoding/processor.py)
    rule_states: list[tuple[int, Any]] = field(default_factory=list)
    # Its next step's inputs are decided on the host from this step's output (keyword bonuses follow the last
    # token; beams are chosen from the group's candidates): the step must be read before the next is launched.
    host_bound: bool = False

    @property
    def fixed_decode_tokens(self) -> int | None:
        return self.job.fixed_decode_tokens

    @property
    def beam_follower(self) -> bool:
        """A beam other than the one that carries the window's result."""
        return self.beam is not None and self.beam.leader is not self

    @property
    def sampling(self) -> bool:
        """The next output is a sampled token (not a forced prompt token or a language pick)."""
        return not self.detecting and not self.forced

    @property
    def must_not_end(self) -> bool:
        """A window decoding a fixed number of tokens (DecodeOptions.fixed_decode_tokens) that has not launched
        them all: its next token may not be <|endoftext|>."""
        fixed = self.job.fixed_decode_tokens
        return fixed is not None and self.num_launched < fixed

    def ends_within(self, steps: int) -> bool:
        """Whether a fixed token count is reached inside the next `steps` steps, but not at their start."""
        fixed = self.job.fixed_decode_tokens
        return fixed is not None and self.num_launched < fixed < self.num_launched + steps

    def feed_prompt_stepwise(self) -> None:
        """Feed the prompt one token per decode step (riding along with the running batch) instead of a prompt
        pass: its first token goes into the next step, the rest are forced after it."""
        self.forced.extend(self.pending[1:])
        del self.pending[1:]

    def launch(self, row: int) -> LaunchedRow:
        """What the host knows as soon as a step is launched with this sequence in `row`: its positions advance,
        and its next input is a forced prompt token, or the output that the device will feed back."""
        self.num_cached += len(self.pending)
        self.row = row
        if self.forced:  # prompt tokens still to feed: the model's output is not used
            output = Output.FORCED
            self.pending = [self.forced.popleft()]
        elif self.detecting:  # the model's pick among language tokens, then the rest of the prompt
            output = Output.LANGUAGE
            self.detecting = False
            self.forced.extend(self.job.forced_after_language)
            self.pending = [ON_DEVICE]
        else:
            output = Output.TOKEN
            self.num_launched += 1
            self.pending = [ON_DEVICE]
        return LaunchedRow(self, output, self.num_cached)

    def launch_greedy(self, steps: int, row: int) -> list[LaunchedRow]:
        """launch() for `steps` greedy steps in one launch, every one sampling; the last step's token stays on the
        device, in `row`."""
        rows = []
        for _ in range(steps):
            self.num_cached += 1
            self.num_launched += 1
            rows.append(LaunchedRow(self, Output.TOKEN, self.num_cached))
        self.row = row
        self.pending = [ON_DEVICE]
        return rows

    def settle(self, token: int) -> None:
        """No later step holds this sequence's output: its next input is known on the host again."""
        self.row = None
        if self.pending[0] == ON_DEVICE:
            self.pending = [token]

    def append(
        self, token: int, logprob: float, num_cached: int, eot: int, timestamp_begin: int, n_text_ctx: int
    ) -> bool:
        """A sampled token, `num_cached` positions cached when it was sampled: <|endoftext|> ends the window (unless
        a fixed count is decoded), any other token joins it, and the context limit ends it cleanly. Returns whether
        the token joined."""
        self.sum_logprob += logprob
        fixed = self.job.fixed_decode_tokens
        if token == eot and fixed is None:
            self.finished = True
            return False
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if token >= timestamp_begin:
            self.last_timestamp = token
        if (fixed is not None and len(self.tokens) >= fixed) or num_cached + 1 >= n_text_ctx or self.capped:
            self.finished = True
        return True

    @property
    def capped(self) -> bool:
        """A short context's decode has sampled as many tokens as it may (WindowJob.max_tokens)."""
        return self.job.max_tokens is not None and len(self.tokens) >= self.job.max_tokens


class Output(enum.Enum):
    """What a launched step's output is for one sequence."""

    FORCED = "forced"  # a forced prompt token was fed: the output is not used
    LANGUAGE = "language"  # the model's pick among language tokens
    TOKEN = "token"  # a sampled token


@dataclass(slots=True)
class LaunchedRow:
    """One row of a launched step, read back in launch order."""

    seq: Sequence
    output: Output
    num_cached: int  # the sequence's cached positions after the step

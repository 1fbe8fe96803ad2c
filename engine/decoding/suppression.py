"""Tokens a row may not sample: the checkpoint's suppress list (every row, every step), begin-suppress (a window's
first sampled token: no blank, no immediate end) and <|endoftext|> before a fixed token count is reached."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from engine.decoding.rule import NEG_INF, LogitRule, RuleSetup

if TYPE_CHECKING:
    from engine.runtime.sequence import Sequence, WindowJob


class SuppressTokens(LogitRule):
    """openai/whisper's SuppressTokens with the checkpoint's list: non-speech symbols and the special tokens."""

    every_row = True

    def __init__(self, setup: RuleSetup):
        super().__init__(setup)
        ids = sorted({i for i in setup.suppress_tokens if 0 <= i < setup.n_vocab})
        self.ids = torch.tensor(ids, dtype=torch.long, device=setup.device)

    def apply(self, logits: Tensor, inputs: None = None) -> None:
        logits.index_fill_(1, self.ids, NEG_INF)


class SuppressBlank(LogitRule):
    """openai/whisper's SuppressBlank: a window's first sampled token is neither a space nor <|endoftext|>."""

    def __init__(self, setup: RuleSetup):
        super().__init__(setup)
        self.ids = torch.tensor(sorted(set(setup.begin_suppress_tokens)), dtype=torch.long, device=setup.device)

    def applies(self, seq: Sequence) -> bool:
        return seq.sampling and seq.num_launched == 0

    def apply(self, logits: Tensor, rows: Tensor) -> None:
        logits.index_put_((rows[:, None], self.ids), self.neg_inf)


class FixedLength(LogitRule):
    """A window decoding a fixed number of tokens (DecodeOptions.fixed_decode_tokens, for benchmarks) may not end
    before it has launched them all."""

    def __init__(self, setup: RuleSetup):
        super().__init__(setup)
        self.eot = setup.tokenizer.eot
        self.eot_index = torch.tensor([self.eot], device=setup.device)

    def admit(self, job: WindowJob) -> bool | None:
        return True if job.fixed_decode_tokens is not None else None

    def applies(self, seq: Sequence) -> bool:
        return seq.sampling and seq.must_not_end

    def apply(self, logits: Tensor, rows: Tensor) -> None:
        logits.index_put_((rows, self.eot_index), self.neg_inf)

    def apply_mask(self, logits: Tensor, no_eot: Tensor) -> None:
        """The same edit on the rows where `no_eot` (bool, per row) holds: static shapes for a CUDA graph."""
        logits[:, self.eot].masked_fill_(no_eot, NEG_INF)

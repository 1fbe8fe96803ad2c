"""The language token: where a window detects its language, only language tokens may be picked, and of those only
the request's (`DecodeOptions.languages`) when it names several."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from engine.decoding.rule import NEG_INF, LogitRule, RuleRows, RuleSetup, StepContext

if TYPE_CHECKING:
    from engine.runtime.sequence import Sequence, WindowJob


class LanguageDetection(LogitRule):
    def __init__(self, setup: RuleSetup):
        super().__init__(setup)
        self.language_ids = frozenset(setup.tokenizer.language_ids.values())
        self.not_language = ~setup.mask(self.language_ids)

    def admit(self, job: WindowJob) -> tuple[int, ...] | None:
        """The language tokens this window may not pick (none excluded: an empty tuple)."""
        if not job.detect_language:
            return None
        codes = job.options.languages
        if not codes:
            return ()
        allowed = {self.setup.tokenizer.language_ids[c] for c in codes if c in self.setup.tokenizer.language_ids}
        return tuple(sorted(self.language_ids - allowed))

    def applies(self, seq: Sequence) -> bool:
        return seq.detecting and not seq.forced

    def inputs(self, rows: RuleRows, step: StepContext) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        banned_rows, banned_tokens = [], []
        for i, banned in zip(rows.rows, rows.states):
            banned_rows += [i] * len(banned)
            banned_tokens += banned
        banned = (step.to_device(banned_rows), step.to_device(banned_tokens)) if banned_rows else None
        return step.to_device(rows.rows), banned

    def apply(self, logits: Tensor, inputs: tuple[Tensor, tuple[Tensor, Tensor] | None]) -> None:
        rows, banned = inputs
        logits[rows] = logits[rows].masked_fill(self.not_language, NEG_INF)
        if banned is not None:
            logits.index_put_(banned, self.neg_inf)

"""Contextual biasing toward keywords (OpenAI's `keywords[]`): a bonus on the logits of the tokens that begin a
keyword or continue one the text has begun.

Each keyword is a token sequence (as it follows a space, the way words come mid-sentence). After every sampled
token, the row's text so far is matched against the keywords' prefixes: wherever its last tokens are a keyword's
first n (one or more matches: a prefix tree of the keywords, walked from every suffix), that keyword's next token
gets CONTINUE_BONUS. The first token of a keyword gets START_BONUS only where the model already ranks it within
START_GATE of its best token: a keyword is begun where the audio is close to it (a bonus on a common first token
everywhere would put it everywhere), and finished once it is begun. A segment's timestamps end any match.

The rule (`KeywordBonus`) makes a row's matcher when its window takes a slot, and after each of its tokens the
next bonuses; it is host-bound: those follow from the token just sampled.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from engine.decoding.rule import LogitRule, RuleRows, RuleSetup, StepContext

if TYPE_CHECKING:
    from engine.runtime.sequence import WindowJob

# The bonuses and the gate: the settings of a sweep (tiny.en, `benchmarks/keywords.py`) that spelled the most
# keywords right without changing any word of the LibriSpeech clips decoded with unrelated keywords.
START_BONUS = 5.0  # logits, on the first token of each keyword the model ranks near its best
START_GATE = 6.0  # logits below the row's best within which a first token counts as near
CONTINUE_BONUS = 8.0  # logits, on the next token of a keyword the text has begun


class KeywordBias:
    def __init__(self, sequences: list[tuple[int, ...]], scale: float = 1.0):
        self.scale = scale
        self.next: dict[tuple[int, ...], set[int]] = {}  # a keyword prefix -> the tokens that continue it
        for seq in sequences:
            for i in range(len(seq)):
                self.next.setdefault(tuple(seq[:i]), set()).add(seq[i])
        self.longest = max((len(s) for s in sequences), default=0)

    def bonuses(self, tokens: list[int], text_end: int) -> dict[int, tuple[float, bool]]:
        """token -> (bonus, gated) for the next token after `tokens` (a window's sampled tokens), whose text tokens
        are those below `text_end` (the rest are timestamps and specials, which end a match). A gated bonus applies
        only near the row's best logit (START_GATE)."""
        out = dict.fromkeys(self.next.get((), ()), (START_BONUS * self.scale, True))
        tail: list[int] = []
        for token in reversed(tokens[-(self.longest - 1) :] if self.longest > 1 else []):
            if token >= text_end:
                break
            tail.insert(0, token)
        for n in range(1, len(tail) + 1):
            for token in self.next.get(tuple(tail[-n:]), ()):
                out[token] = (CONTINUE_BONUS * self.scale, False)
        return out


class KeywordBonus(LogitRule):
    host_bound = True

    def __init__(self, setup: RuleSetup):
        super().__init__(setup)
        self.tokenizer = setup.tokenizer

    def admit(self, job: WindowJob) -> KeywordBias | None:
        opts = job.options
        if not opts.keywords or not opts.keyword_bias:
            return None
        return self._bias(opts.keywords, opts.keyword_bias)

    @functools.lru_cache(maxsize=64)  # noqa: B019 (the rule lives as long as its engine)
    def _bias(self, keywords: tuple[str, ...], scale: float) -> KeywordBias:
        """A request's matcher, made once for all its windows: each keyword as it follows a space."""
        return KeywordBias([tuple(self.tokenizer.encode(" " + k)) for k in keywords], scale)

    def inputs(self, rows: RuleRows, step: StepContext) -> Tensor | None:
        """(n, 4) float32 on the device, one host copy: row, token, bonus, and 1 where the bonus is gated."""
        values = []
        for i, seq, bias in zip(rows.rows, rows.seqs, rows.states):
            for token, (value, gated) in bias.bonuses(seq.tokens, self.tokenizer.eot).items():
                values.append([i, token, value, float(gated)])
        return step.to_device(values) if values else None

    def apply(self, logits: Tensor, bonuses: Tensor | None) -> None:
        if bonuses is None:
            return
        rows, tokens = bonuses[:, 0].long(), bonuses[:, 1].long()
        near = logits[rows, tokens] >= logits.amax(dim=-1)[rows] - START_GATE
        values = torch.where((bonuses[:, 3] == 0) | near, bonuses[:, 2], 0.0).to(logits.dtype)
        logits.index_put_((rows, tokens), values, accumulate=True)

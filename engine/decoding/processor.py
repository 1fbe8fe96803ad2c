"""LogitsProcessor: the registered logit rules over a batch of rows, each row with the state its rules made when its
window took a slot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from engine.decoding.rule import LogitRule, RuleRows, StepContext
from engine.decoding.suppression import FixedLength, SuppressTokens
from engine.decoding.timestamps import TimestampRules

if TYPE_CHECKING:
    from engine.runtime.sequence import Sequence


class LogitsProcessor:
    """Runs `rules` in their order. A rule that applies to no row of a step costs nothing, so the common step
    (greedy text, no timestamps) touches the logits once, for the suppress list."""

    def __init__(self, rules: list[LogitRule]):
        self.rules = rules
        self.every_row = [r for r in rules if r.every_row]
        self.per_row = [r for r in rules if not r.every_row]
        # the rules the multi-step graph replays in their static form (plain); every other rule either edits only a
        # window's first token or the language pick (which multi-step decoding never covers) or is host-bound
        self.suppress = next(r for r in rules if isinstance(r, SuppressTokens))
        self.fixed_length = next(r for r in rules if isinstance(r, FixedLength))
        self.timestamps = next(r for r in rules if isinstance(r, TimestampRules))

    def admit(self, seq: Sequence) -> None:
        """A window's row takes a slot: each rule's state for it, and whether its steps must be read before the next
        launch."""
        states = [(k, state) for k, rule in enumerate(self.per_row) if (state := rule.admit(seq.job)) is not None]
        seq.rule_states = states
        seq.host_bound = seq.host_bound or any(self.per_row[k].host_bound for k, _ in states)

    def prepare(self, seqs: list[Sequence], step: StepContext) -> list[tuple[LogitRule, Any]]:
        """Each rule's inputs for this step, built from the host's view of each row and queued to the device (the
        timestamp rule's from `step.rule_state`, which may still be on its way from the previous step)."""
        chosen: dict[int, RuleRows] = {}
        for i, seq in enumerate(seqs):
            for k, state in seq.rule_states:
                if self.per_row[k].applies(seq):
                    rows = chosen.get(k)
                    if rows is None:
                        rows = chosen[k] = RuleRows([], [], [])
                    rows.rows.append(i)
                    rows.seqs.append(seq)
                    rows.states.append(state)
        return [(self.per_row[k], self.per_row[k].inputs(chosen[k], step)) for k in sorted(chosen)]

    def __call__(self, logits: Tensor, prepared: list[tuple[LogitRule, Any]]) -> Tensor:
        """logits : (batch, n_vocab) float32, modified in place and returned. The every-row rules come first (they
        are registered first)."""
        for rule in self.every_row:
            rule.apply(logits, None)
        for rule, inputs in prepared:
            rule.apply(logits, inputs)
        return logits

    def plain(
        self, logits: Tensor, no_eot: Tensor, state: Tensor | None = None, stamped: Tensor | None = None
    ) -> Tensor:
        """The rules of a step in which every row samples greedily past its first token: the suppress list, no
        <|endoftext|> where `no_eot` (bool, per row) holds and, given every row's rule state, the timestamp rules
        on the rows where `stamped` (bool, per row; None: every row) holds; the same edits as __call__ makes for
        such rows, with static shapes and no host values, so a CUDA graph can replay them (multi-step decoding)."""
        self.suppress.apply(logits)
        self.fixed_length.apply_mask(logits, no_eot)
        if state is not None:
            # every row's rules computed, the rows without timestamps then given back their logits: each row's
            # edits are its own (one program per row), so a stamped row's are those of a batch without the others
            before = None if stamped is None else logits.clone()
            self.timestamps.apply_every_row(logits, state)
            if before is not None:
                logits.copy_(torch.where(stamped[:, None], logits, before))
        return logits

    def next_state(self, state: Tensor, tokens: Tensor) -> Tensor:
        """The timestamp rules' state after sampling `tokens` (one per row)."""
        return self.timestamps.next_state(state, tokens)

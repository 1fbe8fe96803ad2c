"""LogitRule: one edit of a step's logits (openai/whisper's LogitFilter), with per-window state made at admission.

A rule sees a window once, when it takes a slot (`admit`: its state, or None where the rule never applies), then at
every step the rows it applies to (`applies`, `inputs`: what the edit needs, copied to the device without waiting
for it) and the logits (`apply`). LogitsProcessor runs the registered rules in their order (decoding/__init__.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from engine.model.tokenizer import Tokenizer
    from engine.runtime.sequence import Sequence, WindowJob

NEG_INF = float("-inf")


@dataclass(frozen=True, slots=True)
class RuleSetup:
    """What every rule may build itself from, once at start-up."""

    tokenizer: Tokenizer
    n_vocab: int
    device: torch.device
    suppress_tokens: list[int]  # the checkpoint's (or the tokenizer's default) always-suppressed tokens
    begin_suppress_tokens: list[int]  # suppressed at a window's first sampled token
    max_initial_timestamp_index: int  # a window's first timestamp is at most this many 0.02 s steps in

    def mask(self, ids) -> Tensor:
        """A (n_vocab,) bool mask of the ids that are in the vocabulary."""
        mask = torch.zeros(self.n_vocab, dtype=torch.bool, device=self.device)
        mask[[i for i in ids if 0 <= i < self.n_vocab]] = True
        return mask


@dataclass(slots=True)
class RuleRows:
    """The rows of a step a rule applies to: their indices in the batch, sequences and the rule's state for each."""

    rows: list[int]
    seqs: list[Sequence]
    states: list[Any]


@dataclass(slots=True)
class StepContext:
    """What a rule's inputs may be built from besides its rows: the host-to-device copy that does not wait for the
    GPU, and the timestamp rules' state of every row of the batch (on the device; None while no window has
    timestamps)."""

    to_device: Callable[[list], Tensor]
    rule_state: Tensor | None


class LogitRule:
    """One edit of the logits. `every_row`: the rule edits every row of every step and needs no rows or inputs.
    `host_bound`: a row's next inputs follow from its last token, so a step with such a row is read before the next
    is launched, and such a row never decodes several steps per launch."""

    every_row = False
    host_bound = False

    def __init__(self, setup: RuleSetup):
        self.setup = setup
        # `logits[rows, cols] = float("-inf")` copies the scalar to the GPU from pageable memory, which waits for
        # every queued kernel: the host would sit idle until the decoder step finished instead of queueing the rules
        # and the sampling behind it. A device value does not.
        self.neg_inf = torch.tensor(NEG_INF, device=setup.device)

    def admit(self, job: WindowJob) -> Any | None:
        """The rule's state for a window taking a slot (kept for each of its rows); None: it never applies there."""
        return True

    def applies(self, seq: Sequence) -> bool:
        """Whether the rule edits this row's logits in this step (only asked of rows it admitted)."""
        return seq.sampling

    def inputs(self, rows: RuleRows, step: StepContext) -> Any:
        """What apply() needs for this step's rows, built on the host and queued to the device."""
        return step.to_device(rows.rows)

    def apply(self, logits: Tensor, inputs: Any) -> None:
        """Edit `logits` (batch, n_vocab) float32 in place."""
        raise NotImplementedError

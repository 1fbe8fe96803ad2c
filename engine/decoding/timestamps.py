"""openai/whisper's ApplyTimestampRules on the rows that decode with timestamps, from a small per-row state kept on
the device (the last token, the one before and the last timestamp), so a step launched before the previous one is
read, and the multi-step graph, can apply them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from engine.decoding.rule import NEG_INF, LogitRule, RuleRows, RuleSetup, StepContext
from engine.kernels import row_logsumexp

if TYPE_CHECKING:
    from engine.runtime.sequence import WindowJob


@dataclass(slots=True)
class TimestampInputs:
    """Per timestamp row: its row in the batch and what the rules need of its tokens so far."""

    rows: Tensor  # (n,) int64
    last_is_ts: Tensor  # (n,) bool
    penultimate_is_ts: Tensor  # (n,) bool
    min_timestamp: Tensor  # (n,) int64: timestamps never decrease
    is_first_ts: Tensor  # (n,) bool


class TimestampRules(LogitRule):
    def __init__(self, setup: RuleSetup):
        super().__init__(setup)
        tok = setup.tokenizer
        self.eot = tok.eot
        self.ts_begin = tok.timestamp_begin
        self.no_timestamps = tok.no_timestamps
        self.max_initial_offset = setup.max_initial_timestamp_index
        self.ts_offsets = torch.arange(setup.n_vocab - self.ts_begin, device=setup.device)

    def admit(self, job: WindowJob) -> bool | None:
        return True if job.with_timestamps else None

    def inputs(self, rows: RuleRows, step: StepContext) -> TimestampInputs:
        assert step.rule_state is not None, "a timestamp row without the rule state"
        return self.state_inputs(step.to_device(rows.rows), step.rule_state)

    def state_inputs(self, rows: Tensor, state: Tensor) -> TimestampInputs:
        """The rules' inputs for `rows` from the rule state: per row of a batch its last token, the one before (-1:
        none) and its last timestamp token (-1: none)."""
        ts_begin = self.ts_begin
        last, penult, last_ts = state[rows].unbind(1)
        last_is_ts = last >= ts_begin
        penultimate_is_ts = (penult < 0) | (penult >= ts_begin)  # fewer than two tokens counts as one
        # a lone timestamp may be repeated once to close its segment
        step = (~(last_is_ts & ~penultimate_is_ts)).long()
        min_timestamp = torch.where(last_ts < 0, ts_begin, last_ts + step)
        return TimestampInputs(rows, last_is_ts, penultimate_is_ts, min_timestamp, last < 0)

    def next_state(self, state: Tensor, tokens: Tensor) -> Tensor:
        """The rule state after sampling `tokens` (one per row): it becomes the last token, and the last timestamp
        if it is one."""
        last_ts = torch.where(tokens >= self.ts_begin, tokens, state[:, 2])
        return torch.stack((tokens, state[:, 0], last_ts), dim=1)

    def apply(self, logits: Tensor, r: TimestampInputs) -> None:
        x = logits[r.rows]  # (n, n_vocab) copy of the timestamp rows; written back at the end
        x[:, self.no_timestamps] = NEG_INF
        ts, text = x[:, self.ts_begin :], x[:, : self.eot]  # views into x
        # after a pair of timestamps comes text (or EOT); after a lone timestamp comes another timestamp
        ts.masked_fill_((r.last_is_ts & r.penultimate_is_ts)[:, None], NEG_INF)
        text.masked_fill_((r.last_is_ts & ~r.penultimate_is_ts)[:, None], NEG_INF)
        # timestamps never go backwards
        ts.masked_fill_(self.ts_offsets < (r.min_timestamp - self.ts_begin)[:, None], NEG_INF)
        # a window starts with a timestamp, no later than max_initial_timestamp
        first = r.is_first_ts[:, None]
        x[:, : self.ts_begin].masked_fill_(first, NEG_INF)
        ts.masked_fill_(first & (self.ts_offsets > self.max_initial_offset), NEG_INF)
        # if all timestamps together are likelier than any single text token, sample a timestamp
        logprobs = torch.log_softmax(x, dim=-1)  # one block per row, whatever the rows: row-invariant
        ts = logprobs[:, self.ts_begin :]
        ts_logprob = row_logsumexp.logsumexp_rows(ts) if row_logsumexp.applies(ts) else ts.logsumexp(dim=-1)
        text_max = logprobs[:, : self.ts_begin].amax(dim=-1)
        x[:, : self.ts_begin].masked_fill_((ts_logprob > text_max)[:, None], NEG_INF)
        logits[r.rows] = x

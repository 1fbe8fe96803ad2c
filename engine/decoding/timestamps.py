"""openai/whisper's ApplyTimestampRules on the rows that decode with timestamps, from a small per-row state kept on
the device (the last token, the one before and the last timestamp), so a step launched before the previous one is
read, and the multi-step graph, can apply them.

On a GPU the rules are one kernel, a program per row (engine/kernels/timestamp_rules.py), or without Triton a fixed
sequence of batched operations over the rows; neither reads a host value, so a graph can replay them. On a CPU,
where reading the state costs nothing, each row's rules become the few slices that apply to it, filled in place:
each batched operation is a pass over a copy of the rows' whole vocabulary, a large share of a small model's step
there. All compute the same edits; which one runs is chosen once, by the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from engine.decoding.rule import NEG_INF, LogitRule, RuleRows, RuleSetup, StepContext
from engine.kernels import row_logsumexp, timestamp_rules

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
        self.on_host = setup.device.type == "cpu"

    def admit(self, job: WindowJob) -> bool | None:
        return True if job.with_timestamps else None

    def inputs(self, rows: RuleRows, step: StepContext) -> DeviceRows | HostRows:
        assert step.rule_state is not None, "a timestamp row without the rule state"
        if self.on_host:
            return HostRows(rows.rows, step.rule_state)
        return DeviceRows(step.to_device(rows.rows), step.rule_state)

    def apply_every_row(self, logits: Tensor, state: Tensor) -> None:
        """The rules on every row of `logits`, given every row's state (the multi-step form)."""
        if self.on_host:
            self.apply(logits, HostRows(range(len(logits)), state))
        else:
            self.apply(logits, DeviceRows(torch.arange(len(logits), device=logits.device), state))

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

    def apply(self, logits: Tensor, r: TimestampInputs | DeviceRows | HostRows) -> None:
        if isinstance(r, HostRows):
            rows = logits.numpy()  # the same memory: numpy's slices cost no thread team's wake-up, torch's do
            for row, (last, penult, last_ts) in zip(r.rows, r.state[list(r.rows)].tolist()):
                self._apply_row(rows[row], last, penult, last_ts)
            return
        if isinstance(r, DeviceRows):
            if timestamp_rules.applies(logits):
                timestamp_rules.apply_rules(
                    logits, r.rows, r.state.contiguous(), self.ts_begin, self.eot, self.no_timestamps,
                    self.max_initial_offset,
                )  # fmt: skip
                return
            r = self.state_inputs(r.rows, r.state)
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
        # if all timestamps together are likelier than any single text token, sample a timestamp: compared as
        # logits, the log-softmax's normalizer being the same on both sides (as the kernel does)
        ts = x[:, self.ts_begin :]
        ts_sum = row_logsumexp.logsumexp_rows(ts) if row_logsumexp.applies(ts) else ts.logsumexp(dim=-1)
        text_max = x[:, : self.ts_begin].amax(dim=-1)
        x[:, : self.ts_begin].masked_fill_((ts_sum > text_max)[:, None], NEG_INF)
        logits[r.rows] = x

    def _apply_row(self, x: np.ndarray, last: int, penult: int, last_ts: int) -> None:
        """The rules on one row x (n_vocab,) in place, from its state as numbers: the same edits as apply()'s
        batched form, each only where it applies."""
        ts_begin, neg_inf = self.ts_begin, NEG_INF
        x[self.no_timestamps] = neg_inf
        last_is_ts, penultimate_is_ts = last >= ts_begin, penult < 0 or penult >= ts_begin
        if last_is_ts and penultimate_is_ts:  # after a pair of timestamps: text or EOT
            x[ts_begin:] = neg_inf
        elif last_is_ts:  # after a lone timestamp: another timestamp (or EOT)
            x[: self.eot] = neg_inf
        # timestamps never go backwards (a lone timestamp may be repeated once to close its segment)
        min_timestamp = ts_begin if last_ts < 0 else last_ts + (0 if last_is_ts and not penultimate_is_ts else 1)
        if min_timestamp > ts_begin:
            x[ts_begin:min_timestamp] = neg_inf
        if last < 0:  # a window starts with a timestamp, no later than max_initial_timestamp
            x[:ts_begin] = neg_inf
            x[ts_begin + self.max_initial_offset + 1 :] = neg_inf
        # if all timestamps together are likelier than any single text token, sample a timestamp (as logits)
        ts = x[ts_begin:]
        best = ts.max()
        if best > neg_inf and best + np.log(np.exp(ts - best).sum()) > x[:ts_begin].max():
            x[:ts_begin] = neg_inf


@dataclass(slots=True)
class DeviceRows:
    """On a GPU: the timestamp rows' indices in the batch (on the device) and the batch's rule state."""

    rows: Tensor  # (n,) int64
    state: Tensor  # (batch, 3) int64


@dataclass(slots=True)
class HostRows:
    """On a CPU: the timestamp rows' indices in the batch and the batch's rule state, read when the rules apply."""

    rows: list[int] | range
    state: Tensor  # (batch, 3) int64

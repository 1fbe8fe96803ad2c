"""openai/whisper's timestamp rules (engine/decoding/timestamps.py) on a GPU in one kernel: one program per
timestamp row reads the row's rule state, masks its logits in place and, if all timestamps together are likelier
than the best text token, masks the text.

The batched torch form makes about twenty small launches a step (gathers, masked fills, a log-softmax, a
logsumexp, a max, a scatter), which a decode step of a few rows pays in host time, not GPU time. Here the decision
compares the timestamps' logsumexp with the best text logit directly: the log-softmax's normaliser is the same on
both sides. Each row is reduced by its own program in one order, so a row's result does not depend on the batch.
Off a GPU, or without Triton, the caller keeps the torch form.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK = 2048  # columns per iteration of a row's loop (a vocabulary of 51,865: 26 iterations)


def applies(logits: Tensor) -> bool:
    """(rows, n_vocab) float32 on a GPU with unit column stride."""
    return (
        triton is not None and logits.is_cuda and logits.dim() == 2 and logits.dtype == torch.float32
        and logits.stride(1) == 1
    )  # fmt: skip


def apply_rules(
    logits: Tensor, rows: Tensor, state: Tensor, ts_begin: int, eot: int, no_timestamps: int, max_initial: int
) -> None:
    """The rules on logits[rows] in place, row i's from state[rows[i]] (the last token, the one before, the last
    timestamp: -1 for none); rows (n,) int64 on the device."""
    n = rows.shape[0]
    if n:
        _timestamp_rules[(n,)](
            logits, rows, state, logits.stride(0), logits.shape[1], ts_begin, eot, no_timestamps, max_initial,
            BLOCK=BLOCK, num_warps=8,
        )  # fmt: skip


if triton is not None:

    @triton.jit(do_not_specialize=["s_row", "n", "ts_begin", "eot", "no_ts", "max_initial"])
    def _timestamp_rules(X, ROWS, STATE, s_row, n, ts_begin, eot, no_ts, max_initial, BLOCK: tl.constexpr):
        r = tl.load(ROWS + tl.program_id(0)).to(tl.int64)
        row = X + r * s_row
        last = tl.load(STATE + r * 3)
        penult = tl.load(STATE + r * 3 + 1)
        last_ts = tl.load(STATE + r * 3 + 2)
        last_is_ts = last >= ts_begin
        penult_is_ts = (penult < 0) | (penult >= ts_begin)  # fewer than two tokens counts as one
        first = last < 0  # a window starts with a timestamp, no later than max_initial
        pair = last_is_ts & penult_is_ts  # after a pair of timestamps comes text (or EOT)
        lone = last_is_ts & (penult < ts_begin) & (penult >= 0)  # after a lone one, another timestamp
        # timestamps never go backwards; a lone timestamp may be repeated once to close its segment
        min_ts = tl.where(last_ts < 0, ts_begin, last_ts + tl.where(lone, 0, 1))
        max_ts = tl.where(first, ts_begin + max_initial, n)
        m = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: the timestamps' running max and sum of exp
        total = tl.zeros([BLOCK], tl.float32)
        text = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: the best text logit
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < n
            x = tl.load(row + cols, mask=inside, other=float("-inf"))
            is_ts = cols >= ts_begin
            masked = (cols == no_ts) | (~is_ts & first) | ((cols < eot) & lone)
            masked |= is_ts & (pair | (cols < min_ts) | (cols > max_ts))
            x = tl.where(masked, float("-inf"), x)
            tl.store(row + cols, x, mask=inside)
            xt = tl.where(is_ts, x, float("-inf"))
            m_new = tl.maximum(m, xt)
            scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
            total = total * scale + tl.where(xt == float("-inf"), 0.0, tl.exp(xt - m_new))
            m = m_new
            text = tl.maximum(text, tl.where(is_ts, float("-inf"), x))
        best = tl.max(m, axis=0)
        weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - best))
        ts_logsumexp = best + tl.log(tl.sum(total * weight, axis=0))
        if ts_logsumexp > tl.max(text, axis=0):  # sample a timestamp
            for start in range(0, ts_begin, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                tl.store(row + cols, tl.full([BLOCK], float("-inf"), tl.float32), mask=cols < ts_begin)

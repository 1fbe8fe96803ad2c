"""A greedy step's token and its log-probability in one pass over the logits on a GPU.

torch computes them as argmax, then log_softmax (which writes the whole row back) and a gather: three kernels, of
which the first two reduce a 51,866-wide row with one block each for a lone sequence, so a single multiprocessor
does all the work, every step (`benchmarks/gpu_profile.py --concurrency 1 --top N` lists a run's kernels by time).
Here each program reduces a block of the row to its max, the max's first index and the sum of exp(x - max); a
second kernel merges a row's blocks: the token is the first index of the row's max, as torch's argmax picks, and its
log-probability is x[token] - logsumexp(x) = -log(sum of exp(x - max)). The same float32 arithmetic as log_softmax
up to the summation order. Off a GPU, or without Triton, the caller keeps torch's operations.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK = 4096  # columns per program: 13 programs per row of a 51,866 vocabulary
NUM_WARPS = 8


def applies(logits: Tensor) -> bool:
    """(rows, vocab) float32 logits on a GPU with unit column stride."""
    return (
        triton is not None and logits.is_cuda and logits.dim() == 2 and logits.dtype == torch.float32
        and logits.stride(1) == 1
    )  # fmt: skip


def greedy_pick(logits: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(tokens (rows,) int64, their log-probabilities (rows,) float32) of the rows' argmax, and each row's max and
    log of its sum of exp(x - max) (rows,) float32: another token's log-probability is (x - max) - that log, which
    for the argmax is exactly the log-probability returned. Every row is reduced alone, in the same order whatever
    the number of rows."""
    rows, vocab = logits.shape
    blocks = triton.cdiv(vocab, BLOCK)
    part_max = torch.empty(rows, blocks, dtype=torch.float32, device=logits.device)
    part_index = torch.empty(rows, blocks, dtype=torch.int32, device=logits.device)
    part_sum = torch.empty(rows, blocks, dtype=torch.float32, device=logits.device)
    _block_stats[(rows, blocks)](
        logits, part_max, part_index, part_sum, logits.stride(0), vocab, blocks, BLOCK=BLOCK, num_warps=NUM_WARPS
    )
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    stats = torch.empty(3, rows, dtype=torch.float32, device=logits.device)  # log-probability, max, log of sum
    _merge_blocks[(rows,)](
        part_max, part_index, part_sum, tokens, stats[0], stats[1], stats[2], blocks,
        BLOCKS=triton.next_power_of_2(blocks), num_warps=1,
    )  # fmt: skip
    return tokens, stats[0], stats[1], stats[2]


if triton is not None:

    @triton.jit(do_not_specialize=["s_row"])
    def _block_stats(X, MAX, INDEX, SUM, s_row, V, blocks, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        block = tl.program_id(1)
        cols = block * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + row.to(tl.int64) * s_row + cols, mask=cols < V, other=float("-inf"))
        m, index = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        total = tl.sum(tl.where(x == float("-inf"), 0.0, tl.exp(x - m)), axis=0)  # suppressed tokens: -inf
        tl.store(MAX + row * blocks + block, m)
        tl.store(INDEX + row * blocks + block, block * BLOCK + index)
        tl.store(SUM + row * blocks + block, total)

    @triton.jit
    def _merge_blocks(MAX, INDEX, SUM, TOKENS, LOGPROBS, ROW_MAX, LOG_SUM, blocks, BLOCKS: tl.constexpr):
        row = tl.program_id(0)
        parts = tl.arange(0, BLOCKS)
        valid = parts < blocks
        m = tl.load(MAX + row * blocks + parts, mask=valid, other=float("-inf"))
        best = tl.max(m, axis=0)
        # the first block holding the row's max holds its first index (blocks are in column order)
        first = tl.min(tl.where(valid & (m == best), parts, BLOCKS), axis=0)
        token = tl.load(INDEX + row * blocks + first)
        sums = tl.load(SUM + row * blocks + parts, mask=valid, other=0.0)
        total = tl.sum(tl.where(m == float("-inf"), 0.0, sums * tl.exp(m - best)), axis=0)  # a block all suppressed
        log_total = tl.log(total)
        tl.store(TOKENS + row, token.to(tl.int64))
        tl.store(LOGPROBS + row, 0.0 - log_total)  # (x[token] - max) - log(total), x[token] being the max
        tl.store(ROW_MAX + row, best)
        tl.store(LOG_SUM + row, log_total)

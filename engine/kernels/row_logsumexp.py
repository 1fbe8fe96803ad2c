"""logsumexp over each row of a float32 matrix on a GPU, every row reduced by one program in one order.

torch's reduction kernels choose their thread layout from the whole tensor's shape: with few rows the threads
of a block (even several blocks) share one row's sum, with many rows a warp does, so a row's logsumexp changes in
its last bits with the number of rows. The timestamp rules compare such a sum with a maximum to decide whether a
window's next token is a timestamp (sampling.LogitsProcessor), and a flip there changes a transcript; here a
row's result depends on that row alone. Off a GPU, or without Triton, the caller keeps torch's logsumexp.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK = 1024  # columns per iteration of a row's loop (the timestamp columns: 1,501, two iterations)


def applies(x: Tensor) -> bool:
    """(rows, n) float32 on a GPU with unit column stride."""
    return triton is not None and x.is_cuda and x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1


def logsumexp_rows(x: Tensor) -> Tensor:
    """log(sum(exp(x))) of each row (rows,) float32; a row of -inf gives -inf, as torch's does."""
    rows, n = x.shape
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        _logsumexp_rows[(rows,)](x, out, x.stride(0), n, BLOCK=BLOCK, num_warps=4)
    return out


if triton is not None:

    @triton.jit(do_not_specialize=["s_row", "n"])
    def _logsumexp_rows(X, OUT, s_row, n, BLOCK: tl.constexpr):
        row = X + tl.program_id(0).to(tl.int64) * s_row
        m = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: running max and sum of exp(x - max)
        total = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < n, other=float("-inf"))
            m_new = tl.maximum(m, x)
            scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
            total = total * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
            m = m_new
        best = tl.max(m, axis=0)
        weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - best))
        tl.store(OUT + tl.program_id(0), best + tl.log(tl.sum(total * weight, axis=0)))

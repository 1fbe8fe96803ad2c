"""The encoder's self-attention as one Triton kernel whose result for a window does not depend on the batch.

Each program owns one (window, head, block of queries) and walks every key block of its window in order, keeping
the running maximum, the softmax's denominator and the weighted sum of values in registers (the online softmax of
flash attention). Nothing is split across programs, and the grid only grows with the number of windows, so a
window's output is computed by the same arithmetic in the same order whether it is alone or one of 32. torch's
flash kernel splits the keys across programs when few blocks would fill the GPU (a lone window of a small model),
and its memory-efficient kernel, which does not, is several times slower at the encoder's shapes.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK_M = 128  # queries per program
BLOCK_N = 64  # keys per step
NUM_WARPS = 8
NUM_STAGES = 3


def applies(q: Tensor) -> bool:
    return triton is not None and q.is_cuda and q.shape[-1] in (32, 64, 128) and q.stride(-1) == 1


def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(dim)) v for q, k, v (batch, heads, time, dim), unmasked; each may be a strided view (the
    heads of a fused q/k/v product). Returns (batch, heads, time, dim) as a view of a (batch, time, heads, dim)
    tensor, the layout that merging the heads reads without a copy."""
    b, h, t, d = q.shape
    assert applies(q) and k.stride(-1) == 1 and v.stride(-1) == 1, (q.shape, q.stride(), k.stride(), v.stride())
    out = torch.empty(b, t, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    if b == 0:
        return out
    _attention[(triton.cdiv(t, BLOCK_M), b * h)](
        q, k, v, out, d**-0.5 * 1.4426950408889634,  # exp2 of scores in log2 units
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        H=h, T=t, D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, IEEE=q.dtype == torch.float32,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _step(acc, m_i, l_i, q, k_ptr, v_ptr, cols, T: tl.constexpr, scale, MASK: tl.constexpr, IEEE: tl.constexpr):
        # one block of keys: scores, the running maximum and denominator rescaled, the values added
        if MASK:
            k = tl.load(k_ptr, mask=(cols < T)[None, :], other=0.0)
            v = tl.load(v_ptr, mask=(cols < T)[:, None], other=0.0)
        else:
            k = tl.load(k_ptr)
            v = tl.load(v_ptr)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee") * scale
        else:
            s = tl.dot(q, k) * scale
        if MASK:
            s = tl.where((cols < T)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        return acc, m_new, l_i

    @triton.jit
    def _attention(
        Q, K, V, O, scale, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
        H: tl.constexpr, T: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IEEE: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = bh % H
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.arange(0, BLOCK_N)
        rd = tl.arange(0, D)
        q = tl.load(Q + b * s_qb + h * s_qh + rm[:, None] * s_qt + rd[None, :], mask=(rm < T)[:, None], other=0.0)
        k_ptr = K + b * s_kb + h * s_kh + rn[None, :] * s_kt + rd[:, None]  # (D, BLOCK_N)
        v_ptr = V + b * s_vb + h * s_vh + rn[:, None] * s_vt + rd[None, :]  # (BLOCK_N, D)
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        full_blocks: tl.constexpr = T // BLOCK_N
        for j in range(full_blocks):  # every key block in order, the last partial one after
            acc, m_i, l_i = _step(
                acc, m_i, l_i, q, k_ptr + j * BLOCK_N * s_kt, v_ptr + j * BLOCK_N * s_vt, j * BLOCK_N + rn, T, scale,
                False, IEEE,
            )  # fmt: skip
        if T % BLOCK_N != 0:
            j = full_blocks
            acc, m_i, l_i = _step(
                acc, m_i, l_i, q, k_ptr + j * BLOCK_N * s_kt, v_ptr + j * BLOCK_N * s_vt, j * BLOCK_N + rn, T, scale,
                True, IEEE,
            )  # fmt: skip
        acc = acc / l_i[:, None]
        o_ptr = O + b * s_ob + h * s_oh + rm[:, None] * s_ot + rd[None, :]
        tl.store(o_ptr, acc.to(O.dtype.element_ty), mask=(rm < T)[:, None])

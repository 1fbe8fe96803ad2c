"""Self-attention of a one-token decode step on a GPU: the K/V write and the attention in one Triton kernel.

In torch a step's self-attention is several kernels per layer: an indexed write of the new K/V into each row's
slot (plus the copies that make its operands contiguous), then SDPA over a context padded to the graph's bucket
with an additive mask, or from 128 rows two batched products, a scale, the mask and a softmax. Here one program
per (row, head) writes its K/V at the row's position, then streams only the row's own prefix (positions below it,
not the bucket) with an online softmax, the way engine/kernels/int8_attention.py reads the cross cache: each of BLOCK_N
lanes keeps its own running max and sum, merged once at the end together with the new key, which is still in
registers. Keys of a row are contiguous in its slot, so each block is one coalesced read.

Rows are batch rows of slots slot_start + row (the decoder's layout); padding rows of a graph write position 0
of free slots, as the indexed write did. Off a GPU, or without Triton, the model keeps the torch operations.

A lone sequence's step on Hopper and later is launched as a programmatic dependent (engine/kernels/fused_ops.py): its
first LONE_ROW_PREFETCH positions are read while the q/k/v product runs, then it waits for that product; only the
position and q/k/v are read after the wait, and nothing is written before it.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl

    from engine.kernels.fused_ops import dependent_launch, let_next_launch, wait_for_previous
except ImportError:  # CPU-only installs
    triton = None

# (keys per block, warps) of a program, swept by `python benchmarks/gpu_one_row.py --only self-attention` (H200,
# large-v3 shapes, rows with positions spread below 60 / 104 / 441). With many programs (a batch of rows x heads)
# each one's prefix is short work and the step is bound by how many programs are resident: 16-key blocks on 4 warps
# were the fastest at 64 and 256 rows, a little ahead of 32-key blocks; 2 warps were faster at short contexts and
# slower at long ones, which prompts of earlier text reach. Below ~2 programs per SM of an H100/H200 (a few rows),
# each program streams its prefix nearly alone and is bound by how many of its loads are in flight: 32-key blocks
# on 8 warps, well ahead of 4 warps at 1 and 8 rows.
MANY_PROGRAMS_SETTINGS = (16, 4)
FEW_PROGRAMS = 256
FEW_PROGRAMS_SETTINGS = (32, 8)
# A lone sequence's step, launched as a programmatic dependent (engine/kernels/fused_ops.py): its first positions'
# keys and values (written by earlier steps, not by the kernel before it) are read while the q/k/v product still
# runs. 128 covers the prompt and ~100 tokens of a typical window; later positions stream in blocks as above.
LONE_ROW_PREFETCH = 128
# The batch-invariant backend's one setting for every batch (the many-programs one: its loss at few rows is what
# `benchmarks/gpu_throughput.py --batch-invariant --concurrency 1` measures with the rest).
INVARIANT_SETTINGS = MANY_PROGRAMS_SETTINGS


def cache_supported(cache_k: Tensor) -> bool:
    """A self cache on a GPU whose vectors have unit stride and a power-of-2 length (Whisper's heads: 64)."""
    d = cache_k.shape[-1]
    return triton is not None and cache_k.is_cuda and cache_k.stride(-1) == 1 and d & (d - 1) == 0


def applies(x: Tensor, cache_k: Tensor) -> bool:
    """For a step of one token per row (x: (batch, 1, n_state)) in the dtype of a supported cache."""
    return x.dim() == 3 and x.shape[1] == 1 and x.dtype == cache_k.dtype and cache_supported(cache_k)


def self_attention_step(
    qkv: Tensor, cache_k: Tensor, cache_v: Tensor, positions: Tensor, slot_start: int, pdl: bool = True,
    invariant: bool = False, rows_per_slot: int = 1,
) -> Tensor:
    """
    qkv : (batch, 1, 3 * n_state), this step's fused q/k/v projection (q, k, v each heads x head_dim)
    cache_k, cache_v : (slots, heads, n_text_ctx, head_dim), one layer's self cache
    positions : (batch, 1) int64, each row's position; the row attends over positions 0..p of its slot
    pdl : a lone row's kernel may be launched as a programmatic dependent (KernelOptions.pdl)
    invariant : one block shape and no prefetch whatever the batch, so a row's sums run in the same order
        (INVARIANT_SETTINGS; the batch-invariant backend, which asks for `pdl` only for a few rows)
    rows_per_slot : consecutive rows sharing a slot: a prompt's tokens as rows, each attending its own prefix
        (their K/V written before the call, as their earlier steps would have)
    returns the attention output (batch, 1, n_state), heads merged
    """
    b = qkv.shape[0]
    _, h, _, d = cache_k.shape
    assert qkv.shape == (b, 1, 3 * h * d) and qkv.is_contiguous()
    assert positions.shape == (b, 1) and cache_v.stride() == cache_k.stride()
    out = torch.empty(b, 1, h * d, dtype=qkv.dtype, device=qkv.device)
    if invariant:
        (block_n, warps), launch = INVARIANT_SETTINGS, dependent_launch(qkv.device, pdl)
    else:
        block_n, warps = MANY_PROGRAMS_SETTINGS if b * h >= FEW_PROGRAMS else FEW_PROGRAMS_SETTINGS
        launch = dependent_launch(qkv.device, pdl) if b == 1 else dict(PDL=False)  # more rows: cuBLAS makes q/k/v
    _write_and_attend[(b * h,)](
        qkv, cache_k, cache_v, positions, out, slot_start, rows_per_slot, positions.stride(0),
        *cache_k.stride()[:3], h, cache_k.shape[2], d**-0.5, HEAD_DIM=d, BLOCK_N=block_n,
        PREFETCH=LONE_ROW_PREFETCH if launch["PDL"] and not invariant else 0, num_warps=warps, **launch,
    )  # fmt: skip
    return out


if triton is not None:

    # slot_start changes with the batch's place in the cache (and s_row between the graphs' buffer and eager steps):
    # not specializing on them avoids a compile per value class while requests wait
    @triton.jit(do_not_specialize=["slot_start", "rows_per_slot", "s_row"])
    def _write_and_attend(
        QKV, KC, VC, POS, O, slot_start, rows_per_slot, s_row, s_slot, s_head, s_pos, H, N_CTX, sm_scale,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        let_next_launch(PDL)  # a lone row's next product reads its weight meanwhile (fused_ops.linear)
        row = tl.program_id(0) // H
        h = tl.program_id(0) % H
        dim = tl.arange(0, HEAD_DIM)
        slot = (slot_start + row // rows_per_slot).to(tl.int64)
        kc = KC + slot * s_slot + h * s_head
        vc = VC + slot * s_slot + h * s_head
        if PREFETCH > 0:  # the first positions, whatever the row's position (the ones at or past it are unused)
            first = tl.arange(0, PREFETCH)
            k0 = tl.load(kc + first[:, None] * s_pos + dim[None, :], mask=(first < N_CTX)[:, None], other=0.0)
            v0 = tl.load(vc + first[:, None] * s_pos + dim[None, :], mask=(first < N_CTX)[:, None], other=0.0)
        wait_for_previous(PDL)  # q/k/v and the position come from kernels before this one
        width = H * HEAD_DIM
        base = QKV + row * 3 * width + h * HEAD_DIM
        q = tl.load(base + dim).to(tl.float32) * sm_scale
        k_new = tl.load(base + width + dim)
        v_new = tl.load(base + 2 * width + dim)
        p = tl.load(POS + row * s_row)
        tl.store(kc + p * s_pos + dim, k_new)
        tl.store(vc + p * s_pos + dim, v_new)
        m0 = float("-inf")  # the prefetched positions' max, sum and weighted values, reduced once
        l0 = 0.0
        acc0 = tl.zeros([HEAD_DIM], tl.float32)
        if PREFETCH > 0:
            s0 = tl.where(first < p, tl.sum(k0.to(tl.float32) * q[None, :], axis=1), float("-inf"))
            m0 = tl.max(s0, axis=0)
            e0 = tl.where(first < p, tl.exp(s0 - m0), 0.0)
            l0 = tl.sum(e0, axis=0)
            acc0 = tl.sum(v0.to(tl.float32) * e0[:, None], axis=0)
        m = tl.full([BLOCK_N], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_N], tl.float32)
        acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        for n0 in range(PREFETCH, p, BLOCK_N):  # the (other) earlier positions, from the cache
            keys = n0 + tl.arange(0, BLOCK_N)
            valid = keys < p
            k = tl.load(kc + keys[:, None] * s_pos + dim[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            v = tl.load(vc + keys[:, None] * s_pos + dim[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m, s)
            alpha = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
            e = tl.where(valid, tl.exp(s - m_new), 0.0)
            l = l * alpha + e
            acc = acc * alpha[:, None] + v * e[:, None]
            m = m_new
        s_new = tl.sum(k_new.to(tl.float32) * q, axis=0)  # the row's own position, from registers
        m_max = tl.maximum(tl.maximum(tl.max(m, axis=0), m0), s_new)
        weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
        w0 = tl.where(m0 == float("-inf"), 0.0, tl.exp(m0 - m_max))
        w_new = tl.exp(s_new - m_max)
        total = tl.sum(l * weight, axis=0) + l0 * w0 + w_new
        out = tl.sum(acc * weight[:, None], axis=0) + acc0 * w0 + v_new.to(tl.float32) * w_new
        tl.store(O + row * width + h * HEAD_DIM + dim, (out / total).to(O.dtype.element_ty))

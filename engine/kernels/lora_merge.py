"""Weights with LoRA adapters merged in, W + B A, on a GPU in one pass over W (engine/model/lora.py Adapters).

An encoder pass runs each adapter's windows on their product's weight with the adapter merged in, made as the
product comes and dropped after it. torch's `baddbmm(W, B, A)` first copies W into its result and then reads and
rewrites it in the product (cuBLAS adds into an existing output): four of W's bytes moved for each of the merged
weight's, and two launches per adapter. Here a program reads its tile of W, adds its tile of B A summed in float32
over the rank, and writes the merged tile: two, in one launch for the pass's adapters (a launch costs the host
more than a merge costs the GPU: an encoder pass of 16 adapters' windows makes thousands). The sum is that of
baddbmm: B A's float32 sum over the rank, plus W, rounded once to the weight's type (the order of B A's terms
within the rank may differ, as between two cuBLAS kernels).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

BLOCK_M = 64
BLOCK_N = 128


def applies(weight: Tensor) -> bool:
    """Whether merge() serves `weight`: a CUDA half-precision weight (float32 ones keep baddbmm, whose products
    would otherwise need the kernel's float32 tensor-core path in TF32's place)."""
    return triton is not None and weight.is_cuda and weight.dtype in (torch.float16, torch.bfloat16)


def merge(weight: Tensor, b: Tensor, a: Tensor, indices: Tensor) -> Tensor:
    """A new (n, slices, out, in) tensor whose [i] holds weight + b[indices[i]] @ a[indices[i]], for `weight`
    (slices, out, in), the stacks `b` (adapters, slices, out, R) and `a` (adapters, slices, R, in), each contiguous in
    its last dimension, and `indices` (n,) on the device: several adapters' merges of one product in one launch (a
    launch costs the host more than a merge costs the GPU). R may be any size (the stacks' zero-padded rank)."""
    slices, out, inp = weight.shape
    n, rank = indices.shape[0], a.shape[2]
    merged = weight.new_empty(n, slices, out, inp)
    grid = (triton.cdiv(out, BLOCK_M), triton.cdiv(inp, BLOCK_N), n * slices)
    _merge[grid](
        weight, b, a, indices, merged, out, inp, rank, slices,
        weight.stride(0), weight.stride(1), b.stride(0), b.stride(1), b.stride(2), a.stride(0), a.stride(1),
        a.stride(2), merged.stride(1), merged.stride(2),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_R=max(16, triton.next_power_of_2(rank)), num_warps=4,
    )  # fmt: skip
    return merged


if triton is not None:

    @triton.jit
    def _merge(
        w_ptr, b_ptr, a_ptr, index_ptr, out_ptr, OUT, IN, R, SLICES,
        stride_ws, stride_wm, stride_ba, stride_bs, stride_bm, stride_aa, stride_as, stride_ar, stride_os, stride_om,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        merged = tl.program_id(2)
        part = merged % SLICES
        adapter = tl.load(index_ptr + merged // SLICES).to(tl.int64)
        r = tl.arange(0, BLOCK_R)
        m_ok, n_ok, r_ok = m < OUT, n < IN, r < R
        b_at = b_ptr + adapter * stride_ba + part * stride_bs + m[:, None] * stride_bm + r[None, :]
        a_at = a_ptr + adapter * stride_aa + part * stride_as + r[:, None] * stride_ar + n[None, :]
        b = tl.load(b_at, mask=m_ok[:, None] & r_ok[None, :], other=0.0)
        a = tl.load(a_at, mask=r_ok[:, None] & n_ok[None, :], other=0.0)
        delta = tl.dot(b, a)  # half-precision inputs, float32 sums: exact products, as cuBLAS's
        mask = m_ok[:, None] & n_ok[None, :]
        w = tl.load(w_ptr + part * stride_ws + m[:, None].to(tl.int64) * stride_wm + n[None, :], mask=mask, other=0.0)
        # merged tensors [merged // SLICES, part]: consecutive, each slice `stride_os` apart
        out_at = out_ptr + merged.to(tl.int64) * stride_os + m[:, None].to(tl.int64) * stride_om + n[None, :]
        tl.store(out_at, (w.to(tl.float32) + delta).to(w.dtype), mask=mask)

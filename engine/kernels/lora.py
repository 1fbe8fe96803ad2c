"""LoRA deltas of a decode step on a GPU, each row on its own adapter, in two Triton kernels per product.

y[row] += B[a] (A[a] x[row]) for the adapter a of each row (engine/model/lora.py), with A and B read from stacks
that hold every resident adapter: A (adapters, slices, R, in) and B (adapters, slices, out, R), a fused q/k/v being
three slices of one product. The rows are taken in segments of at most SEGMENT_ROWS rows of one adapter (the host
sorts a step's rows by adapter: segments()), so that an adapter's matrices are read once per segment, not per row,
and both small products run on tensor cores (the S-LoRA / Punica "segmented" product): one kernel sums A x over
parts of the inputs, a program per (segment, part), the next adds the parts in order and multiplies by B, a
program per (segment, output columns). Rows of the base model are in no segment and cost nothing. The segments
live in a device buffer the host fills before each step, so a captured graph serves any mix of adapters: its grid
covers the most segments its batch can have, and the programs past the step's segments return at once.

Each row's delta depends on that row and its adapter only (its segment's other rows are other rows of the same
tensor-core tile, which do not enter its sums), so the kernel keeps the batch-invariant backend invariant.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

try:
    import triton
    import triton.language as tl

    from engine.kernels.fused_ops import dependent_launch, let_next_launch, wait_for_previous
except ImportError:  # CPU-only installs
    triton = None

SEGMENT_ROWS = 16  # rows of one adapter per program: the smallest tensor-core tile
MAX_SPLITS = 8  # A x is summed over at most this many parts of the inputs, each by its own program
BLOCK_K = 64
BLOCK_N = 64
EXPAND_COLUMNS = 64  # outputs per program of the second kernel, in tiles of BLOCK_N: each program sums its parts once


def max_segments(rows: int, adapters: int) -> int:
    """The most segments `rows` rows can fall into when `adapters` adapters are resident."""
    return -(-rows // SEGMENT_ROWS) + min(adapters, rows)


def segments(row_adapters: np.ndarray, max_rows: int, n_segments: int) -> np.ndarray:
    """The kernel's int32 table for a step whose row i uses adapter row_adapters[i] (0: none), laid out for at most
    max_rows rows and n_segments segments whatever the step's rows (a graph reads it where it was captured): the
    rows with an adapter sorted by it (max_rows entries, the first ones used), then each segment's start in that
    order, its length and its adapter (n_segments entries each; unused ones have length 0)."""
    n = len(row_adapters)
    order = np.argsort(row_adapters, kind="stable").astype(np.int32)
    sorted_adapters = row_adapters[order]
    first = int(np.searchsorted(sorted_adapters, 1))  # rows without an adapter sort first and are skipped
    starts, lengths, owners = [], [], []
    at = first
    while at < n:
        adapter = sorted_adapters[at]
        end = int(np.searchsorted(sorted_adapters, adapter, side="right"))
        for s in range(at, end, SEGMENT_ROWS):
            starts.append(s)
            lengths.append(min(SEGMENT_ROWS, end - s))
            owners.append(adapter)
        at = end
    if len(starts) > n_segments:
        raise ValueError(f"{len(starts)} segments for a table of {n_segments}")
    table = np.zeros(max_rows + 3 * n_segments, dtype=np.int32)
    table[:n] = order
    k, at = len(starts), max_rows
    table[at : at + k] = starts
    table[at + n_segments : at + n_segments + k] = lengths
    table[at + 2 * n_segments : at + 2 * n_segments + k] = owners
    return table


def split_length(k: int, max_splits: int = MAX_SPLITS) -> int:
    """Inputs per part of A x: a multiple of BLOCK_K that makes at most `max_splits` parts."""
    per_split = -(-k // max_splits)
    return -(-per_split // BLOCK_K) * BLOCK_K


def block_rank(rank: int) -> int:
    """The kernels' tile over an adapter's rank: a power of two, at least a tensor-core tile's 16."""
    return max(16, 1 << (rank - 1).bit_length())


def partial_elements(n_segments: int, max_slices: int, rank: int) -> int:
    """Elements of the float32 buffer the parts of A x go through, for a table of `n_segments` segments."""
    return max_slices * n_segments * MAX_SPLITS * SEGMENT_ROWS * block_rank(rank)


def add_lora(
    y: Tensor, x: Tensor, table: Tensor, max_rows: int, n_segments: int, a: Tensor, b: Tensor, ranks: Tensor,
    capacity: int, partial: Tensor, max_splits: int = MAX_SPLITS, columns: int = EXPAND_COLUMNS, pdl: bool = False,
) -> None:  # fmt: skip
    """y (rows, 1, slices * out) += each row's adapter's B A x, in place, for x (rows, 1, in); `table` on the
    device as segments() lays it out (max_rows, n_segments); a (adapters, slices, R, in) and b (adapters, slices,
    out, R) the stacks, `ranks` (adapters,) int32 each adapter's rank (the columns of R read), `capacity` how many
    adapters may be resident (bounds the segments), `partial` a float32 buffer of partial_elements().

    Two kernels: the first sums A x over parts of the inputs, one program per (segment, part), so a few rows are
    not one program's long loop; the second adds the parts in order (the same sum whatever the batch) and
    multiplies by B, one program per (segment, `columns` outputs). `max_splits` (at most MAX_SPLITS) and `columns` (a
    multiple of BLOCK_N) change the programs, not a row's sums, as long as max_splits stays the same (the parts are
    summed in order). `pdl`: both launched as programmatic dependents where the device allows (the one-row products
    around them are: engine/kernels/fused_ops.py), each reading its segment's table and B before it waits."""
    splits = shrink(x, table, max_rows, n_segments, a, ranks, capacity, partial, max_splits, pdl)
    expand(y, table, max_rows, n_segments, b, ranks, capacity, partial, splits, columns, pdl)


def shrink(
    x: Tensor, table: Tensor, max_rows: int, n_segments: int, a: Tensor, ranks: Tensor, capacity: int,
    partial: Tensor, max_splits: int = MAX_SPLITS, pdl: bool = False,
) -> int:  # fmt: skip
    """add_lora's first kernel: the parts of A x into `partial`; returns how many parts (expand's `splits`)."""
    rows = x.shape[0]
    x2 = x.reshape(rows, x.shape[-1])
    if x2.stride(1) != 1:  # the kernel reads a row's inputs as one run
        x2 = x2.contiguous()
    k = x2.shape[1]
    length = split_length(k, max_splits)
    splits = triton.cdiv(k, length)
    _lora_shrink[(max_segments(rows, capacity), splits, a.shape[1])](
        x2, table, table[max_rows:], a, ranks, partial,
        k, n_segments, x2.stride(0), a.stride(0), a.stride(1), a.stride(2), length,
        SEGMENT=SEGMENT_ROWS, BLOCK_K=BLOCK_K, BLOCK_R=block_rank(a.shape[2]), SPLITS=MAX_SPLITS,
        **dependent_launch(x.device, pdl),
    )  # fmt: skip
    return splits


def expand(
    y: Tensor, table: Tensor, max_rows: int, n_segments: int, b: Tensor, ranks: Tensor, capacity: int,
    partial: Tensor, splits: int, columns: int = EXPAND_COLUMNS, pdl: bool = False,
) -> None:  # fmt: skip
    """add_lora's second kernel: y += B (the parts of A x summed in order)."""
    rows = y.shape[0]
    y2 = y.view(rows, y.shape[-1])
    out = b.shape[2]
    _lora_expand[(max_segments(rows, capacity), triton.cdiv(out, columns), b.shape[1])](
        y2, table, table[max_rows:], b, ranks, partial,
        out, n_segments, splits, y2.stride(0), b.stride(0), b.stride(1), b.stride(2),
        SEGMENT=SEGMENT_ROWS, BLOCK_N=BLOCK_N, COLUMNS=columns, BLOCK_R=block_rank(b.shape[3]), SPLITS=MAX_SPLITS,
        **dependent_launch(y.device, pdl),
    )  # fmt: skip


if triton is not None:

    @triton.jit
    def _segment(seg_ptr, order_ptr, rank_ptr, n_segments, seg, length, SEGMENT: tl.constexpr, BLOCK_R: tl.constexpr):
        """A segment's rows (their index in the segment, which are real, their row of x and y), its adapter and the
        ranks it reads (their index, which are the adapter's)."""
        start = tl.load(seg_ptr + seg)
        adapter = tl.load(seg_ptr + 2 * n_segments + seg)
        m = tl.arange(0, SEGMENT)
        m_ok = m < length
        rows = tl.load(order_ptr + start + m, mask=m_ok, other=0).to(tl.int64)
        r = tl.arange(0, BLOCK_R)
        rank = tl.where(length > 0, tl.load(rank_ptr + adapter), 0)  # none for a program past the segments
        return m, m_ok, rows, adapter, r, r < rank

    @triton.jit
    def _lora_shrink(
        x_ptr, order_ptr, seg_ptr, a_ptr, rank_ptr, part_ptr,
        K, n_segments, stride_x, stride_aa, stride_as, stride_ar, LENGTH,
        SEGMENT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, SPLITS: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        let_next_launch(PDL)
        seg = tl.program_id(0)
        split = tl.program_id(1)
        part = tl.program_id(2)
        length = tl.load(seg_ptr + n_segments + seg)  # the table is written before the step, not by a kernel
        # every program waits, those past the step's segments too: the kernel ends after the one before it
        wait_for_previous(PDL)
        if length == 0:  # past the step's segments
            return
        m, m_ok, rows, adapter, r, r_ok = _segment(
            seg_ptr, order_ptr, rank_ptr, n_segments, seg, length, SEGMENT, BLOCK_R
        )
        a_base = a_ptr + adapter.to(tl.int64) * stride_aa + part * stride_as
        t = tl.zeros((SEGMENT, BLOCK_R), dtype=tl.float32)
        for k0 in range(split * LENGTH, tl.minimum(split * LENGTH + LENGTH, K), BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < K
            xs = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            a = tl.load(a_base + r[None, :] * stride_ar + k[:, None], mask=r_ok[None, :] & k_ok[:, None], other=0.0)
            t += tl.dot(xs, a, input_precision="ieee")  # float32 inputs: no TF32 rounding
        # parts laid out (slice, segment, split, row, rank)
        out = part_ptr + (((part * n_segments + seg) * SPLITS + split) * SEGMENT + m[:, None]) * BLOCK_R + r[None, :]
        tl.store(out, t)

    @triton.jit
    def _lora_expand(
        y_ptr, order_ptr, seg_ptr, b_ptr, rank_ptr, part_ptr,
        N, n_segments, n_splits, stride_y, stride_ba, stride_bs, stride_bn,
        SEGMENT: tl.constexpr, BLOCK_N: tl.constexpr, COLUMNS: tl.constexpr, BLOCK_R: tl.constexpr,
        SPLITS: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        let_next_launch(PDL)
        seg = tl.program_id(0)
        tile = tl.program_id(1)
        part = tl.program_id(2)
        length = tl.load(seg_ptr + n_segments + seg)
        m, m_ok, rows, adapter, r, r_ok = _segment(
            seg_ptr, order_ptr, rank_ptr, n_segments, seg, length, SEGMENT, BLOCK_R
        )
        b_base = b_ptr + adapter.to(tl.int64) * stride_ba + part * stride_bs
        # the first tile of B does not depend on the kernels before: read while they finish
        n = tile * COLUMNS + tl.arange(0, BLOCK_N)
        b = tl.load(b_base + n[None, :] * stride_bn + r[:, None], mask=r_ok[:, None] & (n < N)[None, :], other=0.0)
        wait_for_previous(PDL)  # every program, as in _lora_shrink
        if length == 0:  # past the step's segments
            return
        parts = part_ptr + ((part * n_segments + seg) * SPLITS * SEGMENT + m[:, None]) * BLOCK_R + r[None, :]
        t = tl.zeros((SEGMENT, BLOCK_R), dtype=tl.float32)
        for split in range(n_splits):  # in order: a row's sum is the same whatever else the step holds
            t += tl.load(parts + split * SEGMENT * BLOCK_R)
        t = t.to(b_ptr.dtype.element_ty)  # A x rounded as a stored product would be
        for n0 in tl.static_range(0, COLUMNS, BLOCK_N):
            n = tile * COLUMNS + n0 + tl.arange(0, BLOCK_N)
            n_ok = n < N
            if n0 > 0:
                b = tl.load(b_base + n[None, :] * stride_bn + r[:, None], mask=r_ok[:, None] & n_ok[None, :], other=0.0)
            delta = tl.dot(t, b, input_precision="ieee")
            mask = m_ok[:, None] & n_ok[None, :]
            y_at = y_ptr + rows[:, None] * stride_y + part * N + n[None, :]
            y = tl.load(y_at, mask=mask, other=0.0)
            tl.store(y_at, (y.to(tl.float32) + delta).to(y.dtype), mask=mask)

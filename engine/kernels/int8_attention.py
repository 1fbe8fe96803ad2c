"""Cross-attention over an int8 cache: per-vector quantization and a Triton kernel that reads the int8 bytes.

A decode step at high concurrency is bound by reading every running sequence's cross-attention keys and values
(large-v3: 246 MB per sequence per step in float16; at 256 rows on an H200, most of the step's GPU time).
Stored as int8 with one bfloat16 scale per (position, head) vector, the same cache is ~52% of the bytes. Per-vector
absmax scaling keeps the transcripts: tiny.en gave the same tokens on every English clip of the evaluation set with
it, where a float8 (e4m3) cache with the same scaling changed some (tests/integration/test_int8_cross_cache.py
checks a set of clips on every run).

The kernels are flash-decoding: each (batch, head, query) row streams its keys and values in blocks with an
online softmax; when there are few rows, the keys are split over several programs and a second kernel combines
them. Scales fold into the arithmetic: score_j = (q . k_j) * sk_j and out = sum_j (p_j * sv_j) v_j, so the int8
values are never expanded in memory. Two kernels compute this: a CUDA C++ one (csrc/int8_attention.cu, compiled
at first use with NVRTC through torch), which computes q . k in integer dp4a instructions instead of converting
every key byte to float, and the Triton one below, used where NVRTC is unavailable or the layout does not suit the
CUDA kernel's 16-byte loads. At 256 rows of large-v3 shapes the CUDA kernel takes a little over half of cuDNN's
time on the float16 cache and the Triton one about two thirds (H200, `python benchmarks/int8_cross_attention.py`,
GPU time in a CUDA graph). Without a GPU (or without Triton) the same function dequantizes and calls SDPA:
correct, not fast, and the reference the GPU tests compare both kernels against.

A lone sequence's step (one query row per head) on Hopper and later takes a third, Triton kernel launched as a
programmatic dependent (engine/kernels/fused_ops.py): the slot's keys and values never change while it decodes, so each
program reads its split's whole share of them into registers while the kernel that makes the query still runs,
and the split combiner is launched the same way. In a chain of lone steps (a CUDA graph of 32 layers of the
cross-attention alone) this path takes less time per layer than the CUDA kernel; with the self-attention's counterpart (engine/kernels/decode_attention.py) it shortens a lone window
(`benchmarks/gpu_throughput.py --concurrency 1`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kernels.options import DEFAULT_KERNELS, KernelOptions

try:
    import triton
    import triton.language as tl

    from engine.kernels.fused_ops import dependent_launch, let_next_launch, pdl_applies, wait_for_previous
except ImportError:  # CPU-only installs: the reference path below is used
    triton = None

QMAX = 127.0
SCALE_DTYPE = torch.bfloat16
BLOCK_N = 32  # keys per block (H200: 32 and 64 with 4 warps were the fastest of 32-128 x 2-4 warps)
NUM_WARPS = 4
NUM_STAGES = 3  # Triton's default software pipelining depth of the key loop
MAX_SPLITS = 16
QUANTIZE_ROWS = 64  # vectors per program of the quantize kernel
TARGET_PROGRAMS = 512  # ~4 per SM of an H100/H200: enough loads in flight to stream at full bandwidth
# The batch-invariant cross-attention's key splits, the same for every batch (fixed_split_attention): more splits
# serve a lone row (more programs stream its keys), fewer serve many rows (the default does not split from ~32
# rows, and each split's partial results cost a write, a read and a combining kernel). H200, a large-v3 step
# against the default kernels at 1 / 64 / 256 / 512 rows: 8 splits 0.55 / 0.92 / 0.80 / 0.77, 4 splits 0.52 /
# 0.97 / 0.88 / 0.85, 2 splits 0.47 / 0.98 / 0.91 / 0.88 (workbench: docs/benchmarks/2026-12-04-batch-invariance.md;
# the whole engine: `benchmarks/gpu_throughput.py --batch-invariant both`).
INVARIANT_SPLITS = 4
LONE_ROW_MAX_KEYS = 256  # keys per split the lone-row kernel holds in registers (Whisper's 1,500 / 16 = 94, as 128)

log = logging.getLogger(__name__)

CUDA_SOURCE = Path(__file__).with_name("csrc") / "int8_attention.cu"
# H200, 256 rows (benchmarks/int8_cross_attention.py --sweep-cuda): 128 threads, 4 threads per key, 2 keys per
# group loaded ahead, registers capped for 8 blocks per SM, loads that skip L1 (read once): the sweep's fastest,
# close to the card's memory bandwidth.
CUDA_SETTINGS = {"THREADS": 128, "TPK": 4, "UNROLL": 2, "MIN_BLOCKS": 8, "LOAD_HINT": 1, "K_DP4A": 1, "V_PRMT": 1}
CUDA_TARGET_BLOCKS = 640  # split keys until this many blocks (H200, 1-256 rows: 5 per SM was the fastest)
_cuda_kernels: dict[tuple[int, torch.dtype], object] = {}


def _kernels_apply(x: Tensor) -> bool:
    """The Triton kernels run on CUDA tensors whose vectors have a power-of-2 length (Whisper's: 64)."""
    d = x.shape[-1]
    return triton is not None and x.is_cuda and d & (d - 1) == 0


def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (..., dim) -> int8 values and a bfloat16 scale per vector, x ~= values * scale[..., None].

    bfloat16 keeps float32's range (float16 scales of small vectors would be subnormal and imprecise); the values
    are rounded against the stored scale, so its 8-bit mantissa costs no accuracy beyond the int8 step."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / QMAX).to(SCALE_DTYPE)
    values = torch.round(x / scale.float()).clamp_(-QMAX, QMAX).to(torch.int8)
    return values, scale.squeeze(-1)


def quantize_into(x: Tensor, values: Tensor, scale: Tensor) -> None:
    """quantize(x) written into cache views: x (batch, heads, n, dim) -> values (same shape, int8), scale (batch,
    heads, n). On a GPU one kernel reads x once (the separate ops above make ~8 passes over it, 64 times per
    admitted batch for large-v3's K and V)."""
    if not _kernels_apply(x):
        values[...], scale[...] = quantize(x)
        return
    b, h, n, d = x.shape
    assert x.stride(-1) == values.stride(-1) == scale.stride(-1) == 1
    grid = (b * h, triton.cdiv(n, QUANTIZE_ROWS))
    _quantize_rows[grid](
        x, values, scale, *x.stride()[:3], *values.stride()[:3], *scale.stride()[:3], h, n,
        HEAD_DIM=d, BLOCK_R=QUANTIZE_ROWS, num_warps=4,
    )  # fmt: skip


def dequantize(values: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    return (values.to(torch.float32) * scale.to(torch.float32)[..., None]).to(dtype)


def int8_attention(
    q: Tensor, k: Tensor, k_scale: Tensor, v: Tensor, v_scale: Tensor, kernels: KernelOptions = DEFAULT_KERNELS,
    index: Tensor | None = None, order: Tensor | None = None,
) -> Tensor:
    """softmax(q k^T / sqrt(d)) v with k, v stored as int8 and per-vector scales.

    q (batch, heads, t, dim); k, v (batch, heads, n, dim) int8; k_scale, v_scale (batch, heads, n).
    Views with a unit last stride (slices of the cache) are read in place. `kernels`: which kernel runs
    (int8_attention: the NVRTC kernel where it compiles and the layout suits it, else Triton; int8_lone_row;
    pdl). `index` (batch,) int32: q's row b reads k, v (slots, heads, n, dim) at slot index[b]; `order`: a
    permutation of the rows to walk them in (see indexed_attention)."""
    if not _kernels_apply(q):
        if index is not None:
            k, k_scale, v, v_scale = (x.index_select(0, index.long()) for x in (k, k_scale, v, v_scale))
        return F.scaled_dot_product_attention(q, dequantize(k, k_scale, q.dtype), dequantize(v, v_scale, q.dtype))
    pdl = kernels.pdl
    if kernels.int8_lone_row and _lone_row_applies(q, k, pdl):
        return _lone_row_attention(q, k, k_scale, v, v_scale, pdl, index)
    use_cuda = kernels.int8_attention == "cuda" and _cuda_layout_fits(q, k, k_scale, v, v_scale)
    kernel = _cuda_kernel(q) if use_cuda else None
    if kernel is not None:
        return _cuda_attention(kernel, q, k, k_scale, v, v_scale, pdl, index=index, order=order)
    return _triton_attention(q, k, k_scale, v, v_scale, pdl, index=index, order=order)


def indexed_attention(
    q: Tensor, k: Tensor, k_scale: Tensor | None, v: Tensor, v_scale: Tensor | None, index: Tensor,
    order: Tensor | None, kernels: KernelOptions = DEFAULT_KERNELS,
) -> Tensor:
    """Cross-attention of q's row b (batch, heads, t, dim) against slot index[b] of the cache k, v (slots, heads,
    n, dim): int8 with scales, or the model's dtype (k_scale None). Rows of one beam search read one slot; `order`
    (a permutation of at least q's rows, or None) is the order in which the kernels take the rows, those reading
    one slot side by side, so their programs run together and the slot's bytes come from the L2 cache for all but
    the first. Without the GPU kernels the rows' slots are gathered (a copy: correct, not fast)."""
    if k_scale is not None:
        return int8_attention(q, k, k_scale, v, v_scale, kernels, index, order)
    if not _kernels_apply(q):
        idx = index.long()
        return F.scaled_dot_product_attention(q, k.index_select(0, idx), v.index_select(0, idx))
    return _triton_attention(q, k, None, v, None, kernels.pdl, index=index, order=order)


def _splits(rows: int, target: int, max_splits: float = MAX_SPLITS) -> int:
    """Key splits per row: doubled while rows x splits stay below `target` programs and below max_splits."""
    splits = 1
    while rows * splits < target and splits < max_splits:
        splits *= 2
    return splits


def _triton_splits(rows: int, n: int) -> int:
    return _splits(rows, TARGET_PROGRAMS, min(MAX_SPLITS, n / (2 * BLOCK_N)))  # each split 2+ blocks of keys


def _cuda_splits(rows: int) -> int:
    return _splits(rows, CUDA_TARGET_BLOCKS)


def _cuda_kernel(q: Tensor):
    """The compiled CUDA kernel for q's device and dtype, or None where it cannot be built (no NVRTC, a torch
    without torch.cuda._compile_kernel, a non-NVIDIA GPU): Triton's kernel then runs, after one warning."""
    key = (q.device.index, q.dtype)
    if key not in _cuda_kernels:
        _cuda_kernels[key] = None
        try:
            settings = {**CUDA_SETTINGS, "OUT_BF16": int(q.dtype == torch.bfloat16)}
            with torch.cuda.device(q.device):
                _cuda_kernels[key] = torch.cuda._compile_kernel(
                    CUDA_SOURCE.read_text(), "int8_attention", nvcc_options=[f"-D{k}={v}" for k, v in settings.items()]
                )
        except Exception as e:  # noqa: BLE001 - any failure to build means the Triton kernel serves instead
            log.warning("int8 cross-attention: the CUDA kernel did not build (%s); using the Triton kernel", e)
    return _cuda_kernels[key]


def _cuda_layout_fits(q: Tensor, k: Tensor, k_scale: Tensor, v: Tensor, v_scale: Tensor) -> bool:
    """The CUDA kernel reads 64-value vectors with 16-byte loads and takes 32-bit strides."""
    aligned = all(x.data_ptr() % 16 == 0 and all(st % 16 == 0 for st in x.stride()[:3]) for x in (k, v))
    small = all(st < 2**31 for x in (q, k, k_scale, v, v_scale) for st in x.stride())
    return q.shape[-1] == 64 and q.dtype in (torch.float16, torch.bfloat16) and aligned and small


def _cuda_attention(
    kernel, q: Tensor, k: Tensor, k_scale: Tensor, v: Tensor, v_scale: Tensor, pdl: bool, splits: int | None = None,
    index: Tensor | None = None, order: Tensor | None = None,
) -> Tensor:
    b, h, t, d = q.shape
    n = k.shape[2]
    assert k_scale.stride(-1) == v_scale.stride(-1) == 1 and q.stride(-1) == 1
    out = torch.empty_like(q)
    rows = b * h * t
    splits = _cuda_splits(rows) if splits is None else splits
    keys_per_split = -(-n // splits)
    m, lse, acc = _split_buffers(rows, splits, d, out)
    kernel(
        grid=(rows, splits, 1), block=(CUDA_SETTINGS["THREADS"], 1, 1),
        args=[
            q, k, k_scale, v, v_scale, out, m, lse, acc,
            *q.stride()[:3], *k.stride()[:3], *k_scale.stride()[:2], *v.stride()[:3], *v_scale.stride()[:2],
            *out.stride()[:3], h, t, n, keys_per_split, d**-0.5, splits,
            q if index is None else index, q if order is None else order, int(index is not None), int(order is not None),
        ],
    )  # fmt: skip
    return _combined(m, lse, acc, out, splits, pdl)


def _lone_row_applies(q: Tensor, k: Tensor, pdl: bool) -> bool:
    """A lone sequence's decode step (one query row per head) on a device with dependent launches, each split's
    keys few enough to hold in registers."""
    b, _, t, _ = q.shape
    return b * t == 1 and pdl_applies(q.device, pdl) and -(-k.shape[2] // MAX_SPLITS) <= LONE_ROW_MAX_KEYS


def _lone_row_attention(
    q: Tensor, k: Tensor, k_scale: Tensor, v: Tensor, v_scale: Tensor, pdl: bool, index: Tensor | None = None
) -> Tensor:
    """One query row per head, its keys split MAX_SPLITS ways; each program reads its split's keys and values
    before waiting for the kernel that makes the query (see _prefetched_split). `index` (1,): the slot of k, v
    to read (else slot 0)."""
    _, h, _, d = q.shape
    n = k.shape[2]
    assert k.stride(-1) == v.stride(-1) == k_scale.stride(-1) == v_scale.stride(-1) == 1 and q.stride(-1) == 1
    out = torch.empty_like(q)
    keys_per_split = -(-n // MAX_SPLITS)
    m, lse, acc = _split_buffers(h, MAX_SPLITS, d, out)
    _prefetched_split[(h, MAX_SPLITS)](
        q, k, k_scale, v, v_scale, m, lse, acc, q if index is None else index, q.stride(1),
        k.stride(0), k.stride(1), k.stride(2), k_scale.stride(0), k_scale.stride(1),
        v.stride(0), v.stride(1), v.stride(2), v_scale.stride(0), v_scale.stride(1), n, keys_per_split, d**-0.5,
        HEAD_DIM=d, KEYS=triton.next_power_of_2(keys_per_split), NUM_SPLITS=MAX_SPLITS, INDEXED=index is not None,
        num_warps=4, **dependent_launch(q.device, pdl),
    )  # fmt: skip
    return _combined(m, lse, acc, out, MAX_SPLITS, pdl)


def _split_buffers(rows: int, splits: int, d: int, out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each split's running max, sum and unnormalized output, for the combining kernel (unused with one split)."""
    if splits == 1:
        return out, out, out
    m = torch.empty(rows * splits, dtype=torch.float32, device=out.device)
    return m, torch.empty_like(m), torch.empty(rows * splits, d, dtype=torch.float32, device=out.device)


def _combined(m: Tensor, lse: Tensor, acc: Tensor, out: Tensor, splits: int, pdl: bool) -> Tensor:
    """out, with the splits' partial results (_split_buffers) merged into it where there were several."""
    if splits > 1:
        b, h, t, d = out.shape
        _combine_splits[(b * h * t,)](
            m, lse, acc, out, *out.stride()[:3], h, t, HEAD_DIM=d, NUM_SPLITS=splits, CONTIGUOUS=out.is_contiguous(),
            num_warps=1, **dependent_launch(out.device, pdl),
        )  # fmt: skip
    return out


def fixed_split_attention(
    q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor | None, v_scale: Tensor | None, kernels: KernelOptions,
    index: Tensor | None = None, order: Tensor | None = None, pdl: bool = False,
) -> Tensor:
    """Cross-attention whose sums for a (row, head, query) run in one order whatever the batch: the keys split
    INVARIANT_SPLITS ways for every batch size (the kernels above choose the split from the row count), each split
    by the same kernel, the splits combined in order. The int8 cache through the CUDA kernel where it builds (else
    Triton's); a float16 or bfloat16 cache through the Triton kernel without scales. `index`, `order`: as
    indexed_attention's (they pick the bytes and the programs' order, not the arithmetic). The batch-invariant
    backend's cross-attention (engine/backends/gpu_invariant.py). `pdl`: the splits' combiner launched as a
    programmatic dependent where the device allows (a few rows: it changes when it starts, not what it sums)."""
    if k_scale is None:
        return _triton_attention(q, k, None, v, None, pdl, INVARIANT_SPLITS, index, order)
    use_cuda = kernels.int8_attention == "cuda" and _cuda_layout_fits(q, k, k_scale, v, v_scale)
    kernel = _cuda_kernel(q) if use_cuda else None
    if kernel is not None:
        return _cuda_attention(kernel, q, k, k_scale, v, v_scale, pdl, INVARIANT_SPLITS, index, order)
    return _triton_attention(q, k, k_scale, v, v_scale, pdl, INVARIANT_SPLITS, index, order)


def _triton_attention(
    q: Tensor, k: Tensor, k_scale: Tensor | None, v: Tensor, v_scale: Tensor | None, pdl: bool,
    splits: int | None = None, index: Tensor | None = None, order: Tensor | None = None,
) -> Tensor:
    """k_scale/v_scale None: a float16 or bfloat16 cache (the same kernel without the scales)."""
    b, h, t, d = q.shape
    n = k.shape[2]
    scaled = k_scale is not None
    if scaled:
        assert k_scale.stride(-1) == v_scale.stride(-1) == 1
        scale_strides = (*k_scale.stride()[:2], *v_scale.stride()[:2])
    else:
        k_scale = v_scale = k  # unread (SCALED=False)
        scale_strides = (0, 0, 0, 0)
    assert k.stride(-1) == v.stride(-1) == 1 and q.stride(-1) == 1
    out = torch.empty_like(q)
    rows = b * h * t
    splits = _triton_splits(rows, n) if splits is None else splits
    keys_per_split = -(-n // (splits * BLOCK_N)) * BLOCK_N
    m, lse, acc = _split_buffers(rows, splits, d, out)
    _attention_blocks[(rows, splits)](
        q, k, k_scale, v, v_scale, out, m, lse, acc, q if index is None else index, q if order is None else order,
        *q.stride()[:3], *k.stride()[:3], *scale_strides[:2], *v.stride()[:3], *scale_strides[2:],
        *out.stride()[:3],
        h, t, n, keys_per_split, d**-0.5,
        HEAD_DIM=d, BLOCK_N=BLOCK_N, NUM_SPLITS=splits, SCALED=scaled, INDEXED=index is not None,
        ORDERED=order is not None, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return _combined(m, lse, acc, out, splits, pdl)


if triton is not None:

    # Arguments that change with the batch or the prompt width are not specialized on (Triton otherwise compiles
    # a variant per value class, e.g. divisible by 16 or equal to 1): a prefill of a new width would compile,
    # ~1 s, while requests wait. Left: NUM_SPLITS, whose variants the decoder graphs' capture compiles.
    @triton.jit(do_not_specialize=["sqb", "sqh", "sqt", "sob", "soh", "sot", "T", "keys_per_split"])
    def _attention_blocks(
        Q, K, KS, V, VS, O, M, L, ACC, SLOT, ORDER,
        sqb, sqh, sqt, skb, skh, skn, sksb, sksh, svb, svh, svn, svsb, svsh, sob, soh, sot,
        H, T, N, keys_per_split, sm_scale,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, SCALED: tl.constexpr,
        INDEXED: tl.constexpr, ORDERED: tl.constexpr,
    ):  # fmt: skip
        # SCALED: an int8 cache with a scale per vector; else keys and values in the model's dtype, KS/VS unread.
        # INDEXED: batch row b reads cache slot SLOT[b] (else b); ORDERED: programs take the rows in ORDER's order.
        row = tl.program_id(0)
        split = tl.program_id(1)
        if ORDERED:
            row = (tl.load(ORDER + row // (T * H)) * H + (row // T) % H) * T + row % T
        t = row % T
        h = (row // T) % H
        b = row // (T * H)
        q_row = b
        if INDEXED:
            b = tl.load(SLOT + b).to(tl.int64)
        dim = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + q_row * sqb + h * sqh + t * sqt + dim).to(tl.float32) * sm_scale
        start = split * keys_per_split
        end = tl.minimum(start + keys_per_split, N)
        # Each of the BLOCK_N lanes keeps its own running max, sum and weighted values: the block loop then
        # needs no reduction across threads except the dot products; lanes are merged once at the end.
        # (Reducing every block, as a textbook online softmax does, ran at ~1.8 TB/s on an H200; this at ~3.4.)
        m = tl.full([BLOCK_N], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_N], tl.float32)
        acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            keys = n0 + tl.arange(0, BLOCK_N)
            valid = keys < end
            k = tl.load(K + b * skb + h * skh + keys[:, None] * skn + dim[None, :], mask=valid[:, None], other=0)
            v = tl.load(V + b * svb + h * svh + keys[:, None] * svn + dim[None, :], mask=valid[:, None], other=0)
            s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
            if SCALED:
                s = s * tl.load(KS + b * sksb + h * sksh + keys, mask=valid, other=0).to(tl.float32)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m, s)
            alpha = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
            p = tl.where(valid, tl.exp(s - m_new), 0.0)
            l = l * alpha + p
            if SCALED:
                p_v = p * tl.load(VS + b * svsb + h * svsh + keys, mask=valid, other=0).to(tl.float32)
            else:
                p_v = p
            acc = acc * alpha[:, None] + v.to(tl.float32) * p_v[:, None]
            m = m_new
        m_max = tl.max(m, axis=0)
        weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
        l_sum = tl.sum(l * weight, axis=0)
        out = tl.sum(acc * weight[:, None], axis=0)
        if NUM_SPLITS == 1:
            tl.store(O + q_row * sob + h * soh + t * sot + dim, (out / l_sum).to(O.dtype.element_ty))
        else:
            part = row * NUM_SPLITS + split
            tl.store(M + part, m_max)
            tl.store(L + part, l_sum)
            tl.store(ACC + part * HEAD_DIM + dim, out)

    @triton.jit(do_not_specialize=["sqh"])
    def _prefetched_split(
        Q, K, KS, V, VS, M, L, ACC, SLOT, sqh, skb, skh, skn, sksb, sksh, svb, svh, svn, svsb, svsh, N,
        keys_per_split, sm_scale,
        HEAD_DIM: tl.constexpr, KEYS: tl.constexpr, NUM_SPLITS: tl.constexpr, INDEXED: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        # One (head, split) of a lone query row. The slot's keys and values were written by the prompt's fill and
        # are never written during decoding, so with PDL they are read (~12 KB per program) while the kernel
        # that makes the query still runs; the split's scores then need one reduction, not a block loop.
        let_next_launch(PDL)
        h = tl.program_id(0)
        split = tl.program_id(1)
        idx = tl.arange(0, KEYS)
        keys = split * keys_per_split + idx
        valid = (idx < keys_per_split) & (keys < N)
        dim = tl.arange(0, HEAD_DIM)
        slot = 0
        if INDEXED:  # written before the graph launched: readable before the wait
            slot = tl.load(SLOT).to(tl.int64)
        K += slot * skb
        KS += slot * sksb
        V += slot * svb
        VS += slot * svsb
        k = tl.load(K + h * skh + keys[:, None] * skn + dim[None, :], mask=valid[:, None], other=0)
        ks = tl.load(KS + h * sksh + keys, mask=valid, other=0).to(tl.float32)
        v = tl.load(V + h * svh + keys[:, None] * svn + dim[None, :], mask=valid[:, None], other=0)
        vs = tl.load(VS + h * svsh + keys, mask=valid, other=0).to(tl.float32)
        wait_for_previous(PDL)
        q = tl.load(Q + h * sqh + dim).to(tl.float32) * sm_scale
        s = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], axis=1) * ks, float("-inf"))
        m = tl.max(s, axis=0)
        p = tl.where(valid, tl.exp(s - m), 0.0)
        part = h * NUM_SPLITS + split
        tl.store(M + part, m)
        tl.store(L + part, tl.sum(p, axis=0))
        tl.store(ACC + part * HEAD_DIM + dim, tl.sum(v.to(tl.float32) * (p * vs)[:, None], axis=0))

    @triton.jit(do_not_specialize=["sob", "soh", "sot", "T"])
    def _combine_splits(
        M, L, ACC, O, sob, soh, sot, H, T,
        HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, CONTIGUOUS: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        let_next_launch(PDL)  # a lone row's next product reads its weight meanwhile (fused_ops.linear)
        wait_for_previous(PDL)  # launched as a dependent: it starts while the splits run, then waits for them
        row = tl.program_id(0)
        if CONTIGUOUS:  # rows in order, HEAD_DIM apart: no index arithmetic after the wait, aligned stores
            # (shorter than the strided form in a lone row's chain of layers)
            o = O + row * HEAD_DIM
        else:
            t = row % T
            h = (row // T) % H
            b = row // (T * H)
            o = O + b * sob + h * soh + t * sot
        parts = row * NUM_SPLITS + tl.arange(0, NUM_SPLITS)
        dim = tl.arange(0, HEAD_DIM)
        m = tl.load(M + parts)
        weight = tl.exp(m - tl.max(m, axis=0))
        total = tl.sum(tl.load(L + parts) * weight, axis=0)
        acc = tl.load(ACC + parts[:, None] * HEAD_DIM + dim[None, :])
        out = tl.sum(acc * weight[:, None], axis=0) / total
        tl.store(o + dim, out.to(O.dtype.element_ty))

    @triton.jit
    def _quantize_rows(
        X, OUT, SCALE, sxb, sxh, sxn, sob, soh, son, ssb, ssh, ssn, H, N,
        HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0) // H
        h = tl.program_id(0) % H
        rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        valid = rows < N
        dim = tl.arange(0, HEAD_DIM)
        x = tl.load(X + b * sxb + h * sxh + rows[:, None] * sxn + dim[None, :], mask=valid[:, None], other=0)
        x = x.to(tl.float32)
        scale = (tl.maximum(tl.max(tl.abs(x), axis=1), 1e-30) / 127.0).to(SCALE.dtype.element_ty)
        # as torch.round(x / scale): an IEEE-rounded division (Triton's `/` is approximate), ties to even
        y = tl.math.div_rn(x, tl.broadcast_to(scale.to(tl.float32)[:, None], [BLOCK_R, HEAD_DIM]))
        q = tl.floor(y + 0.5)
        q = tl.where((q - y == 0.5) & (q - 2.0 * tl.floor(q * 0.5) != 0.0), q - 1.0, q)
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        tl.store(OUT + b * sob + h * soh + rows[:, None] * son + dim[None, :], q.to(tl.int8), mask=valid[:, None])
        tl.store(SCALE + b * ssb + h * ssh + rows * ssn, scale, mask=valid)

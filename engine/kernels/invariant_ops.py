"""Batch-invariant GPU kernels: each output row is computed by the same arithmetic in the same order whatever the
number of rows, which rows they are, and what the other rows hold.

cuBLAS picks a kernel per problem shape: at 1 row a matrix-vector product, at 8 rows a split-K kernel whose
partial sums are added in another order, at 256 rows a large tile. Each sums a row's K products in a different
order, so a request's float16 logits change in their last bits with the number of other requests in the step,
and a greedy decode that meets a near-tie follows another path from there (BENCHMARKS.md, batch dependence).

`linear` here is one Triton kernel that never splits K across programs: a program computes a BLOCK_M x BLOCK_N
tile of the output, walking K from 0 up in chunks of CHUNK_K with the tensor cores accumulating into float32, 16 of
K per instruction, in order; chunk c goes into accumulator c % CHAINS, and the accumulators are added in one order
at the end. An output element is therefore the same sequence of operations on its row of x and its column of the
weight whatever the other rows: whether it is the only row (the others of its tile are masked zeros) or one of
512, whatever tile it falls in, and whatever the tile's shape. That last point is what lets the tile follow the row
count (`tile`: a lone row's product spreads over many narrow programs, 256 rows over fewer, larger ones): the
instruction's result for an element does not depend on the tile around it, measured bitwise on an H200 for every
tile here, fp16 and bf16, and asserted by tests/gpu/test_batch_invariance.py (rows alone against among others,
across the tiles' row counts). Up to 16 rows in half precision run the same sums in another kernel,
invariant_few_rows.py, which copies its weight into shared memory before it waits for the kernel before it (a
lone window's step is a chain of such waits). What would change a result is summing K in another order for
another row count (cuBLAS's split-K: partial sums added in another order), which nothing here does. Bias, GELU
(tanh form, as the default path's cuBLASLt epilogue) and the rounding of a float32 output to the input's precision
(as a half-precision cuBLAS output is rounded) are applied per element after the sum.

The model's passes over whole windows (the encoder, the cross-attention K/V) always have thousands of rows:
`linear(..., wide=True)` runs them with a large tile (WIDE), on Hopper with its tiles loaded by the tensor memory
accelerator (a kernel of its own, chosen by the GPU and dtype alone, so a call site always takes the same one;
persistent: one program per multiprocessor takes every so-many-th output tile, which moves no sum).
The encoder's convolutions are products too (`conv1d`: each output position's inputs gathered into a row), and
its attention computes each (window, head, query block) alone (`attention`).
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kernels import encoder_attention, invariant_few_rows

try:
    import triton
    import triton.language as tl

    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # an older Triton: the wide products load their tiles through pointers
        TensorDescriptor = None
    if "flatten" not in inspect.signature(tl.range).parameters:  # the persistent kernel's loop needs it
        TensorDescriptor = None

    from engine.kernels.fused_ops import dependent_launch, gelu_tanh, let_next_launch, wait_for_previous
except ImportError:  # CPU-only installs: no GPU, nothing to make invariant (a CPU's products already are)
    triton = None

# (rows up to, BLOCK_M, BLOCK_N, warps, stages) for a decode step's products: K never split (see above)
TILES = (
    (16, 16, 32, 4, 4),  # a lone row and small batches: many narrow programs stream the weight
    (None, 64, 64, 4, 3),  # more rows: Hopper's warpgroup MMA (m64)
)
# Every decode tile walks K in the same chunks, into the same number of accumulators (chunk c into c % CHAINS),
# added in one order at the end: the arithmetic of an output element, whatever the tile. With one accumulator a
# few rows' product is a chain of K / 16 dependent tensor-core steps, each waiting for the last one's result; two
# chains interleave them (H200, a large-v3 step: 1 row 9%, 8 rows 9%, 64 rows 6% faster; 4 chains were slower,
# and the kernel takes 1 or 2; workbench figures, docs/benchmarks/2026-12-04-batch-invariance.md). The wide tile
# keeps one.
CHUNK_K = 128
CHAINS = 2
# Up to this many rows a product may be launched as a programmatic dependent (`pdl`, Hopper on: fused_ops.py):
# its programs start while the kernel before it still runs and wait for it before reading x. A few rows' step is a
# chain of short kernels, each mostly its start; more rows fill the GPU, and programs parked waiting would only take
# the places of the running kernel's later ones. (Asking for the weight tile into L2 before the wait was measured
# too: slower, H200.)
DEPENDENT_MAX_ROWS = 16
# A program's warps in the decoder's residual add + layer norm: one warp a row, the layout add_norm_linear's
# kernel reproduces for its rows (so a row's statistics are the same sums in both)
NORM_WARPS = 1
N_MULTIPLE = 64  # what every tile divides (the vocabulary is padded to 64; Whisper's widths are multiples of 128)
# The passes over whole windows (1,500 rows each): a 128 x 128 output tile per program, K in steps of 64
WIDE_BLOCK_M, WIDE_BLOCK_N, WIDE_BLOCK_K = 128, 128, 64
WIDE_WARPS, WIDE_STAGES = 8, 4  # float32 (4-byte tiles) takes 2 stages: 4 would not fit in shared memory
# The same products with their tiles loaded by the tensor memory accelerator (Hopper on), one persistent program
# per multiprocessor walking the output tiles in groups of TMA_GROUP_M row tiles (each weight tile read from L2 by
# the group's programs). H100, large-v3's encoder products at 32 windows: 1.03-1.22x cuBLAS's time, where one
# program per tile took 1.27-1.33x; each output bitwise the same (docs/benchmarks/2026-12-07-invariant-encoder.md)
TMA_BLOCK_M, TMA_BLOCK_N, TMA_WARPS, TMA_STAGES, TMA_GROUP_M = 128, 128, 8, 5, 8


def tile(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, warps, stages) for a product of m rows."""
    return next(t[1:] for t in TILES if t[0] is None or m <= t[0])


def applies(x: Tensor, weight: Tensor, wide: bool = False) -> bool:
    """x (..., K) on a GPU against a contiguous (N, K) weight of its dtype, K and N multiples of what the tiles
    divide (Whisper's widths are multiples of 128; the vocabulary is padded to 64: backends/gpu.py)."""
    n, k = weight.shape
    tile_k, tile_n = (WIDE_BLOCK_K, WIDE_BLOCK_N) if wide else (CHUNK_K, N_MULTIPLE)
    return (
        triton is not None and x.is_cuda and x.dtype == weight.dtype and weight.is_contiguous()
        and k % tile_k == 0 and n % tile_n == 0 and x.shape[-1] == k
    )  # fmt: skip


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    gelu: bool = False,
    out: Tensor | None = None,
    n_valid: int | None = None,
    wide: bool = False,
    pdl: bool = False,
    few_rows: bool = False,
) -> Tensor:
    """f(x @ weight.T + bias), f GELU's tanh form or identity, each row computed alone (see above).

    out: a float32 (rows, >= n_valid) buffer to write into (a row stride of its own, e.g. a graph's logits): the
    sums are rounded to x's precision first, as a half-precision product's output is, then stored as float32.
    n_valid: store only the first n_valid features (the vocabulary inside its padded weight).
    wide: the tile of the passes over whole windows (WIDE).
    pdl: launched as a programmatic dependent where the rows are few (DEPENDENT_MAX_ROWS) and the device allows;
    the arithmetic is the same either way.
    few_rows: up to invariant_few_rows.MAX_ROWS rows in half precision run that kernel, which asks for its weight
    before it waits (the same sums; KernelOptions.invariant_few_rows)."""
    n, k = weight.shape
    assert applies(x, weight, wide), (x.shape, x.dtype, weight.shape, weight.dtype, wide)
    rows = x.reshape(-1, k)
    if not rows.is_contiguous():  # rows K apart: the kernel knows the stride, so its loads are wide and aligned
        rows = rows.contiguous()
    m = rows.shape[0]
    n_valid = n if n_valid is None else n_valid
    if out is None:
        result = torch.empty(*x.shape[:-1], n_valid, dtype=x.dtype, device=x.device)
        out2d = result.view(m, n_valid)
    else:
        assert out.dtype == torch.float32 and out.stride(-1) == 1 and out.shape[-1] >= n_valid
        result = out
        out2d = out.view(-1, out.shape[-1]) if out.dim() != 2 else out
        assert out2d.shape[0] == m
    if m == 0:
        return result
    epilogue = {"HAS_BIAS": bias is not None, "GELU": gelu, "ROUND": out is not None}
    if wide and tensor_memory_accelerator(x):
        _wide_tma(rows, weight, bias, out2d, n_valid, epilogue)
        return result
    launch = dependent_launch(x.device, pdl and not wide and m <= DEPENDENT_MAX_ROWS)
    few = not wide and few_rows and invariant_few_rows.applies(m, weight)
    if few and invariant_few_rows.launch(rows, weight, bias, out2d, n_valid, epilogue, launch):
        return result
    if wide:
        bm, bn, bk, warps = WIDE_BLOCK_M, WIDE_BLOCK_N, WIDE_BLOCK_K, WIDE_WARPS
        stages = 2 if x.dtype == torch.float32 else WIDE_STAGES
    else:
        bm, bn, warps, stages = tile(m)
        bk = CHUNK_K
        if x.dtype == torch.float32:  # 4-byte tiles: fewer in flight fit in shared memory
            stages = min(stages, 2)
    _fixed_tile_matmul[(n // bn, triton.cdiv(m, bm))](
        rows, weight, bias if bias is not None else weight, out2d, m, n_valid, out2d.stride(0), K=k, BLOCK_M=bm,
        BLOCK_N=bn, BLOCK_K=bk, CHAINS=1 if wide else CHAINS, IEEE=x.dtype == torch.float32, num_warps=warps,
        num_stages=stages, **epilogue, **launch,
    )  # fmt: skip
    return result


def add_norm_linear(
    x: Tensor, y: Tensor | None, ln: torch.nn.LayerNorm, weight: Tensor, bias: Tensor | None = None,
    gelu: bool = False, pdl: bool = False,
) -> tuple[Tensor, Tensor] | None:  # fmt: skip
    """(x + y, linear(ln(x + y), weight, bias, gelu)) in one kernel for a few rows (y None: (x, linear(ln(x)))),
    bitwise what add_norm (or norm_rows) at NORM_WARPS and then `linear` give; None where it does not apply (the
    caller runs those two)."""
    k = weight.shape[1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    if not (
        m and invariant_few_rows.applies(m, weight) and invariant_few_rows.norm_fits(k, x.device) and x.is_contiguous()
        and x.dtype == weight.dtype == ln.weight.dtype and (y is None or (y.is_contiguous() and y.shape == x.shape))
    ):  # fmt: skip
        return None
    out_x = torch.empty_like(x) if y is not None else x
    result = torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype, device=x.device)
    epilogue = {"HAS_BIAS": bias is not None, "GELU": gelu, "ROUND": False}
    launch = dependent_launch(x.device, pdl and m <= DEPENDENT_MAX_ROWS)
    norm = (y.reshape(-1, k) if y is not None else None, ln, out_x.reshape(-1, k))
    out2d = result.view(m, weight.shape[0])
    bn = invariant_few_rows.norm_block_n(weight.shape[0], k, x.device, _multiprocessors(x.device))
    if not invariant_few_rows.launch(rows, weight, bias, out2d, weight.shape[0], epilogue, launch, norm=norm, bn=bn):
        return None
    return out_x, result


def tensor_memory_accelerator(x: Tensor) -> bool:
    """Whether the wide products load their tiles through the tensor memory accelerator: half precision on a GPU
    that has one (Hopper on), with Triton's descriptors. A property of the process and the dtype, never of the
    rows, so every call of a given site takes the same kernel."""
    return TensorDescriptor is not None and x.dtype != torch.float32 and _has_tma(x.device)


@functools.cache
def _has_tma(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def _wide_tma(rows: Tensor, weight: Tensor, bias: Tensor | None, out2d: Tensor, n_valid: int, epilogue: dict) -> None:
    (m, k), n = rows.shape, weight.shape[0]
    if rows.data_ptr() % 16:  # a view that starts off the 16-byte grid: copied, never another kernel
        rows = rows.clone()
    a = TensorDescriptor.from_tensor(rows, [TMA_BLOCK_M, WIDE_BLOCK_K])
    w = TensorDescriptor.from_tensor(weight, [TMA_BLOCK_N, WIDE_BLOCK_K])
    programs = _multiprocessors(rows.device)  # those past the last tile return at once
    _wide_matmul_tma[(programs,)](
        a, w, bias if bias is not None else weight, out2d, m, n, n_valid, out2d.stride(0), K=k,
        BLOCK_M=TMA_BLOCK_M, BLOCK_N=TMA_BLOCK_N, BLOCK_K=WIDE_BLOCK_K, GROUP_M=TMA_GROUP_M, PROGRAMS=programs,
        num_warps=TMA_WARPS, num_stages=TMA_STAGES, **epilogue,
    )  # fmt: skip


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def conv1d(conv: torch.nn.Conv1d, x: Tensor) -> Tensor:
    """conv(x) for x (batch, channels, time) as one wide `linear`: each output position's kernel_size inputs per
    channel gathered into a row (channel-major, as the weight is laid out), K zero-padded to the tile (an exact
    zero adds nothing to a sum). Returns (batch, out_channels, time_out), a view of a time-major result: the
    encoder's residual stream wants that layout, and the next convolution reads it as it is."""
    (width,), (stride,), (pad,) = conv.kernel_size, conv.stride, conv.padding
    b = x.shape[0]
    cols = F.pad(x.transpose(1, 2), (0, 0, pad, pad)).unfold(1, width, stride)  # (batch, time_out, channels, width)
    t_out = cols.shape[1]
    cols = cols.reshape(b * t_out, -1)
    weight = conv.weight.reshape(conv.weight.shape[0], -1)
    k = -(-weight.shape[1] // WIDE_BLOCK_K) * WIDE_BLOCK_K
    if k != weight.shape[1]:
        cols, weight = F.pad(cols, (0, k - cols.shape[1])), F.pad(weight, (0, k - weight.shape[1]))
    return linear(cols, weight.contiguous(), conv.bias, wide=True).view(b, t_out, -1).transpose(1, 2)


def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Unmasked attention (batch, heads, time, dim), each (window, head, query block) computed alone
    (kernels/encoder_attention.py)."""
    return encoder_attention.attention(q, k, v)


if triton is not None:

    @triton.jit
    def _epilogue(acc, B, rn, HAS_BIAS: tl.constexpr, GELU: tl.constexpr, ROUND: tl.constexpr, DTYPE: tl.constexpr):
        # per element, after the whole sum: bias, GELU's tanh form, a float32 output rounded to the input's precision
        # (as cuBLAS's half-precision output is)
        if HAS_BIAS:
            acc += tl.load(B + rn).to(tl.float32)
        if GELU:
            acc = gelu_tanh(acc)
        if ROUND:
            acc = acc.to(DTYPE).to(tl.float32)
        return acc

    @triton.jit
    def _chunk_dot(x_ptr, w_ptr, acc, row_ok, IEEE: tl.constexpr):
        # one BLOCK_K chunk of K into one accumulator, the tensor cores adding its 16-wide slices in order
        a = tl.load(x_ptr, mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptr)
        if IEEE:  # a float32 model keeps float32 products (tensor cores would round the inputs to tf32)
            return tl.dot(a, w, acc, input_precision="ieee")
        return tl.dot(a, w, acc)

    # M changes with the batch: specializing on it (e.g. M == 1) would compile other code for other batches, and
    # nothing may differ between batch sizes but the grid. The input's rows are K apart (a constant), the output's
    # stride is the caller's buffer's.
    @triton.jit(do_not_specialize=["M", "n_valid", "s_om"])
    def _fixed_tile_matmul(
        X, W, B, OUT, M, n_valid, s_om, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, CHAINS: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
        ROUND: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        # launched as a dependent (PDL): the next kernel may start now, and x is read only after the kernel
        # before this one has finished
        let_next_launch(PDL)
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        wait_for_previous(PDL)
        row_ok = rm < M
        x_ptr = X + rm.to(tl.int64)[:, None] * K + rk[None, :]
        w_ptr = W + rn.to(tl.int64)[None, :] * K + rk[:, None]
        # chunk c of K (BLOCK_K wide) goes into accumulator c % CHAINS, each walking its chunks from 0 up; the
        # accumulators are added in a fixed order at the end. CHAINS independent chains of tensor-core steps
        # where one would wait for each step's result: what bounds a few rows' product (see CHAINS)
        tl.static_assert(CHAINS == 1 or CHAINS == 2)
        acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        CHUNKS: tl.constexpr = K // BLOCK_K
        for _ in range(CHUNKS // CHAINS):
            acc0 = _chunk_dot(x_ptr, w_ptr, acc0, row_ok, IEEE)
            if CHAINS == 2:
                acc1 = _chunk_dot(x_ptr + BLOCK_K, w_ptr + BLOCK_K, acc1, row_ok, IEEE)
            x_ptr += CHAINS * BLOCK_K
            w_ptr += CHAINS * BLOCK_K
        if CHUNKS % CHAINS:  # an odd last chunk, into the first accumulator
            acc0 = _chunk_dot(x_ptr, w_ptr, acc0, row_ok, IEEE)
        acc = acc0
        if CHAINS == 2:
            acc = acc0 + acc1
        acc = _epilogue(acc, B, rn, HAS_BIAS, GELU, ROUND, X.dtype.element_ty)
        o_ptr = OUT + rm.to(tl.int64)[:, None] * s_om + rn[None, :]
        tl.store(o_ptr, acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (rn < n_valid)[None, :])

    @triton.jit
    def _grouped_tile(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
        # output tile `tile` in groups of GROUP_M row tiles: the group's programs run at once and share each
        # weight tile through L2
        per_group = GROUP_M * tiles_n
        first_m = (tile // per_group) * GROUP_M
        group_m = tl.minimum(tiles_m - first_m, GROUP_M)
        return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m

    @triton.jit(do_not_specialize=["M", "n_valid", "s_om"])
    def _wide_matmul_tma(
        A, W, B, OUT, M, N, n_valid, s_om, K: tl.constexpr, PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr,
        GELU: tl.constexpr, ROUND: tl.constexpr,
    ):  # fmt: skip
        # A (M, K) and W (N, K) as tensor descriptors; rows past M load as zeros and are not stored. Each program
        # takes every PROGRAMS-th output tile; a tile's sum is the same whichever program computes it (K from 0 up,
        # one accumulator), and the loops flattened let the next tile's loads start under this one's epilogue
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = N // BLOCK_N
        for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
            pid_m, pid_n = _grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                a = A.load([pid_m * BLOCK_M, k])
                w = W.load([pid_n * BLOCK_N, k])
                acc = tl.dot(a, w.T, acc)
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = _epilogue(acc, B, rn, HAS_BIAS, GELU, ROUND, B.dtype.element_ty)
            o_ptr = OUT + rm.to(tl.int64)[:, None] * s_om + rn[None, :]
            tl.store(o_ptr, acc.to(OUT.dtype.element_ty), mask=(rm < M)[:, None] & (rn < n_valid)[None, :])

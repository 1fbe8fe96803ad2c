"""GPU kernels for a transformer block's small pieces: residual add + layer norm in one kernel, bias + GELU in the
GEMM, and one-row products for a lone sequence's decode step.

Between two sub-layers a block adds the sub-layer's output to the residual stream and normalizes the sum for the
next one. Done by torch these are two kernels that pass the sum through memory; on a GPU `add_norm` does both in
one Triton kernel (one program per row) that writes the new residual stream and its normalized copy. `linear_gelu`
runs the MLP's first product with its bias and GELU in cuBLASLt's epilogue instead of a separate GELU kernel.

Why it matters: a decode step is hundreds of small kernels, each costing a few microseconds whatever its size, so
each kernel fused away is time saved; in the encoder a separate GELU is one more pass over the MLP's widest
activations, a noticeable share of the GEMM it follows (`benchmarks/gpu_kernels.py` lists the kernels of an
encoder batch and of a decoder step).

cuBLASLt's epilogue computes GELU's tanh form, which differs from the exact (erf) one Whisper was trained with by at
most 4.7e-4, at outputs near 2.7, where a float16 step is 2e-3: the epilogue is only used in half precision, where
that difference is below the result's own rounding. float32 models keep the exact form. The GPU backend gives
the model these functions as its layer operations (engine/backends/gpu.py FUSED_OPS); elsewhere the model runs
plain torch (engine/model/layer_ops.py). Where a kernel does not apply (a CPU tensor, a view, another dtype) each
function falls back to the torch operations it stands for (bitwise the same results).

`linear` with a single row (one sequence decoding) and a weight of at most ONE_ROW_MAX_WEIGHT elements runs a Triton
matrix-vector product, a few output features per program (one for the MLP's 5,120-wide second product): at one row
it beats cuBLAS on large-v3's products (each weight read from HBM, not L2). Two or more rows stay with cuBLAS.

On Hopper and later the one-row kernels are launched as programmatic dependents (PDL): a kernel may start while the
one before it in the stream still runs, reads its whole weight tile into registers (it does not depend on that
kernel), and only then waits for it (`wait_for_previous`) before reading its input row and writing anything. The
kernels before them say when that may start (`let_next_launch`, at their first instruction). A lone step's
self-attention, cross-attention and split combiner are dependents in the same way (`dependent_launch`; they read
their caches before waiting: engine/kernels/decode_attention.py, engine/kernels/int8_attention.py). A lone decode
step is a chain of small dependent kernels whose time is mostly each one's start and first loads, not its bytes;
overlapping those with the kernel before shortens such a chain (`benchmarks/gpu_throughput.py --concurrency 1`;
tests/gpu/test_fused_ops_cuda.py checks that the dependent chain computes what the plain one does).

A lone sequence's decode step also runs each sub-layer's residual add, layer norm and first product in one
kernel (`add_norm_linear`, one row, half precision): every program recomputes the row's sum and norm statistics
(1,280 values, cheap against its share of the weight) and program 0 writes the new residual stream, so the
three kernels between two sub-layers (product, add + norm, product) become two, and the MLP's GELU rides along
(`python benchmarks/gpu_one_row.py --only products`).

For the float8 encoder (engine/kernels/fp8.py) the products' inputs are quantized by the kernels that make them:
`add_norm_fp8` writes the normalized rows in e4m3 with a float32 scale per row, and `quantize_rows` does the same
for the MLP's GELU (applied to its first product's output) and for the attention output, read in place.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch operations below are used
    triton = None
# Triton's grid dependency control (3.3 on): without it the kernels launch one after the other, without PDL
_GDC = triton is not None and hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")

HALF_DTYPES = (torch.float16, torch.bfloat16)
ONE_ROW_MAX_WEIGHT = 2**23  # elements: large-v3's 1,280 x 1,280 products and its MLP's second (5,120 wide) qualify
ONE_ROW_FEATURES = 4  # output features per program of the one-row product
ONE_ROW_WIDE_K = 2048  # from this width one output feature per program (its tile in registers: see _tile)
# output features per program of add_norm_linear (H200, PDL: 8 beat 2 and 4 on each of large-v3's three shapes;
# `python benchmarks/gpu_one_row.py --only products` sweeps them)
NORM_PRODUCT_FEATURES = 8


def _fused_norm_applies(x: Tensor, y: Tensor) -> bool:
    return (
        triton is not None and x.is_cuda and x.dtype == y.dtype and x.shape == y.shape
        and x.is_contiguous() and y.is_contiguous()
    )  # fmt: skip


def add_norm(
    x: Tensor, y: Tensor, ln: nn.LayerNorm, pdl: bool = False, warps: int | None = None
) -> tuple[Tensor, Tensor]:
    """(x + y, ln(x + y)): the residual stream after a sub-layer and the next sub-layer's input. pdl: launched as a
    programmatic dependent where the device allows (the batch-invariant backend's few rows). warps: a program's
    warps (a row's sums follow its layout), else by the row's width."""
    if not _fused_norm_applies(x, y):
        x = x + y
        return x, F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    n = x.shape[-1]
    rows = x.numel() // n
    out_x, out_h = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(n)
    _add_layer_norm[(rows,)](
        x, y, ln.weight, ln.bias, out_x, out_h, out_h, n, ln.eps, BLOCK=block, num_warps=warps or _warps(block),
        FP8=False, ADD=True, **dependent_launch(x.device, pdl),
    )  # fmt: skip
    return out_x, out_h


def add_norm_fp8(x: Tensor, y: Tensor, ln: nn.LayerNorm) -> tuple[Tensor, Tensor, Tensor]:
    """add_norm with the normalized rows in float8 e4m3 and a float32 scale per row (rows, 1), ready for
    torch._scaled_mm: on a GPU the quantization costs no pass of its own (elsewhere torch's operations)."""
    if not _fused_norm_applies(x, y):  # torch's operations, the reference the kernel is tested against
        x, h = add_norm(x, y, ln)
        return (x, *_quantize_reference(h.reshape(-1, h.shape[-1])))
    n = x.shape[-1]
    rows = x.numel() // n
    out_x = torch.empty_like(x)
    out_h = torch.empty(rows, n, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n)
    _add_layer_norm[(rows,)](
        x, y, ln.weight, ln.bias, out_x, out_h, scale, n, ln.eps, BLOCK=block, num_warps=_warps(block), FP8=True,
        ADD=True, PDL=False,
    )  # fmt: skip
    return out_x, out_h, scale


def quantize_rows(x: Tensor, gelu: bool = False) -> tuple[Tensor, Tensor]:
    """(rows of x in float8 e4m3, float32 scale per row); x is (rows, n) contiguous or an attention output
    (batch, time, heads, head_dim) as the transposed view SDPA returns (read in place). gelu: of x, first, in
    its tanh form (as linear_gelu's epilogue). 4 warps: 8 or 16 were slower at 1,280 and 5,120 wide rows (H200)."""
    if x.dim() == 2:
        x = x[None, :, None, :]
    if not (triton is not None and x.is_cuda):
        v = x.reshape(x.shape[0] * x.shape[1], -1).float()
        return _quantize_reference(F.gelu(v, approximate="tanh") if gelu else v)
    b, t, heads, head_dim = x.shape
    assert x.stride(3) == 1
    rows, n = b * t, heads * head_dim
    out = torch.empty(rows, n, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n)
    _quantize_rows[(rows,)](
        x, out, scale, n, t, x.stride(0), x.stride(1), x.stride(2), head_dim,
        BLOCK=block, GELU=gelu, num_warps=4,
    )  # fmt: skip
    return out, scale


def _quantize_reference(rows: Tensor) -> tuple[Tensor, Tensor]:
    rows = rows.float()
    amax = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    return (rows * (448.0 / amax)).to(torch.float8_e4m3fn), amax / 448.0


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8


def pdl_applies(device: torch.device, pdl: bool = True) -> bool:
    """Programmatic dependent launch on this device: asked for (KernelOptions.pdl), Hopper or later, and a Triton
    that has it."""
    return pdl and _GDC and device.type == "cuda" and _major(device.index) >= 9


def dependent_launch(device: torch.device, pdl: bool = True) -> dict:
    """A kernel's PDL argument and Triton's launch option (only passed to a Triton that knows it): launched as a
    programmatic dependent where pdl_applies."""
    pdl = pdl_applies(device, pdl)
    return dict(PDL=pdl, launch_pdl=pdl) if _GDC else dict(PDL=False)


@functools.cache
def _major(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _tile(k: int, features: int) -> dict:
    """A one-row kernel's (features, K) tile: K as chunks of 256 (or 128) columns, their count rounded up to a
    power of two; with PDL the kernel holds it in registers while it waits."""
    block_k = 256 if k % 256 == 0 else 128
    return dict(BLOCK_N=features, BLOCK_K=block_k, CHUNKS=triton.next_power_of_2(k // block_k))


def linear(proj: nn.Linear, x: Tensor, pdl: bool = True) -> Tensor:
    """proj(x); a single row on a GPU through the one-row kernel when the weight is small enough (see above), as a
    programmatic dependent where `pdl` (KernelOptions.pdl) and the device allow."""
    w, b = proj.weight, proj.bias
    if not x.is_cuda:
        return F.linear(x, w, b)
    n, k = w.shape
    features = ONE_ROW_FEATURES if k <= ONE_ROW_WIDE_K else 1  # a wide row (the MLP's second product): one
    if not (
        triton is not None and x.numel() == k and w.numel() <= ONE_ROW_MAX_WEIGHT and b is not None
        and n % features == 0 and k % 128 == 0 and x.is_contiguous() and w.is_contiguous() and x.dtype == w.dtype
    ):  # fmt: skip
        return F.linear(x, w, b)
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    _one_row[(n // features,)](
        x, w, b, out, k, **_tile(k, features), HAS_BIAS=True, ROUND=False, num_warps=4, **dependent_launch(x.device, pdl)
    )  # fmt: skip
    return out


def one_row_logits(x: Tensor, weight: Tensor, pdl: bool = True) -> Tensor | None:
    """x (1, n) @ weight.T as float32 for a lone sequence's vocabulary projection on a GPU, or None where the
    kernel does not apply. Faster than cuBLAS's matrix-vector product and the cast after it for large-v3's 51,866 x
    1,280 (`python benchmarks/gpu_one_row.py --only vocabulary`; H200: 2 outputs and 2 warps per program were the
    fastest of 27 configurations).
    The sums are rounded to x's dtype before the float32 store, as cuBLAS's half-precision output is, so a row's
    greedy pick does not depend on whether it decodes alone (near-ties are common at float16's step)."""
    v, k = weight.shape
    if not (
        triton is not None and x.is_cuda and x.numel() == k and k % 128 == 0 and v % 2 == 0
        and x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype
    ):  # fmt: skip
        return None
    out = torch.empty(1, v, dtype=torch.float32, device=x.device)
    _one_row[(v // 2,)](
        x, weight, weight, out, k, **_tile(k, 2), HAS_BIAS=False, ROUND=True, num_warps=2, **dependent_launch(x.device, pdl)
    )  # fmt: skip
    return out


def norm_product_applies(x: Tensor, weight: Tensor) -> bool:
    """add_norm_linear's kernel runs for one half-precision row on a GPU (x: (1, 1, n) contiguous) whose width is
    a multiple of 128, against a contiguous weight of the same dtype."""
    n = x.shape[-1]
    return (
        triton is not None and x.is_cuda and x.numel() == n and n % 128 == 0
        and x.dtype in HALF_DTYPES and weight.dtype == x.dtype and weight.is_contiguous() and x.is_contiguous()
        and weight.shape[1] == n and weight.shape[0] % NORM_PRODUCT_FEATURES == 0
    )  # fmt: skip


def add_norm_linear(
    x: Tensor, y: Tensor | None, ln: nn.LayerNorm, weight: Tensor, bias: Tensor, gelu: bool = False,
    pdl: bool = True, fused: bool = True, out_h: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(x + y, f(ln(x + y) @ weight.T + bias)) with f GELU's tanh form (as linear_gelu's epilogue) or identity;
    y None: (x, f(ln(x) @ weight.T + bias)). One kernel where `fused` and norm_product_applies, else add_norm and a
    product (the reference the GPU test compares the kernel against). out_h: a buffer like x that also receives
    ln(x + y), the product's input (what a LoRA adapter's delta reads)."""
    if not (fused and norm_product_applies(x, weight)):
        x, h = (x, norm(ln, x)) if y is None else add_norm(x, y, ln)
        if out_h is not None:
            out_h.copy_(h)
        return x, (_linear_gelu(h, weight, bias) if gelu else F.linear(h, weight, bias))
    n = x.shape[-1]
    features = weight.shape[0]
    out_x = torch.empty_like(x) if y is not None else x
    out = torch.empty(*x.shape[:-1], features, dtype=x.dtype, device=x.device)
    _add_norm_product[(features // NORM_PRODUCT_FEATURES,)](
        x, x if y is None else y, ln.weight, ln.bias, weight, bias, out_x, out, out if out_h is None else out_h, n,
        ln.eps, BLOCK=triton.next_power_of_2(n), **_tile(n, NORM_PRODUCT_FEATURES), ADD=y is not None, GELU=gelu,
        STORE_H=out_h is not None, num_warps=4, **dependent_launch(x.device, pdl),
    )  # fmt: skip
    return out_x, out


def norm(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    """ln(x) without nn.Module.__call__, whose dispatch the decode step would pay for every layer norm (see
    TextDecoder.forward)."""
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


def norm_rows(ln: nn.LayerNorm, x: Tensor, pdl: bool = False, warps: int | None = None) -> Tensor:
    """ln(x) with one program per row on a GPU (add_norm's kernel without the add): each row's statistics are
    summed in the same order whatever the number of rows, which torch's kernel does not promise (the
    batch-invariant backend, engine/backends/gpu_invariant.py). Elsewhere `norm`. pdl, warps: as add_norm's."""
    if not _fused_norm_applies(x, x):
        return norm(ln, x)
    n = x.shape[-1]
    out = torch.empty_like(x)
    block = triton.next_power_of_2(n)
    _add_layer_norm[(x.numel() // n,)](
        x, x, ln.weight, ln.bias, out, out, out, n, ln.eps, BLOCK=block, num_warps=warps or _warps(block),
        FP8=False, ADD=False, **dependent_launch(x.device, pdl),
    )  # fmt: skip
    return out


def linear_gelu(proj: nn.Linear, x: Tensor) -> Tensor:
    """gelu(proj(x)); on a GPU in half precision, one cuBLASLt product with the bias and GELU in its epilogue."""
    return _linear_gelu(x, proj.weight, proj.bias)


def gelu(x: Tensor) -> Tensor:
    """GELU in the form linear_gelu computes it: its tanh form where cuBLASLt's epilogue computes it."""
    return F.gelu(x, approximate="tanh") if x.is_cuda and x.dtype in HALF_DTYPES else F.gelu(x)


def linear_into(proj: nn.Linear, x: Tensor, out: Tensor, with_gelu: bool = False) -> None:
    """linear (with_gelu: linear_gelu) written into `out`, a contiguous tensor of the output's shape: a product of
    many rows (cuBLAS; in half precision GELU in cuBLASLt's epilogue, as linear_gelu's)."""
    rows, dest, w, b = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1]), proj.weight, proj.bias
    epilogue = with_gelu and b is not None and x.is_cuda and x.dtype in HALF_DTYPES
    if epilogue:
        torch._addmm_activation(b, rows, w.t(), use_gelu=True, out=dest)
    elif b is None:
        torch.mm(rows, w.t(), out=dest)
    else:
        torch.addmm(b, rows, w.t(), out=dest)
    if with_gelu and not epilogue:
        dest.copy_(gelu(dest))


def _linear_gelu(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if x.is_cuda and x.dtype in HALF_DTYPES and bias is not None:
        rows = x.reshape(-1, x.shape[-1])
        out = torch._addmm_activation(bias, rows, weight.t(), use_gelu=True)
        return out.view(*x.shape[:-1], out.shape[-1])
    return F.gelu(F.linear(x, weight, bias))


if triton is not None:

    @triton.jit
    def _store_fp8_row(OUT, SCALE, row, cols, v, valid):
        # one row in float8 e4m3 with its own scale (amax / 448, the format's largest value), for torch._scaled_mm
        amax = tl.maximum(tl.max(tl.where(valid, tl.abs(v), 0.0), axis=0), 1e-12)
        tl.store(OUT + cols, (v * (448.0 / amax)).to(OUT.dtype.element_ty), mask=valid)
        tl.store(SCALE + row, amax / 448.0)

    @triton.jit
    def gelu_tanh(v):
        # GELU's tanh form, x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 x^3)), as cuBLASLt's epilogue computes it
        return v / (1.0 + tl.exp(-1.5957691216057308 * (v + 0.044715 * v * v * v)))

    @triton.jit
    def _mean_rstd(s, valid, n, eps):
        # a row's layer-norm statistics in float32: mean and 1 / sqrt(variance + eps), over its `valid` columns
        mean = tl.sum(s, axis=0) / n
        d = tl.where(valid, s - mean, 0.0)
        return mean, 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n + eps)

    @triton.jit
    def _chunks(K: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr):
        # K columns as CHUNKS rows of BLOCK_K (CHUNKS a power of two >= K / BLOCK_K; the rows past K masked): a
        # masked chunk is masked whole, so the loads stay vectorized. Returns (column index, in K)
        ch = tl.arange(0, CHUNKS)
        cols = ch[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]
        return cols, (ch < K // BLOCK_K)[:, None] & (cols >= 0)

    @triton.jit
    def let_next_launch(PDL: tl.constexpr):
        # programmatic dependent launch (Hopper on): the next kernel in the stream may start now, alongside this
        # one, and read what does not depend on it (its weights) before wait_for_previous
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def wait_for_previous(PDL: tl.constexpr):
        # until the kernel before this one has finished and its writes are visible; nothing is written before
        # this, so a buffer that kernel still reads is never overwritten early
        if PDL:
            tl.extra.cuda.gdc_wait()

    @triton.jit
    def _add_layer_norm(
        X, Y, W, B, OUT_X, OUT_H, H_SCALE, N, eps, BLOCK: tl.constexpr, FP8: tl.constexpr, ADD: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        let_next_launch(PDL)  # the next product asks for its weight meanwhile (invariant_ops.linear)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        valid = cols < N
        w = tl.load(W + cols, mask=valid, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=valid, other=0.0).to(tl.float32)
        wait_for_previous(PDL)  # the rows come from the kernels before this one
        s = tl.load(X + row * N + cols, mask=valid, other=0.0)
        if ADD:
            y = tl.load(Y + row * N + cols, mask=valid, other=0.0).to(tl.float32)
            # the sum is rounded to the stream's dtype first, as torch's add would, and normalized from that value
            s = (s.to(tl.float32) + y).to(OUT_X.dtype.element_ty)
            tl.store(OUT_X + row * N + cols, s, mask=valid)
        s = s.to(tl.float32)
        mean, rstd = _mean_rstd(s, valid, N, eps)
        h = (s - mean) * rstd * w + b
        if FP8:
            _store_fp8_row(OUT_H + row * N, H_SCALE, row, cols, h, valid)
        else:
            tl.store(OUT_H + row * N + cols, h.to(OUT_H.dtype.element_ty), mask=valid)

    @triton.jit
    def _quantize_rows(
        X, OUT, SCALE, N, T, stride_b, stride_t, stride_head, head_dim, BLOCK: tl.constexpr, GELU: tl.constexpr
    ):
        # row (b, t) of N values laid out as heads of head_dim, stride_head apart: an attention output is read
        # through its (batch, time, heads, dim) view without a copy; GELU first for an MLP's product
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        valid = cols < N
        base = (row // T) * stride_b + (row % T) * stride_t
        v = tl.load(X + base + (cols // head_dim) * stride_head + cols % head_dim, mask=valid, other=0.0)
        v = v.to(tl.float32)
        if GELU:  # tanh form, as cuBLASLt's epilogue in the float16 path: erf made this kernel 1.9x slower
            v = gelu_tanh(v)
        _store_fp8_row(OUT + row * N, SCALE, row, cols, v, valid)

    @triton.jit
    def _add_norm_product(
        X, Y, LN_W, LN_B, W, BIAS, OUT_X, OUT, OUT_H, K: tl.constexpr, eps,
        BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr,
        ADD: tl.constexpr, GELU: tl.constexpr, STORE_H: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        # BLOCK_N output features' weights, the norm's and the bias: read before waiting for the kernel that
        # writes the row (let_next_launch)
        let_next_launch(PDL)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        kc, in_k = _chunks(K, BLOCK_K, CHUNKS)
        w = tl.load(W + rows[:, None, None] * K + kc[None, :, :], mask=in_k[None, :, :], other=0.0)
        ln_w = tl.load(LN_W + kc, mask=in_k, other=0.0).to(tl.float32)
        ln_b = tl.load(LN_B + kc, mask=in_k, other=0.0).to(tl.float32)
        bias = tl.load(BIAS + rows).to(tl.float32)
        wait_for_previous(PDL)
        # the row's sum and its norm statistics, as _add_layer_norm computes them (every program, from L2)
        cols = tl.arange(0, BLOCK)
        valid = cols < K
        s = tl.load(X + cols, mask=valid, other=0.0).to(tl.float32)
        if ADD:
            s = (s + tl.load(Y + cols, mask=valid, other=0.0).to(tl.float32)).to(OUT_X.dtype.element_ty)
            if tl.program_id(0) == 0:
                tl.store(OUT_X + cols, s, mask=valid)
            s = s.to(tl.float32)
        mean, rstd = _mean_rstd(s, valid, K, eps)
        # then the normalized row as (chunk, BLOCK_K), rebuilt and rounded to the weight's dtype as the separate
        # kernels' stored row is
        v = tl.load(X + kc, mask=in_k, other=0.0).to(tl.float32)
        if ADD:
            v = (v + tl.load(Y + kc, mask=in_k, other=0.0).to(tl.float32)).to(OUT_X.dtype.element_ty).to(tl.float32)
        h = ((v - mean) * rstd * ln_w + ln_b).to(W.dtype.element_ty)
        # the normalized row, once: what an adapter's delta reads (a compile-time branch around a runtime one)
        if STORE_H:  # noqa: SIM102
            if tl.program_id(0) == 0:
                tl.store(OUT_H + kc, h, mask=in_k)
        h = h.to(tl.float32)
        acc = tl.sum(tl.sum(w.to(tl.float32) * h[None, :, :], axis=2), axis=1) + bias
        if GELU:  # tanh form, as linear_gelu's cuBLASLt epilogue
            acc = gelu_tanh(acc)
        tl.store(OUT + rows, acc.to(OUT.dtype.element_ty))

    @triton.jit
    def _one_row(
        X, W, B, OUT, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr,
        HAS_BIAS: tl.constexpr, ROUND: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        # BLOCK_N output features per program; the weight rows are contiguous along K, read once, in float32 sums.
        # The whole (BLOCK_N, K) tile is read before waiting for the kernel that writes x (let_next_launch)
        let_next_launch(PDL)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols, in_k = _chunks(K, BLOCK_K, CHUNKS)
        w = tl.load(W + rows[:, None, None] * K + cols[None, :, :], mask=in_k[None, :, :], other=0.0)
        if HAS_BIAS:
            bias = tl.load(B + rows).to(tl.float32)
        wait_for_previous(PDL)
        x = tl.load(X + cols, mask=in_k, other=0.0).to(tl.float32)
        acc = tl.sum(tl.sum(w.to(tl.float32) * x[None, :, :], axis=2), axis=1)
        if HAS_BIAS:
            acc += bias
        if ROUND:  # to the input's precision first (a float32 output of half-precision operands)
            acc = acc.to(X.dtype.element_ty).to(tl.float32)
        tl.store(OUT + rows, acc.to(OUT.dtype.element_ty))

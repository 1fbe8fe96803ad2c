"""A few rows' batch-invariant product with its weight in shared memory before the dependent-launch wait.

The invariant product (invariant_ops.py) gives every output element one arithmetic whatever the number of rows:
the tensor cores' 16-wide slices of K in order, chunk c of CHUNK_K into accumulator c % 2, the two added at the
end. Its Triton tile kernel can only read the weight after the wait for the kernel before it (Triton issues a
pipelined loop's loads inside the loop), so a lone row's product streams its weight from HBM after the kernel
before it has finished, and a decode step of a lone window waits for that ~200 times.

This kernel (Gluon, Triton's lower-level language, which places shared memory and asynchronous copies by hand)
does the same sums in the same order, but each program first copies its whole slab of the weight (BLOCK_N
features x K) into shared memory with asynchronous copies, then waits for the kernel before it, then reads its
rows of x and runs the chained tensor-core steps out of shared memory, so that the weight's HBM time overlaps the
kernel before and what is left after the wait is the steps themselves. It can also take the residual add and the
layer norm before the product (`norm`, invariant_ops.add_norm_linear): every program recomputes its rows' sums
with the layout of add_norm's kernel at one warp a row (the same sums in the same order). The tests compare both
against the tile kernel after add_norm, bitwise (tests/gpu/test_batch_invariance.py); KernelOptions.invariant_few_rows
turns the products on. Measured (BENCHMARKS.md, batch-invariant kernels): a lone window's step is no faster with
them, and slower with the norms inside, which only benchmarks/gpu_one_row.py's chain runs.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
except ImportError:  # no Triton, or one without Gluon: the tile kernel serves every row count
    gluon = None

BLOCK_M = 16  # one m16n8k16 tile of rows: the rows past M are masked zeros
BLOCK_K = 128  # invariant_ops.CHUNK_K: the chunk that goes into one accumulator
SLAB_BYTES = 80 * 1024  # the most weight a program holds in shared memory
# Where it beats the tile kernel (H100, benchmarks/gpu_one_row.py --only invariant): at 1 and 4 rows with 32
# features a program, not at 16 rows (about twice the tile's time) nor with 8 features a program (fc2's 5,120-wide
# slab: slower at every row count)
MAX_ROWS = 4
MIN_BLOCK_N = 16
NORM_SMEM_BYTES = 160 * 1024  # the slab and the normalized rows: one program per multiprocessor on Hopper
NORM_SMEM_MAX_BYTES = 224 * 1024  # what one program may take (Hopper: 227 KiB a block)
# Why the kernel could not be built here (Gluon is experimental: another Triton may not compile it), or None; once
# set, the tile kernel serves every row count, with the same sums
broken: str | None = None


def block_n(n: int, k: int, itemsize: int = 2) -> int | None:
    """Features per program: the widest of 32 / 16 / 8 whose slab fits SLAB_BYTES and divides n."""
    return next((bn for bn in (32, 16, 8) if bn * k * itemsize <= SLAB_BYTES and n % bn == 0), None)


def norm_fits(k: int, device: torch.device) -> bool:
    """Whether a product of width k can also hold its rows' normalized copy (16 x the row's padded width), in
    NORM_SMEM_BYTES and in what a block of this GPU may take."""
    need = _rows_bytes(k) + SLAB_BYTES
    return need <= NORM_SMEM_BYTES and need <= _block_smem(device)


@functools.cache
def _block_smem(device: torch.device) -> int:
    # what a block may opt in to (Hopper 227 KiB, Ampere's A100 163 KiB, its consumer parts 99 KiB)
    return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 48 * 1024)


def _rows_bytes(k: int) -> int:
    return BLOCK_M * triton.next_power_of_2(k) * 2


def norm_block_n(n: int, k: int, device: torch.device, multiprocessors: int) -> int:
    """Features per program with the normalized rows in shared memory too: one program fits a multiprocessor, so
    more programs than multiprocessors would run in two waves, the second reading its weight after the wait; twice
    block_n's features where the two fit in NORM_SMEM_MAX_BYTES and in what a block of this GPU may take."""
    bn = block_n(n, k)
    need = 2 * bn * k * 2 + _rows_bytes(k)
    if n // bn > multiprocessors and n % (2 * bn) == 0 and need <= min(NORM_SMEM_MAX_BYTES, _block_smem(device)):
        return 2 * bn
    return bn


def applies(rows: int, weight: Tensor) -> bool:
    n, k = weight.shape
    # an even number of chunks: with an odd one (K = 384, tiny's width) its sums differed from the tile kernel's
    # (H100), not explained yet
    return (
        gluon is not None and broken is None and weight.is_cuda and weight.dtype in (torch.float16, torch.bfloat16)
        and rows <= MAX_ROWS and k % (2 * BLOCK_K) == 0 and (block_n(n, k) or 0) >= MIN_BLOCK_N
        and _has_cp_async(weight.device) and SLAB_BYTES <= _block_smem(weight.device)
    )  # fmt: skip


@functools.cache
def _has_cp_async(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 8


def launch(
    rows: Tensor, weight: Tensor, bias: Tensor | None, out2d: Tensor, n_valid: int, epilogue: dict, launch_args: dict,
    norm: tuple | None = None, bn: int | None = None,
) -> bool:  # fmt: skip
    """out2d[:, :n_valid] = epilogue(a @ weight.T + bias), a = rows, or with `norm` = (y, ln, out_x) the rows'
    residual add and layer norm first: out_x = rows + y (y None: no add, out_x unused), a = ln(out_x), each row
    by add_norm's arithmetic at NORM_WARPS (see fused_ops._add_layer_norm). False where the kernel could not be
    built (`broken`): the caller then runs the unfused kernels."""
    global broken
    (m, k), n = rows.shape, weight.shape[0]
    bn = bn or block_n(n, k)
    warps = bn // 8  # a warp per 8 features: the m16n8k16 step's width
    y, ln, out_x = norm if norm is not None else (None, None, None)
    try:
        _few_rows_matmul[(n // bn, triton.cdiv(m, BLOCK_M))](
            rows, weight, bias if bias is not None else weight, out2d, m, n_valid, out2d.stride(0),
            y if y is not None else rows, weight if ln is None else ln.weight, weight if ln is None else ln.bias,
            out_x if out_x is not None else rows, 0.0 if ln is None else ln.eps, k, K=k, BLOCK_N=bn, WARPS=warps,
            NORM=ln is not None, ADD=y is not None, ROW_BLOCK=triton.next_power_of_2(k), **epilogue, **launch_args,
            num_warps=warps,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a compiler's error of any kind: the tile kernel computes the same
        broken = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        warnings.warn(f"the few-rows invariant kernel did not build ({broken}); the tile kernel serves", stacklevel=2)
        return False
    return True


if gluon is not None:

    @gluon.jit
    def _x_chunk(x_ptr, row_ok, h_smem, c: gl.constexpr, NORM: gl.constexpr, A_LAYOUT: gl.constexpr):
        # chunk c of the rows: the normalized rows from shared memory, or x from global memory
        if NORM:
            return h_smem.slice(c * 128, 128, dim=1).load(A_LAYOUT)
        return gl.load(x_ptr + c * 128, mask=row_ok[:, None], other=0.0)

    @gluon.jit
    def _norm_rows(
        X, Y, OUT_X, h_smem, g, beta, cols, col_ok, M, pid_m, pid_n, eps, N, K: gl.constexpr, ADD: gl.constexpr,
        ROWS: gl.constexpr, WARPS: gl.constexpr, ROW_LAYOUT: gl.constexpr,
    ):  # fmt: skip
        # fused_ops._add_layer_norm's arithmetic for each row, a warp per row (its one-warp layout, so the same sums
        # in the same order), WARPS rows at a time into h_smem; program n 0 writes the residual stream
        for p in gl.static_range(ROWS // WARPS):
            if pid_m * ROWS + p * WARPS < M:
                r = pid_m * ROWS + p * WARPS + gl.arange(0, WARPS, layout=gl.SliceLayout(1, ROW_LAYOUT))
                ok = (r < M)[:, None] & col_ok[None, :]
                off = r.to(gl.int64)[:, None] * K + cols[None, :]
                s = gl.load(X + off, mask=ok, other=0.0)
                if ADD:
                    y = gl.load(Y + off, mask=ok, other=0.0).to(gl.float32)
                    s = (s.to(gl.float32) + y).to(X.dtype.element_ty)
                    gl.store(OUT_X + off, s, mask=ok & (pid_n == 0))
                s = s.to(gl.float32)
                # divided by the width as a runtime value, as add_norm's kernel does (not a constant the compiler
                # could fold into another instruction)
                mean = gl.sum(s, axis=1) / N
                d = gl.where(col_ok[None, :], s - mean[:, None], 0.0)
                rstd = 1.0 / gl.sqrt(gl.sum(d * d, axis=1) / N + eps)
                h = (s - mean[:, None]) * rstd[:, None] * g[None, :] + beta[None, :]
                h_smem.slice(p * WARPS, WARPS, dim=0).store(h.to(X.dtype.element_ty))

    @gluon.jit
    def _chunk_mma(a, w_chunk, acc, B_LAYOUT: gl.constexpr):
        b = w_chunk.permute((1, 0)).load(B_LAYOUT)
        return mma_v2(a, b, acc)

    @gluon.jit(do_not_specialize=["M", "n_valid", "s_om", "eps"])
    def _few_rows_matmul(
        X, W, B, OUT, M, n_valid, s_om, Y, G, BETA, OUT_X, eps, N_NORM, K: gl.constexpr, BLOCK_N: gl.constexpr,
        WARPS: gl.constexpr, NORM: gl.constexpr, ADD: gl.constexpr, ROW_BLOCK: gl.constexpr, HAS_BIAS: gl.constexpr,
        GELU: gl.constexpr, ROUND: gl.constexpr, PDL: gl.constexpr,
    ):  # fmt: skip
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip
        CHUNK: gl.constexpr = 128
        ROWS: gl.constexpr = 16
        CHUNKS: gl.constexpr = K // CHUNK
        pid_n = gl.program_id(0)
        pid_m = gl.program_id(1)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        copy: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [WARPS, 1], [1, 0])
        row_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
        smem_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        slab = gl.allocate_shared_memory(W.dtype.element_ty, [CHUNKS, BLOCK_N, CHUNK], smem_layout)
        # the weight does not depend on the kernel before: all of it is asked for now
        wn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, copy))
        wk = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, copy))
        w_ptr = W + wn.to(gl.int64)[:, None] * K + wk[None, :]
        for c in gl.static_range(CHUNKS):
            async_copy.async_copy_global_to_shared(slab.index(c), w_ptr + c * CHUNK)
        async_copy.commit_group()
        rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        if HAS_BIAS:
            bias = gl.load(B + rn).to(gl.float32)
        cols = gl.arange(0, ROW_BLOCK, layout=gl.SliceLayout(0, row_layout))
        col_ok = cols < K
        h_smem = slab  # unused without NORM
        if NORM:
            g = gl.load(G + cols, mask=col_ok, other=0.0).to(gl.float32)
            beta = gl.load(BETA + cols, mask=col_ok, other=0.0).to(gl.float32)
            # not swizzled: read back in column chunks, which a swizzled layout cannot be sliced into
            rows_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
            h_smem = gl.allocate_shared_memory(X.dtype.element_ty, [ROWS, ROW_BLOCK], rows_layout)
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        rm = pid_m * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, a_layout))
        rk = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, a_layout))
        row_ok = rm < M
        x_ptr = X + rm.to(gl.int64)[:, None] * K + rk[None, :]
        if NORM:
            _norm_rows(X, Y, OUT_X, h_smem, g, beta, cols, col_ok, M, pid_m, pid_n, eps, N_NORM, K, ADD, ROWS,
                       WARPS, row_layout)  # fmt: skip
        async_copy.wait_group(0)
        gl.thread_barrier()
        # chunk c into accumulator c % 2, each from zero and in order, added at the end: invariant_ops' sums
        acc0 = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=mma)
        acc1 = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=mma)
        for c in gl.static_range(CHUNKS):
            a = _x_chunk(x_ptr, row_ok, h_smem, c, NORM, a_layout)
            if c % 2 == 0:
                acc0 = _chunk_mma(a, slab.index(c), acc0, b_layout)
            else:
                acc1 = _chunk_mma(a, slab.index(c), acc1, b_layout)
        acc = acc0 + acc1
        if HAS_BIAS:
            acc += bias[None, :]
        if GELU:  # invariant_ops' epilogue, operation for operation
            acc = acc / (1.0 + gl.exp(-1.5957691216057308 * (acc + 0.044715 * acc * acc * acc)))
        if ROUND:
            acc = acc.to(X.dtype.element_ty).to(gl.float32)
        om = pid_m * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
        o_ptr = OUT + om.to(gl.int64)[:, None] * s_om + rn[None, :]
        gl.store(o_ptr, acc.to(OUT.dtype.element_ty), mask=(om < M)[:, None] & (rn < n_valid)[None, :])

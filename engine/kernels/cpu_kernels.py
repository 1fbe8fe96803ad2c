"""Native CPU kernels for a decode step (csrc/cpu_decode.c), built on first use and loaded with ctypes.

Why: on a CPU, a decode step is a chain of few-row products and two attentions, bound by memory bandwidth, and
torch runs them on one core (MKL's single-row products) or well below the bandwidth (SDPA over the cross-attention
cache). The kernels split every product and every head over both cores (tiny.en on the 2-core test machine:
`python benchmarks/cpu_decode_step.py`, against the same with `--no-cpu-kernels`). With several sequences in a
step only the attentions run here, one task per (row, head): MKL's products of several rows already share each
weight read. Whatever they cannot do (other dtypes, odd shapes) stays in torch.

The library is compiled once with the system C compiler into a per-user cache (`$WHISPER_KERNEL_CACHE`, else
~/.cache/whisper-server; a content hash in the file name, so a changed source builds anew) and linked against the
OpenMP runtime that torch has already loaded, so the kernels reuse torch's thread team. Without a compiler, off
x86-64 or without AVX2, `load()` returns None and the decoder runs in torch alone; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "cpu_decode.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC")
HEAD_DIM = 64  # the attention kernel's head size: every Whisper model's
COLS = 64  # the product kernel's output columns per task: outputs must be a multiple


def cache_dir() -> Path:
    if os.environ.get("WHISPER_KERNEL_CACHE"):
        return Path(os.environ["WHISPER_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "whisper-server"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def torch_openmp_library() -> str | None:
    """The OpenMP runtime torch has loaded (its wheels bundle one, possibly under a hashed name). The kernels
    link against that file, so that loading them adds no second runtime, whose threads would compete with
    torch's for the same cores. Other libraries may have brought their own (CTranslate2 does): torch's is the
    one under its package directory, else the only one mapped."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    libs = sorted({line.split()[-1] for line in maps.splitlines() if "libgomp" in line or "libiomp" in line})
    torch_dir = str(Path(torch.__file__).resolve().parent) + os.sep
    own = [lib for lib in libs if lib.startswith(torch_dir)]
    return own[0] if own else libs[0] if len(libs) == 1 else None


def _target(openmp: str | None) -> Path:
    key = SOURCE.read_bytes() + " ".join((*FLAGS, str(openmp))).encode()
    return cache_dir() / f"cpu_decode-{hashlib.sha256(key).hexdigest()[:16]}.so"


def _build(compiler: str, openmp: str | None, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # built under a temporary name and renamed: a concurrent start-up never loads a half-written file
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, lib = Path(tmp) / "cpu_decode.o", Path(tmp) / "cpu_decode.so"
        runtime = [openmp] if openmp else ["-fopenmp"]
        for cmd in ([compiler, *FLAGS, "-c", str(SOURCE), "-o", str(obj)],
                    [compiler, "-shared", str(obj), *runtime, "-lm", "-o", str(lib)]):  # fmt: skip
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(lib, target)


@functools.cache
def load() -> CpuKernels | None:
    """The kernels, or None (with the reason logged) where they cannot be built or would not run."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        log.info("native CPU decode kernels: not on %s (x86-64 only); decoding with torch alone", platform.machine())
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        log.info("native CPU decode kernels: this CPU has no AVX2; decoding with torch alone")
        return None
    openmp = torch_openmp_library()
    target = _target(openmp)
    try:
        if not target.exists():  # built before (a Docker image builds it at image build time): no compiler needed
            compiler = _compiler()
            if compiler is None:
                log.warning("native CPU decode kernels: no C compiler (cc/gcc, or $CC) found; decoding with torch "
                            "alone (~20%% slower per token)")  # fmt: skip
                return None
            _build(compiler, openmp, target)
        return CpuKernels(ctypes.CDLL(str(target)))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        log.warning("native CPU decode kernels: build or load failed, decoding with torch alone: %s", detail.strip())
        return None


def quantize_columns(weight_t: Tensor) -> tuple[Tensor, Tensor]:
    """weight_t (in, out) -> int8 values (in, out) and a float32 scale per output (out,), CTranslate2's int8
    scheme: per output the scale is its largest magnitude over 127."""
    w = weight_t.float()
    scales = w.abs().amax(dim=0) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return torch.round(w / scales).clamp(-127, 127).to(torch.int8), scales.contiguous()


def column_blocks(weight_t: Tensor) -> Tensor:
    """(in, out) -> the kernels' blocked view (out / COLS, in, COLS): each task's COLS outputs for every input."""
    k, n = weight_t.shape
    return weight_t.reshape(k, n // COLS, COLS).transpose(0, 1)


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear weight as int8 with a scale per output, CTranslate2's int8 scheme: per output the scale is its
    largest magnitude over 127, so the weights of an int8 checkpoint, dequantized at load, quantize back to exactly
    their stored integers. `blocks` holds the integers the way the kernels stream them, each task's COLS outputs
    contiguous (cpu_decode.c): (out / COLS, in, COLS), or for the integer dot products (`sums` given) interleaved
    by four inputs, (out / COLS, in / 4, COLS, 4); `scales` (out,) float32; `sums` (out,) int32 each output's sum
    of integers; weight = dense() * scales."""

    blocks: Tensor
    scales: Tensor
    sums: Tensor | None = None

    @classmethod
    def of(cls, weight_t: Tensor, columns: int | None = None, interleave: bool = False) -> QuantizedWeight:
        """weight_t: (in, out); the outputs are padded with zero columns to `columns` (a multiple of COLS), by
        default to the next multiple of COLS. interleave: the integer dot products' layout (in % 4 == 0)."""
        w = weight_t.float()
        columns = columns if columns is not None else -(-w.shape[1] // COLS) * COLS
        if columns % COLS:
            raise ValueError(f"int8 weights need a multiple of {COLS} outputs, got {columns}")
        if columns > w.shape[1]:
            w = torch.cat([w, w.new_zeros(w.shape[0], columns - w.shape[1])], dim=1)
        values, scales = quantize_columns(w)
        k = w.shape[0]
        blocks = column_blocks(values)
        if not interleave:
            return cls(blocks.contiguous(), scales)
        if k % 4:
            raise ValueError(f"the integer dot products need a multiple of 4 inputs, got {k}")
        blocks = blocks.reshape(columns // COLS, k // 4, 4, COLS).transpose(2, 3).contiguous()
        return cls(blocks, scales, values.sum(dim=0, dtype=torch.int32))

    @property
    def shape(self) -> tuple[int, int]:
        """(in, out), out padded to a multiple of COLS"""
        inputs = self.blocks.shape[1] * (4 if self.sums is not None else 1)
        return inputs, self.blocks.shape[0] * COLS

    def dense(self) -> Tensor:
        """The integers as an (in, out) input-major matrix (a copy)."""
        blocks = self.blocks
        if self.sums is not None:
            blocks = blocks.transpose(2, 3).reshape(blocks.shape[0], -1, COLS)
        return blocks.transpose(0, 1).reshape(self.shape).contiguous()


@dataclass(frozen=True)
class BlockedWeight:
    """A float32 linear weight laid out as the kernels stream it fastest, each task's COLS outputs contiguous for
    every input: `blocks` (out / COLS, in, COLS), as QuantizedWeight's integers are. The products sum the same
    terms in the same order as from the input-major (in, out) transpose, so their outputs are bitwise the same."""

    blocks: Tensor

    @classmethod
    def of(cls, weight_t: Tensor) -> BlockedWeight:
        """weight_t: (in, out) float32, out a multiple of COLS."""
        n = weight_t.shape[1]
        if n % COLS:
            raise ValueError(f"blocked weights need a multiple of {COLS} outputs, got {n}")
        return cls(column_blocks(weight_t.float()).contiguous())

    @property
    def shape(self) -> tuple[int, int]:
        """(in, out)"""
        return self.blocks.shape[1], self.blocks.shape[0] * COLS


def _norm_args(norm: nn.LayerNorm | None) -> tuple[int | None, int | None, float]:
    """A kernel's LayerNorm arguments: weight and bias pointers and eps, or none."""
    if norm is None:
        return None, None, 0.0
    return norm.weight.data_ptr(), norm.bias.data_ptr(), norm.eps


class CpuKernels:
    """Typed wrappers around the two kernels; `supports_*` say whether a tensor suits them (the caller then
    takes the torch path instead), the wrappers themselves do not check. They run on torch's thread count, or on
    the count `team` sets for the calling thread (cpu_team.py)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self._team = threading.local()  # one object serves every engine of a process, each on its own thread
        p, i = ctypes.c_void_p, ctypes.c_int
        lib.whisper_gemv.argtypes = [p, p, p, ctypes.c_float, p, p, p, p, i, i, i, i, i]
        lib.whisper_gemv.restype = None
        lib.whisper_gemv_q8.argtypes = [p, p, p, ctypes.c_float, p, p, p, p, p, i, i, i, i]
        lib.whisper_gemv_q8.restype = None
        lib.whisper_gemm_rows.argtypes = [p, p, p, ctypes.c_float, p, p, p, p, p, p, i, i, i, i, i, p, i]
        lib.whisper_gemm_rows.restype = None
        lib.whisper_gemm_q8_vnni.argtypes = [p, p, p, ctypes.c_float, p, p, p, p, p, p, i, i, i, i, p, p, i]
        lib.whisper_gemm_q8_vnni.restype = None
        lib.whisper_gemm_q8_avx2.argtypes = lib.whisper_gemm_q8_vnni.argtypes
        lib.whisper_gemm_q8_avx2.restype = None
        lib.whisper_has_vnni.restype = lib.whisper_has_avx2.restype = ctypes.c_int
        self.vnni = bool(lib.whisper_has_vnni())  # this CPU has AVX-512 VNNI
        # The form the integer dot products run in (QuantizedWeight with `sums`): "vnni", else "avx2", the same
        # outputs bit for bit (cpu_decode.c) in more instructions; None where neither runs. Settable, for an A/B of
        # the two forms on a CPU with VNNI.
        self.dot_form: str | None = "vnni" if self.vnni else "avx2" if lib.whisper_has_avx2() else None
        lib.whisper_attend_one.argtypes = [p, p, p, p, i, i, ctypes.c_long, ctypes.c_float, p, i]
        lib.whisper_attend_one.restype = None
        lib.whisper_attend_rows.argtypes = [p, p, p, p, i, i, i, p, p, p, ctypes.c_long, ctypes.c_long, ctypes.c_float, p, i]  # fmt: skip
        lib.whisper_attend_rows.restype = None

    @property
    def int8_dot(self) -> bool:
        """Whether this CPU runs the integer dot products (with VNNI, or their AVX2 form)."""
        return self.dot_form is not None

    def threads(self) -> int:
        return getattr(self._team, "size", 0) or torch.get_num_threads()

    @contextmanager
    def team(self, size: int) -> Iterator[None]:
        """The calling thread's kernels run on `size` threads inside the block."""
        before = getattr(self._team, "size", 0)
        self._team.size = size
        try:
            yield
        finally:
            self._team.size = before

    @staticmethod
    def supports_linear(weight_t: Tensor) -> bool:
        """weight_t: the (in, out) transpose of a linear weight, which must be contiguous (input-major storage)."""
        return weight_t.dtype == torch.float32 and weight_t.is_contiguous() and weight_t.shape[1] % COLS == 0

    def linear(
        self,
        x: Tensor,
        weight_t: Tensor | BlockedWeight,
        bias: Tensor | None,
        residual: Tensor | None = None,
        norm: nn.LayerNorm | None = None,
        gelu: bool = False,
    ) -> Tensor:
        """gelu?(norm?(x) @ weight_t + bias) (+ residual) for one row; x (..., in) contiguous, residual shaped like
        the output, norm a LayerNorm over the input (float32 weight and bias); weight_t (in, out) input-major, or
        its BlockedWeight."""
        blocked = isinstance(weight_t, BlockedWeight)
        values = weight_t.blocks if blocked else weight_t
        k, n = weight_t.shape
        y = torch.empty(*x.shape[:-1], n)
        ln_w, ln_b, eps = _norm_args(norm)
        self.lib.whisper_gemv(
            x.data_ptr(), ln_w, ln_b, eps, values.data_ptr(), bias.data_ptr() if bias is not None else None,
            residual.data_ptr() if residual is not None else None, y.data_ptr(), k, n, int(gelu), int(blocked),
            self.threads(),
        )  # fmt: skip
        return y

    def linear_q8(
        self,
        x: Tensor,
        weight: QuantizedWeight,
        bias: Tensor | None,
        residual: Tensor | None = None,
        norm: nn.LayerNorm | None = None,
        gelu: bool = False,
    ) -> Tensor:
        """linear() with int8 weights (QuantizedWeight: blocked int8 and a scale per output column)."""
        if weight.sums is not None:
            return self._dot_q8(x, weight, bias, residual, norm, gelu)
        k, n = weight.shape
        y = torch.empty(*x.shape[:-1], n)
        ln_w, ln_b, eps = _norm_args(norm)
        self.lib.whisper_gemv_q8(
            x.data_ptr(), ln_w, ln_b, eps, weight.blocks.data_ptr(), weight.scales.data_ptr(),
            bias.data_ptr() if bias is not None else None, residual.data_ptr() if residual is not None else None,
            y.data_ptr(), k, n, int(gelu), self.threads(),
        )  # fmt: skip
        return y

    def linear_rows(
        self,
        x: Tensor,
        weight: Tensor | BlockedWeight | QuantizedWeight,
        bias: Tensor | None,
        residual: Tensor | None = None,
        norm: nn.LayerNorm | None = None,
        gelu: bool = False,
    ) -> Tensor:
        """gelu?(norm?(x[r]) @ W + bias) (+ residual[r]) for every row of x (rows, in), each weight read once for
        all of them; W: the (in, out) input-major transpose of a float32 weight, its BlockedWeight, or a
        QuantizedWeight."""
        quantized, blocked = isinstance(weight, QuantizedWeight), isinstance(weight, BlockedWeight)
        if quantized and weight.sums is not None:
            return self._dot_q8(x, weight, bias, residual, norm, gelu)
        values = weight.blocks if quantized or blocked else weight
        rows, (k, n) = x.shape[0], weight.shape
        y = torch.empty(rows, n)
        ln_w, ln_b, eps = _norm_args(norm)
        scratch = torch.empty(rows, k) if norm is not None else None  # the normalized rows
        self.lib.whisper_gemm_rows(
            x.data_ptr(), ln_w, ln_b, eps, None if quantized else values.data_ptr(),
            values.data_ptr() if quantized else None, weight.scales.data_ptr() if quantized else None,
            bias.data_ptr() if bias is not None else None, residual.data_ptr() if residual is not None else None,
            y.data_ptr(), rows, k, n, int(gelu), int(blocked), scratch.data_ptr() if scratch is not None else None,
            self.threads(),
        )  # fmt: skip
        return y

    def _dot_q8(
        self, x: Tensor, weight: QuantizedWeight, bias: Tensor | None, residual: Tensor | None,
        norm: nn.LayerNorm | None, gelu: bool,
    ) -> Tensor:  # fmt: skip
        """The rows of x (..., in), contiguous, through interleaved int8 weights with the integer dot products (each
        row quantized to int8 with a scale of its own), in `dot_form`; (..., out). x is not reshaped: at a decode
        step's sizes each torch call costs about as long as a product's arithmetic."""
        k, n = weight.shape
        rows = x.numel() // k
        y = torch.empty(*x.shape[:-1], n)
        ln_w, ln_b, eps = _norm_args(norm)
        scratch = torch.empty(rows, k) if norm is not None else None  # the normalized rows
        vnni = self.dot_form == "vnni"
        xq = torch.empty(rows, k, dtype=torch.uint8 if vnni else torch.int16)  # the quantized rows
        product = self.lib.whisper_gemm_q8_vnni if vnni else self.lib.whisper_gemm_q8_avx2
        product(
            x.data_ptr(), ln_w, ln_b, eps, weight.blocks.data_ptr(), weight.scales.data_ptr(), weight.sums.data_ptr(),
            bias.data_ptr() if bias is not None else None, residual.data_ptr() if residual is not None else None,
            y.data_ptr(), rows, k, n, int(gelu), scratch.data_ptr() if scratch is not None else None, xq.data_ptr(),
            self.threads(),
        )  # fmt: skip
        return y

    def attend_one(self, q: Tensor, k: Tensor, v: Tensor, n: int) -> Tensor:
        """q (heads, 64) contiguous against the first n positions of k, v (heads, positions, 64): each head's
        positions contiguous, the same head stride for both; returns (heads, 64)."""
        heads = q.shape[0]
        out = torch.empty(heads, HEAD_DIM)
        scratch = torch.empty(heads * n)
        self.lib.whisper_attend_one(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), heads, n, k.stride(0), HEAD_DIM**-0.5,
            scratch.data_ptr(), self.threads(),
        )  # fmt: skip
        return out

    def attend_rows(
        self, q: Tensor, k: Tensor, v: Tensor, n: int, positions: Tensor | None = None,
        cross_slots: Tensor | None = None, lengths: Tensor | None = None,
    ) -> Tensor:  # fmt: skip
        """Row r of the batch against slot r of k, v (slots, heads, positions, 64), or slot cross_slots[r] (an int64
        tensor) when given; returns (rows, heads * 64).
        Cross-attention: q (rows, heads * 64) against the first n positions of each slot, or of slot s the first
        lengths[s] (int64, each at most n) when given. Self-attention: q is the
        fused (rows, 3 * heads * 64) q/k/v projection and positions (rows,) int64 each row's position p; the row's
        new key and value are written there and it attends over 0..p (n: the slots' capacity)."""
        rows, heads = q.shape[0], k.shape[1]
        out = torch.empty(rows, heads * HEAD_DIM)
        scratch = torch.empty(rows * heads * n)
        self.lib.whisper_attend_rows(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), rows, heads, n,
            positions.data_ptr() if positions is not None else None,
            cross_slots.data_ptr() if cross_slots is not None else None,
            lengths.data_ptr() if lengths is not None else None, k.stride(0), k.stride(1), HEAD_DIM**-0.5,
            scratch.data_ptr(), self.threads(),
        )  # fmt: skip
        return out

    @staticmethod
    def supports_attention(k: Tensor, v: Tensor) -> bool:
        """k, v: (..., positions, 64) with rows of 64 floats and the same strides (a cache tensor or one slot's)."""
        return (
            k.dtype == v.dtype == torch.float32
            and k.shape[-1] == HEAD_DIM
            and k.stride()[-2:] == (HEAD_DIM, 1)
            and v.stride() == k.stride()
        )

"""KernelOptions: which kernels a backend uses, as one object passed down from EngineConfig.

Every switch defaults to the choice measured fastest (the table in BENCHMARKS.md); the others exist so that a
benchmark or a test can run the alternative in the same process for an A/B comparison, by passing another
KernelOptions, never by patching a module.
"""

from __future__ import annotations

from dataclasses import dataclass

INT8_ATTENTION_KERNELS = ("cuda", "triton")


@dataclass(frozen=True, slots=True)
class KernelOptions:
    # Programmatic dependent launch of the one-row kernels on Hopper and later: a kernel reads its weights while
    # the one before it still runs (kernels/fused_ops.py).
    pdl: bool = True
    # A lone sequence's GPU step with each sub-layer's residual add, layer norm and first product in one kernel
    # (kernels/fused_ops.py add_norm_linear).
    norm_product: bool = True
    # The int8 cross-attention kernel: "cuda" (NVRTC, falling back to Triton where it does not build) or "triton".
    int8_attention: str = "cuda"
    # A lone row's int8 cross-attention in the kernel that prefetches its keys before waiting (needs pdl).
    int8_lone_row: bool = True
    # A greedy step's token and log-probability in one pass over the logits on a GPU (kernels/greedy_pick.py).
    greedy_pick: bool = True
    # The native CPU decode kernels (kernels/cpu_kernels.py) where they build; off: torch alone.
    cpu_decode: bool = True
    # The decode products read int8 weights (a scale per output: CTranslate2's scheme) instead of float32 ones, a
    # quarter of the bytes, and the encoder's run as integer products. Set by dtype int8 (EngineConfig.dtype, the
    # default for an int8 checkpoint on a CPU); exact for an int8 checkpoint's weights up to rounding.
    cpu_int8_weights: bool = False
    # With them, several sequences' decode products too (each weight read once for all rows) instead of torch's.
    cpu_decode_rows: bool = True
    # With them, integer dot products: each row quantized to int8 as well (a scale per row, as CTranslate2 does),
    # one instruction for 64 multiply-adds with AVX-512 VNNI, else their AVX2 form (the same outputs, 7 for 32); off:
    # the int8 weights widened to floats (12 for 32).
    cpu_int8_dot: bool = True
    # A decode step's native kernels on the full thread team or on one thread, whichever recent steps ran faster
    # (kernels/cpu_team.py: one wins beside a competing load); off: always the full team.
    cpu_adaptive_team: bool = True
    # On a GPU, kernels whose results for a row do not depend on the batch (engine/backends/gpu_invariant.py):
    # a request's tokens are the same whatever else runs. Its cost is in BENCHMARKS.md; of the switches above that
    # concern a lone row's GPU kernels only pdl applies with it (norm_product and int8_lone_row do not).
    batch_invariant: bool = False
    # With it, a few rows' products in the kernel that copies its weight into shared memory before waiting for the
    # kernel before it (kernels/invariant_few_rows.py; the same sums as the tile kernel, which serves otherwise).
    # Off: measured, a lone window's step is no faster with it (BENCHMARKS.md, batch-invariant kernels).
    invariant_few_rows: bool = False

    def __post_init__(self) -> None:
        if self.int8_attention not in INT8_ATTENTION_KERNELS:
            raise ValueError(f"int8_attention must be one of {INT8_ATTENTION_KERNELS}, got {self.int8_attention!r}")


DEFAULT_KERNELS = KernelOptions()

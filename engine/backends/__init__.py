"""Decode backends: how a device runs the model, chosen once at start-up (select_backend).

- base.py: DecodeBackend, the model as written (masked steps over a bucket of positions).
- cpu.py: CpuTorchBackend (weight layouts a CPU streams fast) and CpuNativeBackend (the native decode kernels).
- gpu.py: GpuBackend (one-kernel self-attention, a lone row's fused sub-layers, an aligned output projection).
- gpu_invariant.py: BatchInvariantGpuBackend (every row computed the same way whatever the batch).
- cpu_int8_encoder.py: Int8Blocks, the encoder's products in int8 on a CPU (dtype int8).
- cpu_memory.py: glibc heap settings for large CPU tensors.

May import engine.model and engine.kernels; nothing here knows about requests, sequences or the scheduler.
"""

from __future__ import annotations

import logging

import torch

from engine.backends.base import KV_BUCKET, DecodeBackend
from engine.backends.cpu import CpuNativeBackend, CpuTorchBackend, lay_out_for_cpu, native_kernels_fit
from engine.backends.gpu import GpuBackend
from engine.backends.gpu_invariant import BatchInvariantGpuBackend
from engine.kernels import cpu_kernels, fp8
from engine.kernels.options import KernelOptions
from engine.model.whisper import Whisper

log = logging.getLogger(__name__)

__all__ = ["KV_BUCKET", "DecodeBackend", "select_backend"]


def select_backend(
    model: Whisper, device: torch.device, dtype: torch.dtype, int8_cross: bool, kernels: KernelOptions,
    encoder_fp8: bool = False,
) -> DecodeBackend:
    """The backend for this device, the model's weights laid out for it. The decoder's q/k/v are fused first
    (every decode path reads them as one product; input-major on a CPU)."""
    on_cpu = device.type == "cpu"
    if encoder_fp8:
        why = fp8.unsupported_reason(device, dtype)
        if why is not None:
            raise ValueError(f"encoder_precision float8: {why}; use encoder_precision model")
    model.decoder.kernels = kernels
    model.decoder.fuse_qkv(input_major=on_cpu)
    if not on_cpu:
        gpu = BatchInvariantGpuBackend if kernels.batch_invariant else GpuBackend
        backend: DecodeBackend = gpu(model, kernels, dtype, device, encoder_fp8)
    else:
        if kernels.batch_invariant:
            log.info("batch_invariant: a GPU mode; the CPU backends have none of the batch-dependent GPU kernels")
        native = cpu_kernels.load() if kernels.cpu_decode and dtype == torch.float32 else None
        chunks = lay_out_for_cpu(model.decoder, native is not None)
        if native is not None and native_kernels_fit(model.decoder, native, dtype, int8_cross):
            backend = CpuNativeBackend(model, kernels, chunks, native)
        else:
            backend = CpuTorchBackend(model, kernels, chunks)
            if kernels.cpu_int8_weights:
                log.warning(
                    "int8 decode weights need the native CPU kernels, which did not build here: the decoder's "
                    "products run in float32 (the encoder's stay int8)"
                )
    log.info("decode backend: %s%s", backend.name, ", int8 weights" if getattr(backend, "int8", None) else "")
    return backend

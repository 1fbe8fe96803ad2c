"""DecodeBackend: how a device runs the decoder's steps, prompt passes and output projection.

The base class is the model as written (engine/model/whisper.py): a step attends over a bucket of positions
under a mask. Subclasses (cpu.py, gpu.py) replace what their device runs faster; select_backend picks one at
start-up, so a step never asks which path to take.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kernels.options import KernelOptions
from engine.model.kv_cache import KVCache
from engine.model.lora import Adapters
from engine.model.whisper import Whisper

KV_BUCKET = 64  # a masked step attends over a multiple of this many positions: few shapes, so kernels are reused


class DecodeBackend:
    """The decoder's device-specific half. Rows of a step live in slots 0..batch-1 of the cache."""

    name = "torch"
    # Whether a step's rows each attend their own prefix, whatever kv_len says (no mask is built): then one CUDA
    # graph per batch size serves every context length.
    reads_own_prefix = False
    # Whether a row's results are the same whatever else the step holds, by construction (gpu_invariant.py)
    batch_invariant = False
    # Whether a window's rows attend to the positions its short context filled (DecodeOptions.context_margin_s;
    # KVCache.cross_len). Else (the GPU kernels read whole slots) a short context is padded to a divisor of the
    # slot's positions and copies of it fill the slot (TextDecoder.fill_cross_cache `tile`), the same attention.
    short_context = True

    def __init__(self, model: Whisper, kernels: KernelOptions):
        self.model = model
        self.decoder = model.decoder
        self.kernels = kernels
        self.adapters: Adapters | None = None  # use_adapters
        self.adapter_names: dict[int, str | tuple[str, ...]] = {}

    def use_adapters(self, adapters: Adapters, names: dict[int, str | tuple[str, ...]]) -> None:
        """The LoRA adapters whose deltas the backend's own step paths add, beside the layer operations the model's
        passes go through (engine/model/lora.py); `names`: each product weight's adapter name, by id()."""
        self.adapters, self.adapter_names = adapters, names

    @property
    def adapted(self) -> bool:
        """Whether a row of the pass being run uses a LoRA adapter."""
        return self.adapters is not None and self.adapters.active

    def encode(self, mel: Tensor) -> Tensor:
        """mel (batch, n_mels, 3000) -> audio features (batch, n_audio_ctx, n_audio_state)"""
        return self.model.encoder(mel)

    def decode_step(
        self, tokens: Tensor, positions: Tensor, cache: KVCache, kv_len: int, slot_start: int = 0
    ) -> Tensor:
        """One token per row: tokens, positions (batch, 1), kv_len >= every position + 1 (a bucket). Writes the
        rows' K/V and returns hidden states (batch, 1, n_text_state). What a CUDA graph captures."""
        mask = (torch.arange(kv_len, device=tokens.device) <= positions[:, :, None])[:, None]
        return self.decoder(tokens, positions, cache, slot_start, kv_len, mask)

    def eager_step(
        self, tokens: Tensor, positions: Tensor, cache: KVCache, host_positions: list[int], slot_start: int = 0
    ) -> Tensor:
        """decode_step outside a graph; `host_positions` are the same positions as known to the host."""
        kv_len = min(-(-(max(host_positions) + 1) // KV_BUCKET) * KV_BUCKET, cache.shape.n_text_ctx)
        return self.decode_step(tokens, positions, cache, kv_len, slot_start)

    def eager_logits(self, tokens: Tensor, positions: Tensor, cache: KVCache, host_positions: list[int]) -> Tensor:
        """A step outside a graph through to its last position's logits (rows, n_vocab)."""
        return self.logits(self.eager_step(tokens, positions, cache, host_positions)[:, -1])

    def prompt_pass(self, tokens: Tensor, cache: KVCache, slot_start: int) -> Tensor:
        """Prompts (batch, width) from position 0 into slots slot_start..: hidden states (batch, width, n_state)."""
        return self.decoder.prompt_pass(tokens, cache, slot_start)

    def logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        """(..., n_text_state) -> float32 (..., n_vocab), contiguous; into `out` (a graph's static buffer) when
        given, saving a pass over them."""
        logits = self.projection(hidden)
        if out is None:  # a padded product's slice or a float16 result: one pass makes it contiguous float32
            return logits.float().contiguous()
        return out.copy_(logits)  # the cast and the slice's gather in the same pass

    def projection(self, hidden: Tensor) -> Tensor:
        """hidden @ token_embedding.T in whatever dtype and layout the device produces it."""
        return F.linear(hidden, self.decoder.token_embedding.weight)

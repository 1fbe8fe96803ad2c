"""The GPU backend: a step's self-attention in one kernel, a lone sequence's step in fused kernels, an output
projection whose rows start aligned.

A decode step on a GPU is hundreds of small kernels. With Triton:
- every row's K/V write and self-attention run in one kernel (engine/kernels/decode_attention.py) that reads the
  row's own prefix, so a step needs no mask and one CUDA graph per batch size serves every context length;
- a lone sequence (one row) is bound by kernel count, not bytes: each sub-layer's residual add, layer norm and
  first product run in one kernel (kernels/fused_ops.py add_norm_linear), one kernel fewer per sub-layer,
  and the one-row kernels start as programmatic dependents of the kernel before them (KernelOptions.pdl);
- its vocabulary projection is one kernel with a float32 output (one_row_logits).
Without Triton a step attends over a bucket of positions under a mask, as the model is written; from
UNFUSED_SELF_ATTENTION_ROWS rows as two batched products and a softmax, which stream the cache faster than SDPA's
fused kernel with one query per row.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.backends.base import DecodeBackend
from engine.kernels import decode_attention
from engine.kernels.fp8 import MODEL_DTYPE_BLOCKS, Fp8Blocks
from engine.kernels.fused_ops import (
    add_norm,
    add_norm_linear,
    gelu,
    linear,
    linear_gelu,
    linear_into,
    norm,
    norm_product_applies,
    one_row_logits,
)
from engine.kernels.options import KernelOptions
from engine.model.kv_cache import KVCache
from engine.model.layer_ops import LayerOps
from engine.model.whisper import NEG_INF, Whisper, indexed_cross_attention

VOCAB_PADDING = 64  # rows of the output projection's weight: a multiple of this (pad_vocabulary)
# From this many rows a masked step's self-attention runs as two batched products and a softmax instead of SDPA:
# with one query per row the plain products stream the cache faster (`benchmarks/sdpa_backends.py`).
UNFUSED_SELF_ATTENTION_ROWS = 128


def decode_self_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """q (batch, heads, 1, dim) against the cached k/v (batch, heads, kv_len, dim); mask additive or None."""
    if q.shape[0] >= UNFUSED_SELF_ATTENTION_ROWS and q.shape[2] == 1 and mask is not None:
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5).add_(mask)
        return torch.matmul(scores.softmax(dim=-1), v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# The model's layer operations on a GPU: a residual add and its layer norm in one kernel, GELU in the product's
# epilogue, a lone row's products in one-row kernels (each falls back to torch where its kernel does not apply)
FUSED_OPS = LayerOps(
    add_norm=add_norm, norm=norm, linear=linear, linear_gelu=linear_gelu, gelu=gelu, linear_into=linear_into
)


class GpuBackend(DecodeBackend):
    name = "gpu"
    short_context = False  # the attention kernels and graphs read every position of a cross slot: tiled instead

    def __init__(
        self, model: Whisper, kernels: KernelOptions, cache_dtype: torch.dtype, device: torch.device, fp8: bool
    ):
        super().__init__(model, kernels)
        if fp8:  # before fusing: float8 blocks fuse their own q/k/v
            model.encoder.use_quantized(Fp8Blocks(model.encoder.blocks, MODEL_DTYPE_BLOCKS))
            torch.cuda.empty_cache()  # the float16 copies of those weights are gone; the memory plan comes next
        model.encoder.fuse_qkv()
        model.encoder.ops = model.decoder.ops = FUSED_OPS
        # the rows' cross slots read through their index on the device, so a captured graph serves any rows
        model.decoder.cross_attention = indexed_cross_attention
        self.output_weight = pad_vocabulary(model.decoder)
        dims = model.dims
        probe = torch.empty(1, 1, 1, dims.n_text_state // dims.n_text_head, dtype=cache_dtype, device=device)
        self.reads_own_prefix = decode_attention.cache_supported(probe)
        row = torch.empty(1, 1, model.dims.n_text_state, dtype=cache_dtype, device=device)
        # a lone row's sub-layers fused: half precision, widths the kernel tiles, the step kernel for attention
        qkv_weight = model.decoder.blocks[0].attn.qkv_weight
        self.lone_row_fits = self.reads_own_prefix and norm_product_applies(row, qkv_weight)
        self.fused_lone_row = kernels.norm_product and self.lone_row_fits
        self.name = "gpu (step kernel)" if self.reads_own_prefix else "gpu (masked steps)"

    def with_kernels(self, kernels: KernelOptions) -> GpuBackend:
        """This backend over the same weights with other kernel choices: an A/B comparison in one process."""
        other = copy.copy(self)
        other.kernels = kernels
        other.fused_lone_row = kernels.norm_product and self.lone_row_fits
        return other

    def decode_step(
        self, tokens: Tensor, positions: Tensor, cache: KVCache, kv_len: int, slot_start: int = 0
    ) -> Tensor:
        x = self.decoder.embed(tokens, positions)
        if tokens.shape[0] == 1 and self.fused_lone_row:
            return self._lone_row_step(x, cache, positions, slot_start)
        return self._rows_step(x, cache, positions, kv_len, slot_start)

    def prompt_pass(self, tokens: Tensor, cache: KVCache, slot_start: int) -> Tensor:
        if tokens.shape[1] == 1:  # prompts of one token (<|startoftranscript|> before detection): a step
            return self.decode_step(tokens, torch.zeros_like(tokens), cache, 1, slot_start)
        return super().prompt_pass(tokens, cache, slot_start)

    def _rows_step(self, x: Tensor, cache: KVCache, positions: Tensor, kv_len: int, slot_start: int = 0) -> Tensor:
        """x (b, 1, n_state) of rows in slots slot_start.. at `positions` (b, 1) -> hidden (b, 1, n_state)."""
        dec, pdl, b = self.decoder, self.kernels.pdl, x.shape[0]
        ops = dec.ops  # FUSED_OPS, with the rows' LoRA deltas where the engine has adapters
        slots = slice(slot_start, slot_start + b)
        mask = rows = None
        if not self.reads_own_prefix:
            rows = torch.arange(slot_start, slot_start + b, device=x.device)[:, None]
            mask = (torch.arange(kv_len, device=x.device) <= positions[:, :, None])[:, None]
            mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, NEG_INF)
        h = norm(dec.blocks[0].attn_ln, x)
        next_norms = [block.attn_ln for block in list(dec.blocks)[1:]] + [dec.ln]
        for i, (block, next_norm) in enumerate(zip(dec.blocks, next_norms)):
            attn = block.attn
            if self.reads_own_prefix:
                o = decode_attention.self_attention_step(
                    ops.qkv(attn, h), cache.self_k_layers[i], cache.self_v_layers[i], positions, slot_start, pdl
                )
            else:
                qkv = ops.qkv(attn, h).view(b, 1, 3, attn.n_head, cache.head_dim)
                cache.self_kv_layers[i][:, rows, :, positions] = qkv[:, :, 1:]
                k = cache.self_k_layers[i][slots, :, :kv_len]
                v = cache.self_v_layers[i][slots, :, :kv_len]
                o = attn.merge_heads(decode_self_attention(qkv[:, :, 0].transpose(1, 2), k, v, mask))
            x, h = add_norm(x, ops.linear(attn.out, o, pdl), block.cross_attn_ln)
            cross = block.cross_attn
            o = indexed_cross_attention(
                cross.split_heads(ops.linear(cross.query, h, pdl)), cache, i, slot_start, self.kernels
            )
            x, h = add_norm(x, ops.linear(cross.out, cross.merge_heads(o), pdl), block.mlp_ln)
            x, h = add_norm(x, block.feed_forward(h, ops, pdl), next_norm)
        return h

    def _lone_row_step(self, x: Tensor, cache: KVCache, positions: Tensor, slot: int = 0) -> Tensor:
        """One sequence's step, x (1, 1, n_state) -> hidden (1, 1, n_state): each sub-layer's residual add, norm
        and first product in one kernel. Same arithmetic as _rows_step up to the summation order inside
        products. A row on a LoRA adapter adds its deltas after each product (the adapters' kernels), reading the
        normalized row the fused kernel also writes; fc1's GELU then follows its delta."""
        pdl = self.kernels.pdl
        adapters = self.adapters if self.adapted else None
        names = self.adapter_names if adapters is not None else {}
        h = torch.empty_like(x) if adapters is not None else None  # each fused kernel's normalized row

        def delta(y: Tensor, weight: Tensor, inp: Tensor) -> Tensor:
            name = names.get(id(weight))
            return y if name is None else adapters.add_to(y, name, inp)

        y = None  # the last sub-layer's output, added to the residual stream x by the next fused kernel
        for i, block in enumerate(self.decoder.blocks):
            attn, cross, fc1, fc2 = block.attn, block.cross_attn, block.mlp[0], block.mlp[2]
            x, qkv = add_norm_linear(x, y, block.attn_ln, attn.qkv_weight, attn.qkv_bias, pdl=pdl, out_h=h)
            qkv = delta(qkv, attn.qkv_weight, h)
            k_cache, v_cache = cache.self_k_layers[i], cache.self_v_layers[i]
            o = decode_attention.self_attention_step(qkv, k_cache, v_cache, positions, slot, pdl)
            y = delta(linear(attn.out, o, pdl), attn.out.weight, o)
            x, q = add_norm_linear(x, y, block.cross_attn_ln, cross.query.weight, cross.query.bias, pdl=pdl, out_h=h)
            q = delta(q, cross.query.weight, h)
            o = cross.merge_heads(indexed_cross_attention(cross.split_heads(q), cache, i, slot, self.kernels))
            y = delta(linear(cross.out, o, pdl), cross.out.weight, o)
            adapted_fc1 = id(fc1.weight) in names
            x, f = add_norm_linear(
                x, y, block.mlp_ln, fc1.weight, fc1.bias, gelu=not adapted_fc1, pdl=pdl, out_h=h
            )  # fmt: skip
            if adapted_fc1:
                f = gelu(delta(f, fc1.weight, h))
            y = delta(linear(fc2, f, pdl), fc2.weight, f)
        return add_norm(x, y, self.decoder.ln)[1]

    def projection(self, hidden: Tensor) -> Tensor:
        weight = self.decoder.token_embedding.weight
        if hidden.numel() == weight.shape[1]:  # a lone sequence's step: one kernel, float32 out
            out = one_row_logits(hidden, weight, self.kernels.pdl)
            if out is not None:
                return out.view(*hidden.shape[:-1], weight.shape[0])
        return F.linear(hidden, self.output_weight)[..., : weight.shape[0]]


def pad_vocabulary(decoder, multiple: int = VOCAB_PADDING) -> Tensor:
    """The token embedding laid out as the first rows of a (multiple of `multiple`, n_state) weight, returned; the
    embedding becomes a view of it (no extra memory). The output projection's result rows then start 16-byte
    aligned: cuBLAS runs a 51,866-wide float16 output (rows 103,732 bytes apart) through slow unaligned kernels
    (`benchmarks/gpu_kernels.py`)."""
    weight = decoder.token_embedding.weight
    n_vocab, n_state = weight.shape
    padded = weight.new_zeros(-(-n_vocab // multiple) * multiple, n_state)
    padded[:n_vocab] = weight
    decoder.token_embedding.weight = torch.nn.Parameter(padded[:n_vocab], requires_grad=False)
    return padded

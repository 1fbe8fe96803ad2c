"""Whisper encoder and decoder; the decoder reads and writes per-slot KV caches in place."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernels import decode_attention
from engine.kernels.cpu_kernels import CpuKernels
from engine.kernels.fp8 import MODEL_DTYPE_BLOCKS, Fp8Linear
from engine.kernels.fused_ops import (
    add_norm,
    add_norm_fp8,
    add_norm_linear,
    linear,
    linear_gelu,
    norm,
    norm_product_applies,
    one_row_logits,
    quantize_rows,
)  # fmt: skip
from engine.kernels.int8_attention import dequantize, int8_attention, quantize_into
from engine.model.dims import ModelDimensions
from engine.model.kv_cache import KVCache

NEG_INF = float("-inf")
# From this many rows a GPU decode step's self-attention runs as two batched products and a softmax instead of
# SDPA: with one query per row, cuDNN's fused kernel reads the cache at ~1.7 TB/s at 256 rows, the plain
# products at ~2.7 TB/s (H200, large-v3 shapes, 128 positions, per layer: 96 -> 61 us at 256 rows, 51 -> 48 at
# 128, even at 64, and below that the fused kernel wins: 15 vs 23 us at 32).
UNFUSED_SELF_ATTENTION_ROWS = 128
VOCAB_PADDING = 64  # rows of the output projection's weight on a GPU: a multiple of this (TextDecoder.pad_vocabulary)


def decode_self_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """q (batch, heads, 1, dim) against the cached k/v (batch, heads, kv_len, dim); mask additive or None."""
    if q.is_cuda and q.shape[0] >= UNFUSED_SELF_ATTENTION_ROWS and q.shape[2] == 1 and mask is not None:
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5).add_(mask)
        return torch.matmul(scores.softmax(dim=-1), v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def cross_attention(q: Tensor, cache: KVCache, layer: int, slots: slice) -> Tensor:
    """q (batch, heads, t, dim) against the slots' encoder K/V, read where they live: no gather, no copy."""
    k, v, k_scale, v_scale = cache.cross_layer(layer, slots)
    if k_scale is not None:
        return int8_attention(q, k, k_scale, v, v_scale)
    return F.scaled_dot_product_attention(q, k, v)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def split_heads(self, x: Tensor) -> Tensor:
        """(batch, time, n_state) -> (batch, n_head, time, head_dim)"""
        b, t, _ = x.shape
        if t == 1:  # a decode step: the same layout in one view instead of two operations
            return x.view(b, self.n_head, 1, -1)
        return x.view(b, t, self.n_head, -1).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        if t == 1:
            return x.reshape(b, 1, -1)
        return x.transpose(1, 2).reshape(b, t, -1)

    def forward(self, x: Tensor) -> Tensor:
        """Full, unmasked self-attention (the encoder's)."""
        if hasattr(self, "qkv_weight"):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, self.n_head, -1).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        else:  # three products, their outputs viewed in place (qkv() would concatenate them: a copy)
            q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
        return self.out(self.merge_heads(F.scaled_dot_product_attention(q, k, v)))

    def qkv(self, x: Tensor) -> Tensor:
        """[q | k | v] of x along the last axis: one product once fuse_qkv has run, else three concatenated."""
        if hasattr(self, "qkv_weight"):
            return F.linear(x, self.qkv_weight, self.qkv_bias)
        return torch.cat([self.query(x), self.key(x), self.value(x)], dim=-1)

    def fuse_qkv(self, input_major: bool = False) -> None:
        """q, k and v as one product (qkv_weight, qkv_bias), which forward() and the decoder's step use.

        The separate projections become views of the fused weight, so no memory is added. `input_major` stores
        the fused weight transposed in memory (same values), the layout a CPU decode step streams fastest
        (see TextDecoder.prepare_for_cpu)."""
        d = self.query.weight.shape[0]
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        if input_major:
            weight = weight.t().contiguous().t()
        bias = torch.cat([self.query.bias, torch.zeros_like(self.query.bias), self.value.bias])
        self.register_buffer("qkv_weight", weight, persistent=False)
        self.register_buffer("qkv_bias", bias, persistent=False)
        for j, proj in enumerate((self.query, self.key, self.value)):
            proj.weight = nn.Parameter(weight[j * d : (j + 1) * d], requires_grad=False)
        self.query.bias = nn.Parameter(bias[:d], requires_grad=False)
        self.value.bias = nn.Parameter(bias[2 * d :], requires_grad=False)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, cross_attention: bool = False):
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head) if cross_attention else None
        self.cross_attn_ln = nn.LayerNorm(n_state) if cross_attention else None
        n_mlp = n_state * 4
        self.mlp = nn.Sequential(nn.Linear(n_state, n_mlp), nn.GELU(), nn.Linear(n_mlp, n_state))
        self.mlp_ln = nn.LayerNorm(n_state)

    def feed_forward(self, h: Tensor) -> Tensor:
        """The MLP on its normalized input (the residual add is the caller's, fused with the next norm)."""
        return linear(self.mlp[2], linear_gelu(self.mlp[0], h))


class AudioEncoder(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.conv1 = nn.Conv1d(dims.n_mels, dims.n_audio_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dims.n_audio_state, dims.n_audio_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", torch.empty(dims.n_audio_ctx, dims.n_audio_state))
        self.blocks = nn.ModuleList(
            ResidualAttentionBlock(dims.n_audio_state, dims.n_audio_head) for _ in range(dims.n_audio_layer)
        )
        self.ln_post = nn.LayerNorm(dims.n_audio_state)
        self.fp8: nn.ModuleList | None = None  # the products of blocks fp8_start.. in float8 (use_fp8)
        self.fp8_start = 0

    def use_fp8(self, model_dtype_blocks: int = MODEL_DTYPE_BLOCKS) -> None:
        """Run the products of all blocks but the first `model_dtype_blocks` in float8 from now on (engine/kernels/fp8.py);
        their float16 weights are freed."""
        self.fp8_start = min(model_dtype_blocks, len(self.blocks))
        products = []
        for block in list(self.blocks)[self.fp8_start :]:
            attn, mlp = block.attn, block.mlp
            products.append(nn.ModuleDict({
                "qkv": Fp8Linear.fuse([attn.query, attn.key, attn.value]),
                "out": Fp8Linear(attn.out.weight, attn.out.bias),
                "fc1": Fp8Linear(mlp[0].weight, mlp[0].bias),
                "fc2": Fp8Linear(mlp[2].weight, mlp[2].bias),
            }))  # fmt: skip
            del attn.query, attn.key, attn.value, attn.out, block.mlp
        self.fp8 = nn.ModuleList(products)

    def fuse_qkv(self) -> None:
        """Each float16/32 block's q, k and v as one product (MultiHeadAttention.fuse_qkv; float8 blocks fuse
        their own): one product of three times the width runs closer to the tensor cores' peak (H200, large-v3,
        `benchmarks/gpu_encoder.py`: 149.8 -> 148.9 ms per 32 windows, same output). Left off on a CPU, where it
        was not measured."""
        end = len(self.blocks) if self.fp8 is None else self.fp8_start
        for block in list(self.blocks)[:end]:
            block.attn.fuse_qkv()

    def forward(self, mel: Tensor) -> Tensor:
        """mel : (batch, n_mels, 3000) -> (batch, n_audio_ctx, n_audio_state)"""
        x = F.gelu(self.conv1(mel))
        # the residual stream must be (batch, time, channels) in memory, not a transposed view of the conv's
        # output: every later add, layer norm and linear would run strided (large-v3, batch 8 on an H200: 12 of
        # 49 ms went to slow strided adds and the copies before each linear)
        x = F.gelu(self.conv2(x)).transpose(1, 2).contiguous()
        x = x + self.positional_embedding
        blocks = list(self.blocks)
        end = len(blocks) if self.fp8 is None else self.fp8_start  # blocks in the model's dtype
        # each residual add is fused with the layer norm after it (engine/kernels/fused_ops.py), the last with ln_post
        h = norm(blocks[0].attn_ln, x)
        next_norms = [block.attn_ln for block in blocks[1:]] + [self.ln_post]
        for block, next_norm in zip(blocks[:end], next_norms[:end]):
            x, h = add_norm(x, block.attn(h), block.mlp_ln)
            x, h = add_norm(x, block.feed_forward(h), next_norm)
        return h if end == len(blocks) else self._blocks_fp8(x, h, blocks)

    def _blocks_fp8(self, x: Tensor, h: Tensor, blocks: list[ResidualAttentionBlock]) -> Tensor:
        """The blocks from fp8_start on, with float8 products: every product's input is quantized by the kernel
        that makes it (the add + norms, the GELU, the attention output's read), so float8 adds no pass over the
        rows. x is the residual stream entering block fp8_start, h its normalized copy."""
        b, t, n = x.shape
        heads = blocks[0].attn.n_head
        h, h_scale = quantize_rows(h.view(b * t, n))
        for i, p in enumerate(self.fp8, start=self.fp8_start):
            q, k, v = p["qkv"](h, h_scale).view(b, t, 3, heads, n // heads).unbind(2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            o, o_scale = quantize_rows(o.transpose(1, 2))
            x, h, h_scale = add_norm_fp8(x, p["out"](o, o_scale).view(b, t, n), blocks[i].mlp_ln)
            f, f_scale = quantize_rows(p["fc1"](h, h_scale), gelu=True)
            y = p["fc2"](f, f_scale).view(b, t, n)
            if i < len(blocks) - 1:
                x, h, h_scale = add_norm_fp8(x, y, blocks[i + 1].attn_ln)
        return add_norm(x, y, self.ln_post)[1]  # forward() calls this only when some block is in float8


class TextDecoder(nn.Module):
    """Decoder over a contiguous range of cache slots: batch row i uses slot `slot_start + i`."""

    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.token_embedding = nn.Embedding(dims.n_vocab, dims.n_text_state)
        self.positional_embedding = nn.Parameter(torch.empty(dims.n_text_ctx, dims.n_text_state))
        self.blocks = nn.ModuleList(
            ResidualAttentionBlock(dims.n_text_state, dims.n_text_head, cross_attention=True)
            for _ in range(dims.n_text_layer)
        )
        self.ln = nn.LayerNorm(dims.n_text_state)
        self.cpu_kernels: CpuKernels | None = None  # set by prepare_for_cpu when the native kernels load

    def fill_cross_cache(self, audio_features: Tensor, cache: KVCache, slot_start: int) -> None:
        """Project encoder output to cross-attention K/V once and store it in the slots."""
        slots = slice(slot_start, slot_start + audio_features.shape[0])
        for i, block in enumerate(self.blocks):
            attn = block.cross_attn
            k, v = attn.split_heads(attn.key(audio_features)), attn.split_heads(attn.value(audio_features))
            ck, cv, k_scale, v_scale = cache.cross_layer(i, slots)
            if k_scale is not None:
                quantize_into(k, ck, k_scale)
                quantize_into(v, cv, v_scale)
            else:
                ck.copy_(k)
                cv.copy_(v)

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: KVCache,
        slot_start: int,
        kv_len: int,
        attn_mask: Tensor | None,
        position: int | None = None,
    ) -> Tensor:
        """
        tokens, positions : (batch, q) — positions are absolute; K/V are written there in each slot
        kv_len : how many cache positions to attend over (>= max position + 1)
        attn_mask : (batch, 1, q, kv_len) bool, True where a query may attend; None attends over all kv_len
        position : set when every row decodes one token at this same position (an eager step on a CPU):
            the K/V write is then a plain slice copy instead of an indexed scatter
        returns hidden states (batch, q, n_text_state) after the final layer norm
        """
        b = tokens.shape[0]
        x = self.token_embedding(tokens) + self.positional_embedding[positions]
        if position is not None and tokens.shape == (1, 1) and self._kernels_apply(cache):
            return self._step_one(x, cache, slot_start, position)
        if tokens.shape[1] == 1 and b > 1 and not tokens.is_cuda and self._kernels_apply(cache):
            return self._step_rows(x, cache, slot_start, positions)
        slots = slice(slot_start, slot_start + b)
        # a GPU step of one token per row: K/V write and self-attention in one kernel (engine/kernels/decode_attention.py)
        step_kernel = position is None and decode_attention.applies(x, cache.self_k)
        attn0 = self.blocks[0].attn
        if step_kernel and b == 1 and hasattr(attn0, "qkv_weight") and norm_product_applies(x, attn0.qkv_weight):
            return self._step_gpu_row(x, cache, slot_start, positions)
        rows = None
        if step_kernel:
            attn_mask = None  # the kernel reads each row's own prefix
        else:
            if position is None:
                rows = torch.arange(slot_start, slot_start + b, device=tokens.device)[:, None]
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                # SDPA turns a boolean mask into an additive one on every call: 3 extra kernels in each layer
                # (large-v3, one sequence: 59 -> 21 us per self-attention on an H200). Convert it once per step.
                additive = torch.zeros(attn_mask.shape, dtype=x.dtype, device=x.device)
                attn_mask = additive.masked_fill_(~attn_mask, NEG_INF)
        # Layers are applied through their functions (norm, linear), not by calling the modules: on a CPU a decode
        # step is ~100 small operations and nn.Module.__call__ added ~11 us to each of ~40 (tiny.en, 2 cores:
        # 10.6 -> 10.1 ms per step, same values bit for bit). Each residual add is fused with the layer norm after
        # it (engine/kernels/fused_ops.py; the last one with the final norm), so h is always the next sub-layer's input.
        h = norm(self.blocks[0].attn_ln, x)
        next_norms = [block.attn_ln for block in list(self.blocks)[1:]] + [self.ln]  # (slicing a ModuleList builds one)
        for i, (block, next_norm) in enumerate(zip(self.blocks, next_norms)):
            # self-attention: write this step's K/V into the slot, then attend over the slot's prefix
            attn = block.attn
            if step_kernel:
                qkv = attn.qkv(h)
                o = decode_attention.self_attention_step(
                    qkv, cache.self_k_layers[i], cache.self_v_layers[i], positions, slot_start
                )
            else:
                qkv = attn.qkv(h).view(b, -1, 3, attn.n_head, cache.head_dim)  # (b, q, 3, heads, dim)
                kv_new = qkv[:, :, 1:]
                if position is not None:
                    cache.self_kv_layers[i][:, slots, :, position] = kv_new[:, 0].transpose(0, 1)
                else:
                    cache.self_kv_layers[i][:, rows, :, positions] = kv_new
                q = qkv[:, :, 0].transpose(1, 2)
                k = cache.self_k_layers[i][slots, :, :kv_len]
                v = cache.self_v_layers[i][slots, :, :kv_len]
                o = attn.merge_heads(decode_self_attention(q, k, v, attn_mask))
            x, h = add_norm(x, linear(attn.out, o), block.cross_attn_ln)
            cross = block.cross_attn
            o = cross_attention(cross.split_heads(linear(cross.query, h)), cache, i, slots)
            x, h = add_norm(x, linear(cross.out, cross.merge_heads(o)), block.mlp_ln)
            x, h = add_norm(x, block.feed_forward(h), next_norm)
        return h

    def prompt_pass(self, tokens: Tensor, cache: KVCache, slot_start: int) -> Tensor:
        """forward() over prompts (batch, width) from position 0, each token attending to itself and those before
        it: hidden states (batch, width, n_text_state). Prompts right-padded to one width attend to no padding."""
        width = tokens.shape[1]
        positions = torch.arange(width, device=tokens.device).expand(tokens.shape[0], width)
        causal = positions[:, None, :, None] >= positions[:, None, None, :]
        return self(tokens, positions, cache, slot_start, width, causal)

    def _step_gpu_row(self, x: Tensor, cache: KVCache, slot: int, positions: Tensor) -> Tensor:
        """forward() for a lone sequence's step on a GPU: each sub-layer's residual add, norm and first product in
        one kernel (fused_ops.add_norm_linear), 9 kernels per layer instead of 12. A single window's decode is
        bound by kernel count, not bytes (large-v3 on an H200: ~420 kernels per step, ~2 ms, against ~0.4 ms to
        read its weights). Same arithmetic as forward()'s path up to the summation order inside products."""
        slots = slice(slot, slot + 1)
        y = None  # the last sub-layer's output, added to the residual stream x by the next fused kernel
        for i, block in enumerate(self.blocks):
            attn, cross, fc1 = block.attn, block.cross_attn, block.mlp[0]
            x, qkv = add_norm_linear(x, y, block.attn_ln, attn.qkv_weight, attn.qkv_bias)
            k_cache, v_cache = cache.self_k_layers[i], cache.self_v_layers[i]
            o = decode_attention.self_attention_step(qkv, k_cache, v_cache, positions, slot)
            x, q = add_norm_linear(x, linear(attn.out, o), block.cross_attn_ln, cross.query.weight, cross.query.bias)
            o = cross.merge_heads(cross_attention(cross.split_heads(q), cache, i, slots))
            x, f = add_norm_linear(x, linear(cross.out, o), block.mlp_ln, fc1.weight, fc1.bias, gelu=True)
            y = linear(block.mlp[2], f)
        return add_norm(x, y, self.ln)[1]

    def _kernels_apply(self, cache: KVCache) -> bool:
        """Checked at every step, so on the cache's whole tensors (attributes, no new views); an int8 cross cache
        fails the dtype check."""
        k = self.cpu_kernels
        return (
            k is not None
            and k.supports_attention(cache.self_k, cache.self_v)
            and k.supports_attention(cache.cross_k, cache.cross_v)
        )

    def _step_one(self, x: Tensor, cache: KVCache, slot: int, position: int) -> Tensor:
        """forward() for one token of one sequence on a CPU, with the native kernels (engine/kernels/cpu_kernels.py):
        every product and attention spread over the cores, each layer norm, GELU and residual add inside a product:
        8 calls per layer instead of ~20 operations. The same arithmetic as the torch path; only the summation
        order inside dot products and norms differs."""
        kernels, d = self.cpu_kernels, cache.head_dim
        for i, block in enumerate(self.blocks):
            attn = block.attn
            qkv = kernels.linear(x, attn.qkv_weight.t(), attn.qkv_bias, norm=block.attn_ln).view(3, attn.n_head, d)
            cache.self_kv_layers[i][:, slot, :, position] = qkv[1:]
            o = kernels.attend_one(qkv[0], cache.self_k_layers[i][slot], cache.self_v_layers[i][slot], position + 1)
            x = kernels.linear(o.view(x.shape), attn.out.weight.t(), attn.out.bias, residual=x)
            cross = block.cross_attn
            q = kernels.linear(x, cross.query.weight.t(), cross.query.bias, norm=block.cross_attn_ln)
            k, v, _, _ = cache.cross_layer(i, slice(slot, slot + 1))
            o = kernels.attend_one(q.view(cross.n_head, d), k[0], v[0], k.shape[2])
            x = kernels.linear(o.view(x.shape), cross.out.weight.t(), cross.out.bias, residual=x)
            fc1, fc2 = block.mlp[0], block.mlp[2]
            h = kernels.linear(x, fc1.weight.t(), fc1.bias, norm=block.mlp_ln, gelu=True)
            x = kernels.linear(h, fc2.weight.t(), fc2.bias, residual=x)
        return norm(self.ln, x)

    def _step_rows(self, x: Tensor, cache: KVCache, slot_start: int, positions: Tensor) -> Tensor:
        """forward() for one token of each of several sequences on a CPU (row r in slot slot_start + r, at its own
        position): the products stay in torch (MKL's several-row products share each weight read), the attentions
        run in the native kernel, one task per (row, head), each row's new K/V written first (tiny.en, 8 rows, 2
        cores: 1.2 against SDPA's 2.0 ms per cross-attention). Same arithmetic as the torch path up to the
        summation order inside dot products."""
        kernels, b = self.cpu_kernels, x.shape[0]
        slots = slice(slot_start, slot_start + b)
        pos = positions.reshape(b).contiguous()
        x = x.reshape(b, -1)
        for i, block in enumerate(self.blocks):
            attn = block.attn
            qkv = attn.qkv(norm(block.attn_ln, x))
            k, v = cache.self_k_layers[i][slots], cache.self_v_layers[i][slots]
            x = x + linear(attn.out, kernels.attend_rows(qkv, k, v, k.shape[2], positions=pos))
            cross = block.cross_attn
            q = linear(cross.query, norm(block.cross_attn_ln, x))
            k, v, _, _ = cache.cross_layer(i, slots)
            x = x + linear(cross.out, kernels.attend_rows(q, k, v, k.shape[2]))
            x = x + block.feed_forward(norm(block.mlp_ln, x))
        return norm(self.ln, x).view(b, 1, -1)

    def align(
        self, tokens: Tensor, cache: KVCache, slot: int, heads: list[tuple[int, int]]
    ) -> tuple[Tensor, Tensor]:
        """
        Teacher-forced pass of one sequence against its slot's cross cache, for word timestamps.
        tokens : (1, T); returns (the alignment heads' pre-softmax cross-attention (n_heads, T, n_audio_ctx),
        logits (T, n_vocab)). Self-attention runs over the tokens directly; the slot's self cache is untouched.
        """
        t = tokens.shape[1]
        positions = torch.arange(t, device=tokens.device)
        x = self.token_embedding(tokens) + self.positional_embedding[positions]
        causal = (positions[:, None] >= positions[None, :])[None, None]
        qks = []
        for i, block in enumerate(self.blocks):
            attn, h = block.attn, block.attn_ln(x)
            q, k, v = attn.qkv(h).unflatten(-1, (3, attn.n_head, cache.head_dim)).unbind(2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=causal)
            x = x + attn.out(attn.merge_heads(o))
            cross, h = block.cross_attn, block.cross_attn_ln(x)
            q = cross.split_heads(cross.query(h))
            ck, cv, k_scale, v_scale = cache.cross_layer(i, slice(slot, slot + 1))
            if k_scale is not None:  # one sequence, once per window: plain values are simplest here
                ck, cv = dequantize(ck, k_scale, q.dtype), dequantize(cv, v_scale, q.dtype)
            layer_heads = [head for layer, head in heads if layer == i]
            if layer_heads:
                qks.append((q[0, layer_heads] @ ck[0, layer_heads].transpose(-1, -2)) * cache.head_dim**-0.5)
            x = x + cross.out(cross.merge_heads(F.scaled_dot_product_attention(q, ck, cv)))
            x = x + block.mlp(block.mlp_ln(x))
        return torch.cat(qks), self.logits(self.ln(x))[0]

    def fuse_qkv(self, input_major: bool = False) -> None:
        """One matmul for each self-attention's q, k and v (MultiHeadAttention.fuse_qkv): a decode step launches
        two kernels fewer per layer. `input_major`: the layout a CPU decode step streams fastest (prepare_for_cpu)."""
        for block in self.blocks:
            block.attn.fuse_qkv(input_major)

    def prepare_for_cpu(self, kernels: CpuKernels | None = None, vocab_chunks: int = 8) -> None:
        """Lay out the weights that a CPU decode step streams from memory so the BLAS kernels use both cores.

        A decode step multiplies one row per sequence by every weight, so it is bound by memory bandwidth, and
        how fast MKL streams a matrix depends on its layout and shape (tiny.en, 2 cores, measured per step):
        - the wide projections (the MLP's first layer here, the fused q/k/v by `fuse_qkv(input_major=True)`)
          are stored input-major, which turns `F.linear`'s product into a plain row-times-matrix one: 7.4 vs
          8.2 ms per step;
        - the vocabulary projection for one row runs as a batched product over `vocab_chunks` column blocks
          of the (n_text_state, n_vocab) transpose, which MKL spreads over the cores (2.3 vs 3.3 ms); for
          several rows the (n_vocab, n_text_state) product with the rows as columns is the fast one (3.9 vs
          10 ms at 4 rows), so that layout is kept as well: the token embedding itself.
        With `kernels` (engine/kernels/cpu_kernels.py), one sequence's steps run in them, and they read every projection
        input-major (torch's own products run the square and narrowing ones as fast either way: in-process A/B).
        Values are unchanged; only the summation order inside a dot product may differ."""
        for block in self.blocks:
            projs = [block.mlp[0]]
            if kernels is not None:
                projs += [block.attn.out, block.cross_attn.query, block.cross_attn.out, block.mlp[2]]
            for proj in projs:
                proj.weight = nn.Parameter(proj.weight.t().contiguous().t(), requires_grad=False)
        if kernels is not None and all(kernels.supports_linear(w.t()) for w in self._step_weights()):
            self.cpu_kernels = kernels
        weight = self.token_embedding.weight
        n_vocab, n_state = weight.shape
        padded = -(-n_vocab // vocab_chunks) * vocab_chunks
        chunks = torch.cat([weight, weight.new_zeros(padded - n_vocab, n_state)]).t()
        chunks = chunks.reshape(n_state, vocab_chunks, padded // vocab_chunks).permute(1, 0, 2).contiguous()
        self.register_buffer("output_chunks", chunks, persistent=False)

    def _step_weights(self) -> list[Tensor]:
        ws = []
        for block in self.blocks:
            ws += [getattr(block.attn, "qkv_weight", block.attn.query.weight), block.attn.out.weight]
            ws += [block.cross_attn.query.weight, block.cross_attn.out.weight, block.mlp[0].weight, block.mlp[2].weight]
        return ws

    def pad_vocabulary(self, multiple: int = VOCAB_PADDING) -> None:
        """Lay the token embedding out as the first rows of a (multiple of `multiple`, n_state) weight, so the output
        projection's result rows start 16-byte aligned: cuBLAS runs a 51,866-wide float16 output (rows 103,732
        bytes apart) through slow unaligned kernels (H200, with the cast to float32: 247 -> 106 us per step at 256
        rows, 64 -> 41 at 8; BENCHMARKS.md, twelfth session). The embedding becomes a view of that weight: no extra
        memory."""
        weight = self.token_embedding.weight
        n_vocab, n_state = weight.shape
        padded = weight.new_zeros(-(-n_vocab // multiple) * multiple, n_state)
        padded[:n_vocab] = weight
        self.token_embedding.weight = nn.Parameter(padded[:n_vocab], requires_grad=False)
        self.register_buffer("output_weight", padded, persistent=False)

    def logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        """Output projection tied to the token embedding; always in float32 for stable sampling. `out`: a float32
        tensor to write them into (a graph's static buffer), saving a pass over them."""
        logits = self._logits(hidden)
        if out is None:  # a padded product's slice or a float16 result: one pass makes it contiguous float32
            return logits.float().contiguous()
        return out.copy_(logits)  # the cast and the slice's gather in the same pass

    def _logits(self, hidden: Tensor) -> Tensor:
        weight = self.token_embedding.weight
        if not hasattr(self, "output_chunks"):
            if hidden.numel() == weight.shape[1]:  # a lone sequence's step on a GPU: one kernel, float32 out
                out = one_row_logits(hidden, weight)
                if out is not None:
                    return out.view(*hidden.shape[:-1], weight.shape[0])
            if hasattr(self, "output_weight"):
                return F.linear(hidden, self.output_weight)[..., : weight.shape[0]]
            return F.linear(hidden, weight)
        rows = hidden.reshape(-1, hidden.shape[-1])
        if rows.shape[0] == 1:
            out = torch.bmm(rows.expand(self.output_chunks.shape[0], 1, -1), self.output_chunks)
            out = out.reshape(1, -1)[:, : weight.shape[0]]
        else:
            out = (weight @ rows.t()).t()
        return out.reshape(*hidden.shape[:-1], weight.shape[0]).float()


class Whisper(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)

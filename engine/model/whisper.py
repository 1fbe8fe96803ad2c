"""Whisper's encoder and decoder (openai/whisper's architecture); the decoder reads and writes per-slot caches.

This is the reference computation, run as written on every device for prompt passes, word alignment and the
encoder. How a device runs a decode step fast (one-kernel attention, native CPU kernels, weight layouts, fused
products for a lone row) is its backend's business: engine/backends/. The layer operations (a residual add with the
layer norm after it, a product, a product with GELU) are the encoder's and decoder's `ops`: plain torch
(layer_ops.py) unless the backend gives them its own (the GPU backend: fused kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernels.int8_attention import dequantize, indexed_attention, int8_attention, quantize_into
from engine.kernels.options import DEFAULT_KERNELS, KernelOptions
from engine.model.dims import ModelDimensions
from engine.model.kv_cache import KVCache
from engine.model.layer_ops import TORCH_OPS, LayerOps, Projection

NEG_INF = float("-inf")


class _Uninitialised:
    """A layer that skips torch's random initialisation: its weights always come from a checkpoint (the model is
    built on the meta device and loaded with assign=True; weights.py makes the dummy ones). Initialising meta
    tensors runs torch's Python reference kernels, whose first call imports torch's compiler: seconds of every
    server's, engine process's and CLI's start."""

    def reset_parameters(self) -> None:
        pass


class Linear(_Uninitialised, nn.Linear):
    pass


class Conv1d(_Uninitialised, nn.Conv1d):
    pass


class Embedding(_Uninitialised, nn.Embedding):
    pass


class LayerNorm(_Uninitialised, nn.LayerNorm):
    pass


def cross_attention(q: Tensor, cache: KVCache, layer: int, row_start: int, kernels: KernelOptions) -> Tensor:
    """q (rows, heads, t, dim) of the rows row_start.. against each row's encoder K/V (its window's cross slot, which
    a beam search's rows share), read where they live: each run of rows that a slice of the cache serves is one call
    (a shared slot's rows become that many more query positions), which is one call without beams."""
    b = q.shape[0]
    k, v, k_scale, v_scale = cache.cross_layer(layer, slice(None))
    outs = []
    for r0, r1, slot, shared, positions in cache.cross_runs(row_start, b):
        rows = q[r0:r1]
        n = 1 if shared else r1 - r0
        sl, p = slice(slot, slot + n), slice(positions)  # a short context's slots: their first positions only
        ks, vs = (k_scale[sl, :, p], v_scale[sl, :, p]) if k_scale is not None else (None, None)
        ck, cv = k[sl, :, p], v[sl, :, p]
        if shared:  # the rows' queries as more positions of one: (1, heads, rows * t, dim)
            m, h, t, d = rows.shape
            o = _attend(rows.transpose(0, 1).reshape(1, h, m * t, d), ck, ks, cv, vs, kernels)
            o = o.view(h, m, t, d).transpose(0, 1)
        else:
            o = _attend(rows, ck, ks, cv, vs, kernels)
        outs.append(o)
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def indexed_cross_attention(q: Tensor, cache: KVCache, layer: int, row_start: int, kernels: KernelOptions) -> Tensor:
    """cross_attention() with the kernels that take the rows' slot index on the device (a CUDA graph replays with
    whatever the index holds): the GPU backends' choice (GpuBackend sets it on the decoder)."""
    k, v, k_scale, v_scale = cache.cross_layer(layer, slice(None))
    index, order = cache.cross_slots_of(row_start, q.shape[0])
    return indexed_attention(q, k, k_scale, v, v_scale, index, order, kernels)


def tiled_positions(positions: int, n_audio_ctx: int) -> int:
    """The fewest encoder positions, at least `positions`, whose copies end to end fill a cross slot of
    n_audio_ctx exactly (TextDecoder.fill_cross_cache's `tile`)."""
    return next(n for n in range(max(positions, 1), n_audio_ctx + 1) if n_audio_ctx % n == 0)


def _attend(q: Tensor, k: Tensor, k_scale: Tensor | None, v: Tensor, v_scale: Tensor | None, kernels) -> Tensor:
    if k_scale is not None:
        return int8_attention(q, k, k_scale, v, v_scale, kernels)
    return F.scaled_dot_product_attention(q, k, v)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = Linear(n_state, n_state)
        self.key = Linear(n_state, n_state, bias=False)
        self.value = Linear(n_state, n_state)
        self.out = Linear(n_state, n_state)
        # q, k and v as one product (fuse_qkv): set for the decoder's self-attention, and the encoder's on a GPU
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)

    @property
    def is_fused(self) -> bool:
        return self.qkv_weight is not None

    def split_heads(self, x: Tensor) -> Tensor:
        """(batch, time, n_state) -> (batch, n_head, time, head_dim)"""
        b, t, _ = x.shape
        if t == 1:  # a decode step: the same layout in one view instead of two operations
            return x.view(b, self.n_head, 1, -1)
        return x.view(b, t, self.n_head, -1).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(batch, n_head, time, head_dim) -> (batch, time, n_state)"""
        b, _, t, _ = x.shape
        if t == 1:
            return x.reshape(b, 1, -1)
        return x.transpose(1, 2).reshape(b, t, -1)

    def forward(self, x: Tensor, ops: LayerOps = TORCH_OPS) -> Tensor:
        """Full, unmasked self-attention (the encoder's): (batch, time, n_state) -> same."""
        if self.is_fused:
            b, t, _ = x.shape
            qkv = ops.linear(Projection(self.qkv_weight, self.qkv_bias), x)
            q, k, v = qkv.view(b, t, 3, self.n_head, -1).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        else:  # three products, their outputs viewed in place (qkv() would concatenate them: a copy)
            q, k, v = (self.split_heads(ops.linear(p, x)) for p in (self.query, self.key, self.value))
        return ops.linear(self.out, self.merge_heads(ops.attention(q, k, v)))

    def qkv(self, x: Tensor) -> Tensor:
        """[q | k | v] of x along the last axis: one product once fuse_qkv has run, else three concatenated."""
        if self.is_fused:
            return F.linear(x, self.qkv_weight, self.qkv_bias)
        return torch.cat([self.query(x), self.key(x), self.value(x)], dim=-1)

    def fuse_qkv(self, input_major: bool = False) -> None:
        """q, k and v as one product (qkv_weight, qkv_bias): one kernel instead of three, closer to the tensor
        cores' peak for the encoder's wide products.

        The separate projections become views of the fused weight, so no memory is added. `input_major` stores
        the fused weight transposed in memory (same values), the layout a CPU decode step streams fastest
        (engine/backends/cpu.py)."""
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
        self.attn_ln = LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head) if cross_attention else None
        self.cross_attn_ln = LayerNorm(n_state) if cross_attention else None
        n_mlp = n_state * 4
        self.mlp = nn.Sequential(Linear(n_state, n_mlp), nn.GELU(), Linear(n_mlp, n_state))
        self.mlp_ln = LayerNorm(n_state)

    def feed_forward(self, h: Tensor, ops: LayerOps = TORCH_OPS, pdl: bool = True) -> Tensor:
        """The MLP on its normalized input (the residual add is the caller's, fused with the next norm)."""
        return ops.linear(self.mlp[2], ops.linear_gelu(self.mlp[0], h), pdl)

    def take_products(self) -> tuple[list[nn.Linear], nn.Linear, nn.Linear, nn.Linear]:
        """The self-attention block's four products ([query, key, value], out, the MLP's two), removed from it for a
        quantized copy to replace (AudioEncoder.use_quantized); the block keeps its layer norms."""
        attn = self.attn
        products = [attn.query, attn.key, attn.value], attn.out, self.mlp[0], self.mlp[2]
        del attn.query, attn.key, attn.value, attn.out, self.mlp
        return products


class AudioEncoder(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.conv1 = Conv1d(dims.n_mels, dims.n_audio_state, kernel_size=3, padding=1)
        self.conv2 = Conv1d(dims.n_audio_state, dims.n_audio_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", torch.empty(dims.n_audio_ctx, dims.n_audio_state))
        self.blocks = nn.ModuleList(
            ResidualAttentionBlock(dims.n_audio_state, dims.n_audio_head) for _ in range(dims.n_audio_layer)
        )
        self.ln_post = LayerNorm(dims.n_audio_state)
        self.quantized: nn.Module | None = None  # blocks quantized_start.. with fewer-bit products (use_quantized)
        self.quantized_start = len(self.blocks)
        self.ops = TORCH_OPS  # the layer operations; a backend may set its own

    def use_quantized(self, blocks: nn.Module) -> None:
        """Run the blocks from `blocks.start` on through `blocks` from now on: their products in float8 on a GPU
        (engine/kernels/fp8.py Fp8Blocks) or int8 on a CPU (engine/backends/cpu_int8_encoder.py Int8Blocks), which
        hold those products' weights and free the blocks' own. Called as blocks(x, h, self.blocks, ln_post) with
        the residual stream entering block `start` and its normalized copy; returns ln_post of the last output."""
        self.quantized = blocks
        self.quantized_start = blocks.start

    def fuse_qkv(self) -> None:
        """Each block's q, k and v as one product where the block runs in the model's dtype (quantized blocks fuse
        their own)."""
        for block in list(self.blocks)[: self.quantized_start]:
            block.attn.fuse_qkv()

    def stem(self, mel: Tensor) -> Tensor:
        """mel (batch, n_mels, 3000) -> the residual stream entering the first block (batch, n_audio_ctx, n_state);
        a shorter mel (2N frames) gives the first N positions (benchmarks/partial_audio_ctx.py measures that)"""
        x = F.gelu(self.ops.conv1d(self.conv1, mel))
        # the residual stream must be (batch, time, channels) in memory, not a transposed view of the conv's
        # output: every later add, layer norm and linear would run strided
        x = F.gelu(self.ops.conv1d(self.conv2, x)).transpose(1, 2).contiguous()
        return x + self.positional_embedding[: x.shape[1]]

    def forward(self, mel: Tensor) -> Tensor:
        """mel : (batch, n_mels, 3000) -> (batch, n_audio_ctx, n_audio_state)"""
        x = self.stem(mel)
        blocks, ops = list(self.blocks), self.ops
        # each residual add is fused with the layer norm after it, the last with ln_post
        h = ops.norm(blocks[0].attn_ln, x)
        next_norms = [block.attn_ln for block in blocks[1:]] + [self.ln_post]
        end = self.quantized_start
        for block, next_norm in zip(blocks[:end], next_norms[:end]):
            x, h = ops.add_norm(x, block.attn(h, ops), block.mlp_ln)
            x, h = ops.add_norm(x, block.feed_forward(h, ops), next_norm)
        return h if end == len(blocks) else self.quantized(x, h, blocks, self.ln_post)


class TextDecoder(nn.Module):
    """Decoder over a contiguous range of cache slots: batch row i uses slot `slot_start + i`."""

    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.token_embedding = Embedding(dims.n_vocab, dims.n_text_state)
        self.positional_embedding = nn.Parameter(torch.empty(dims.n_text_ctx, dims.n_text_state))
        self.blocks = nn.ModuleList(
            ResidualAttentionBlock(dims.n_text_state, dims.n_text_head, cross_attention=True)
            for _ in range(dims.n_text_layer)
        )
        self.ln = LayerNorm(dims.n_text_state)
        self.kernels: KernelOptions = DEFAULT_KERNELS  # for its own passes; select_backend sets the engine's
        self.ops = TORCH_OPS  # the layer operations; a backend may set its own
        # the operations of a pass run as written on every device (word alignment): plain torch, and adapters
        self.reference_ops = TORCH_OPS
        self.cross_attention = cross_attention  # how its rows read their cross slots; a GPU backend sets its own

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens, positions (batch, q) -> the residual stream entering the first block (batch, q, n_text_state)"""
        return self.token_embedding(tokens) + self.positional_embedding[positions]

    def fill_cross_cache(
        self, audio_features: Tensor, cache: KVCache, cross_slots: int | list[int], tile: bool = False
    ) -> None:
        """Project encoder output to cross-attention K/V once and store it in the cross slots: `cross_slots` one
        per window, or the first of consecutive ones. Features of a short context (fewer than n_audio_ctx
        positions) fill the slots' first positions, and the rows reading them attend to those only; or, with
        `tile` (a backend whose kernels read whole slots), copies of them end to end fill each slot (its
        positions a divisor of n_audio_ctx: tiled_positions), which attention over the whole slot weighs exactly as
        the positions once: each key's weight and its value are repeated alike, so the softmax's sums scale
        together. The slot's length (KVCache.cross_len) stays the positions' count, for readers that slice it."""
        if isinstance(cross_slots, int):
            cross_slots = list(range(cross_slots, cross_slots + audio_features.shape[0]))
        elif cross_slots != sorted(cross_slots):
            # windows in their slots' order (the encoder may order them otherwise, by adapter): each run of
            # consecutive slots is written by one kernel per layer, not one per window
            order = sorted(range(len(cross_slots)), key=cross_slots.__getitem__)
            audio_features = audio_features[torch.tensor(order, device=audio_features.device)]
            cross_slots = [cross_slots[i] for i in order]
        positions = audio_features.shape[1]
        if tile and cache.shape.n_audio_ctx % positions:
            raise ValueError(f"{positions} positions do not tile a cross slot of {cache.shape.n_audio_ctx}")
        copies = cache.shape.n_audio_ctx // positions if tile else 1
        for slot in cross_slots:
            cache.set_cross_len(slot, positions)
        filled = slice(positions)
        for i, block in enumerate(self.blocks):
            attn = block.cross_attn
            k, v = (attn.split_heads(self.ops.linear(p, audio_features)) for p in (attn.key, attn.value))
            for w0, w1, slot in _consecutive(cross_slots):
                ck, cv, k_scale, v_scale = cache.cross_layer(i, slice(slot, slot + w1 - w0))
                if k_scale is not None:
                    quantize_into(k[w0:w1], ck[:, :, filled], k_scale[:, :, filled])
                    quantize_into(v[w0:w1], cv[:, :, filled], v_scale[:, :, filled])
                else:
                    ck[:, :, filled].copy_(k[w0:w1])
                    cv[:, :, filled].copy_(v[w0:w1])
                if copies > 1:
                    for x in (ck, cv) if k_scale is None else (ck, cv, k_scale, v_scale):
                        tiles = x[:, :, : positions * copies].unflatten(2, (copies, positions))
                        tiles[:, :, 1:].copy_(tiles[:, :, :1])

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
        position : set when every row decodes one token at this same position: the K/V write is then a plain
            slice copy instead of an indexed scatter, and no mask is needed
        returns hidden states (batch, q, n_text_state) after the final layer norm
        """
        b = tokens.shape[0]
        x = self.embed(tokens, positions)
        slots = slice(slot_start, slot_start + b)
        rows = None if position is not None else torch.arange(slot_start, slot_start + b, device=tokens.device)[:, None]
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # SDPA turns a boolean mask into an additive one on every call, in every layer: convert it once
            attn_mask = torch.zeros(attn_mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~attn_mask, NEG_INF)
        # Layers are applied through their functions (norm, linear), not by calling the modules: a decode step is
        # ~100 small operations, and nn.Module.__call__'s dispatch costs ~11 us each on a CPU. Each residual add is
        # fused with the layer norm after it (the last with the final norm), so h is always the next input.
        ops, pdl = self.ops, self.kernels.pdl
        h = ops.norm(self.blocks[0].attn_ln, x)
        next_norms = [block.attn_ln for block in list(self.blocks)[1:]] + [self.ln]
        for i, (block, next_norm) in enumerate(zip(self.blocks, next_norms)):
            # self-attention: write this step's K/V into the slot, then attend over the slot's prefix
            attn = block.attn
            qkv = ops.qkv(attn, h).view(b, -1, 3, attn.n_head, cache.head_dim)  # (b, q, 3, heads, dim)
            if position is not None:
                cache.self_kv_layers[i][:, slots, :, position] = qkv[:, 0, 1:].transpose(0, 1)
            else:
                cache.self_kv_layers[i][:, rows, :, positions] = qkv[:, :, 1:]
            q = qkv[:, :, 0].transpose(1, 2)
            k = cache.self_k_layers[i][slots, :, :kv_len]
            v = cache.self_v_layers[i][slots, :, :kv_len]
            o = attn.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask))
            x, h = ops.add_norm(x, ops.linear(attn.out, o, pdl), block.cross_attn_ln)
            cross = block.cross_attn
            q = cross.split_heads(ops.linear(cross.query, h, pdl))
            o = self.cross_attention(q, cache, i, slot_start, self.kernels)
            x, h = ops.add_norm(x, ops.linear(cross.out, cross.merge_heads(o), pdl), block.mlp_ln)
            x, h = ops.add_norm(x, block.feed_forward(h, ops, pdl), next_norm)
        return h

    def prompt_pass(self, tokens: Tensor, cache: KVCache, slot_start: int) -> Tensor:
        """forward() over prompts (batch, width) from position 0, each token attending to itself and those before
        it: hidden states (batch, width, n_text_state). Prompts right-padded to one width attend to no padding."""
        width = tokens.shape[1]
        positions = torch.arange(width, device=tokens.device).expand(tokens.shape[0], width)
        causal = positions[:, None, :, None] >= positions[:, None, None, :]
        return self(tokens, positions, cache, slot_start, width, causal)

    def align(
        self, tokens: Tensor, cache: KVCache, cross_slot: int, heads: list[tuple[int, int]]
    ) -> tuple[Tensor, Tensor]:
        """
        Teacher-forced pass of one sequence against its window's cross cache, for word timestamps.
        tokens : (1, T); returns (the alignment heads' pre-softmax cross-attention (n_heads, T, n_audio_ctx),
        hidden states (T, n_text_state) after the final norm). Self-attention runs over the tokens directly; the
        slot's self cache is untouched.
        """
        t = tokens.shape[1]
        positions = torch.arange(t, device=tokens.device)
        x = self.embed(tokens, positions)
        causal = (positions[:, None] >= positions[None, :])[None, None]
        qks, ops = [], self.reference_ops
        for i, block in enumerate(self.blocks):
            attn, h = block.attn, ops.norm(block.attn_ln, x)
            q, k, v = ops.qkv(attn, h).unflatten(-1, (3, attn.n_head, cache.head_dim)).unbind(2)
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=causal
            )
            x = x + ops.linear(attn.out, attn.merge_heads(o))
            cross, h = block.cross_attn, ops.norm(block.cross_attn_ln, x)
            q = cross.split_heads(ops.linear(cross.query, h))
            ck, cv, k_scale, v_scale = cache.cross_layer(i, slice(cross_slot, cross_slot + 1))
            p = slice(cache.cross_len[cross_slot])  # a short context: its first positions
            ck, cv = ck[:, :, p], cv[:, :, p]
            if k_scale is not None:  # one sequence, once per window: plain values are simplest here
                k_scale, v_scale = k_scale[:, :, p], v_scale[:, :, p]
                ck, cv = dequantize(ck, k_scale, q.dtype), dequantize(cv, v_scale, q.dtype)
            layer_heads = [head for layer, head in heads if layer == i]
            if layer_heads:
                qks.append((q[0, layer_heads] @ ck[0, layer_heads].transpose(-1, -2)) * cache.head_dim**-0.5)
            x = x + ops.linear(cross.out, cross.merge_heads(F.scaled_dot_product_attention(q, ck, cv)))
            x = x + block.feed_forward(ops.norm(block.mlp_ln, x), ops)
        return torch.cat(qks), ops.norm(self.ln, x)[0]

    def fuse_qkv(self, input_major: bool = False) -> None:
        """One product for each self-attention's q, k and v (MultiHeadAttention.fuse_qkv), which every decode path
        uses. `input_major`: the layout a CPU decode step streams fastest."""
        for block in self.blocks:
            block.attn.fuse_qkv(input_major)

    def logits(self, hidden: Tensor) -> Tensor:
        """(..., n_text_state) -> float32 (..., n_vocab): the output projection tied to the token embedding, as
        written; each backend computes the same numbers in the layout its device reads fastest."""
        return F.linear(hidden, self.token_embedding.weight).float()


def _consecutive(slots: list[int]) -> list[tuple[int, int, int]]:
    """(first index, end index, first slot) of each run of `slots` that steps by one."""
    runs: list[list[int]] = []
    for i, slot in enumerate(slots):
        if runs and slot == runs[-1][2] + (i - runs[-1][0]):
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, slot])
    return [(a, b, c) for a, b, c in runs]


class Whisper(nn.Module):
    def __init__(self, dims: ModelDimensions):
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(dims)
        self.decoder = TextDecoder(dims)

"""CPU backends: torch with weight layouts that stream fast, and the native decode kernels on top of them.

A decode step multiplies one row per sequence by every weight, so on a CPU it is bound by memory bandwidth, and
how fast MKL streams a matrix depends on its layout and shape (tiny.en, 2 cores; `benchmarks/cpu_decode_step.py`):
- the wide projections (the MLP's first layer, the fused q/k/v) are stored input-major, which turns F.linear's
  product into a plain row-times-matrix one;
- the vocabulary projection for one row runs as a batched product over column blocks of the (n_text_state,
  n_vocab) transpose, which MKL spreads over the cores; for several rows the (n_vocab, n_text_state) product with
  the rows as columns is the fast one, so that layout is kept as well: the token embedding itself.
Values are unchanged; only the summation order inside a dot product may differ.

With the native kernels (engine/kernels/cpu_kernels.py) one sequence's step runs entirely in them, and several
sequences' steps do; they read every projection input-major, or from a blocked copy (BlockedWeight: each task's
columns contiguous), which streams 1.3-2.4x faster at the decoder's shapes with bitwise the same results. The copy
doubles the decoder's projection weights (torch's prompt passes still read them as they are), so it is made where
that costs at most BLOCKED_MAX_BYTES: tiny, base and small.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.backends.base import DecodeBackend
from engine.backends.cpu_int8_encoder import Int8Blocks
from engine.kernels.cpu_kernels import COLS, BlockedWeight, CpuKernels, QuantizedWeight
from engine.kernels.cpu_team import TeamSize
from engine.kernels.options import KernelOptions
from engine.model.kv_cache import KVCache
from engine.model.layer_ops import norm
from engine.model.whisper import TextDecoder, Whisper

VOCAB_CHUNKS = 8  # column blocks of the one-row vocabulary projection
BLOCKED_MAX_BYTES = 512 << 20  # the most the float32 decoder's blocked copies may add (small's: 396 MB)


class CpuTorchBackend(DecodeBackend):
    """torch's operations in CPU layouts; rows at one shared position write their K/V by slice, unmasked."""

    name = "cpu-torch"

    def __init__(self, model: Whisper, kernels: KernelOptions, output_chunks: Tensor):
        super().__init__(model, kernels)
        self.output_chunks = output_chunks  # lay_out_for_cpu's
        if kernels.cpu_int8_weights:  # the encoder's products in int8 too (torch's integer products need no kernels)
            model.encoder.use_quantized(Int8Blocks(model.encoder.blocks))

    def eager_step(
        self, tokens: Tensor, positions: Tensor, cache: KVCache, host_positions: list[int], slot_start: int = 0
    ) -> Tensor:
        p = host_positions[0]
        if all(q == p for q in host_positions):  # a lone sequence, or a batch in step: exactly its prefix
            return self.decoder(tokens, positions, cache, slot_start, p + 1, None, p)
        return super().eager_step(tokens, positions, cache, host_positions, slot_start)

    def projection(self, hidden: Tensor) -> Tensor:
        weight = self.decoder.token_embedding.weight
        rows = hidden.reshape(-1, hidden.shape[-1])
        if rows.shape[0] == 1:
            out = torch.bmm(rows.expand(self.output_chunks.shape[0], 1, -1), self.output_chunks)
            out = out.reshape(1, -1)[:, : weight.shape[0]]
        else:
            out = (weight @ rows.t()).t()
        return out.reshape(*hidden.shape[:-1], weight.shape[0]).float()


class CpuNativeBackend(CpuTorchBackend):
    """A step in the native kernels: one sequence's wholly (8 calls per layer instead of ~20 operations, each
    layer norm, GELU and residual add inside a product), several sequences' attentions one task per (row, head)
    while their products stay in torch (MKL's several-row products share each weight read)."""

    name = "cpu-native"

    def __init__(self, model: Whisper, kernels: KernelOptions, output_chunks: Tensor, native: CpuKernels):
        super().__init__(model, kernels, output_chunks)
        self.native = native
        self.team = TeamSize(torch.get_num_threads(), adaptive=kernels.cpu_adaptive_team)
        # int8 copies of the products a lone sequence's step reads (KernelOptions.cpu_int8_weights), by weight
        self.int8: dict[int, QuantizedWeight] = {}
        self.vocab_int8: QuantizedWeight | None = None
        # else float32 copies laid out as the int8 ones, where they fit (BLOCKED_MAX_BYTES), by weight
        self.blocked: dict[int, BlockedWeight] = {}
        products = decoder_products(self.decoder)
        if kernels.cpu_int8_weights:
            # laid out for the integer dot products where the CPU runs them (and every product's inputs come in 4s)
            dot = kernels.cpu_int8_dot and native.int8_dot
            for w in products:
                self.int8[id(w)] = QuantizedWeight.of(w.t(), interleave=dot and w.shape[1] % 4 == 0)
            embedding = self.decoder.token_embedding.weight
            columns = -(-embedding.shape[0] // COLS) * COLS
            self.vocab_int8 = QuantizedWeight.of(embedding.t(), columns, interleave=dot and embedding.shape[1] % 4 == 0)
        elif sum(w.numel() * 4 for w in products) <= BLOCKED_MAX_BYTES:
            self.blocked = {id(w): BlockedWeight.of(w.t()) for w in products if w.shape[0] % COLS == 0}

    def _linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, **fused) -> Tensor:
        """One row's product with a decoder weight (out, in), from its int8 or blocked copy when there is one."""
        q = self.int8.get(id(weight))
        if q is not None:
            return self._adapted(self.native.linear_q8, x, q, weight, bias, **fused)
        return self._adapted(self.native.linear, x, self.blocked.get(id(weight), weight.t()), weight, bias, **fused)

    def _adapted(self, product, x: Tensor, stored, weight: Tensor, bias: Tensor | None, **fused) -> Tensor:
        """product(x, stored, bias, **fused) plus the rows' adapter deltas, where a row of the pass uses an adapter
        on this weight: their input is the normalised x where the kernel normalises it, and GELU comes after them."""
        name = self.adapter_names.get(id(weight)) if self.adapted else None
        if name is None:
            return product(x, stored, bias, **fused)
        gelu = fused.pop("gelu", False)
        y = product(x, stored, bias, **fused)
        ln = fused.get("norm")
        y = self.adapters.add_to(y, name, x if ln is None else norm(ln, x))
        return F.gelu(y) if gelu else y

    def projection(self, hidden: Tensor) -> Tensor:
        rows = hidden.reshape(-1, hidden.shape[-1]).contiguous()
        if self.vocab_int8 is None:
            return super().projection(hidden)
        n_vocab = self.decoder.token_embedding.weight.shape[0]
        if rows.shape[0] == 1:
            out = self.native.linear_q8(rows, self.vocab_int8, None)
        else:
            out = self.native.linear_rows(rows, self.vocab_int8, None)
        return out[:, :n_vocab].reshape(*hidden.shape[:-1], n_vocab)

    def eager_logits(self, tokens: Tensor, positions: Tensor, cache: KVCache, host_positions: list[int]) -> Tensor:
        with self.team.step(tokens.shape[0]) as size, self.native.team(size):
            return super().eager_logits(tokens, positions, cache, host_positions)

    def eager_step(
        self, tokens: Tensor, positions: Tensor, cache: KVCache, host_positions: list[int], slot_start: int = 0
    ) -> Tensor:
        x = self.decoder.embed(tokens, positions)
        if tokens.shape[0] == 1:
            return self._step_one(x, cache, slot_start, host_positions[0])
        return self._step_rows(x, cache, slot_start, positions)

    def prompt_pass(self, tokens: Tensor, cache: KVCache, slot_start: int) -> Tensor:
        if tokens.shape[1] == 1 and tokens.shape[0] > 1:  # prompts of one token: a step of several rows
            positions = torch.zeros_like(tokens)
            return self._step_rows(self.decoder.embed(tokens, positions), cache, slot_start, positions)
        return super().prompt_pass(tokens, cache, slot_start)

    def _step_one(self, x: Tensor, cache: KVCache, slot: int, position: int) -> Tensor:
        """One token of the sequence in `slot` at `position`: x (1, 1, n_state) -> hidden (1, 1, n_state)."""
        kernels, d = self.native, cache.head_dim
        cross_slot = cache.row_cross[slot]
        linear = self._linear
        for i, block in enumerate(self.decoder.blocks):
            attn = block.attn
            qkv = linear(x, attn.qkv_weight, attn.qkv_bias, norm=block.attn_ln).view(3, attn.n_head, d)
            cache.self_kv_layers[i][:, slot, :, position] = qkv[1:]
            o = kernels.attend_one(qkv[0], cache.self_k_layers[i][slot], cache.self_v_layers[i][slot], position + 1)
            x = linear(o.view(x.shape), attn.out.weight, attn.out.bias, residual=x)
            cross = block.cross_attn
            q = linear(x, cross.query.weight, cross.query.bias, norm=block.cross_attn_ln)
            k, v, _, _ = cache.cross_layer(i, slice(cross_slot, cross_slot + 1))
            o = kernels.attend_one(q.view(cross.n_head, d), k[0], v[0], cache.cross_len[cross_slot])
            x = linear(o.view(x.shape), cross.out.weight, cross.out.bias, residual=x)
            fc1, fc2 = block.mlp[0], block.mlp[2]
            h = linear(x, fc1.weight, fc1.bias, norm=block.mlp_ln, gelu=True)
            x = linear(h, fc2.weight, fc2.bias, residual=x)
        return norm(self.decoder.ln, x)

    def _step_rows(self, x: Tensor, cache: KVCache, slot_start: int, positions: Tensor) -> Tensor:
        """One token of each of several sequences (row r in slot slot_start + r, at its own position): x (b, 1,
        n_state) -> hidden (b, 1, n_state); each row's new K/V is written before it attends."""
        kernels, b = self.native, x.shape[0]
        slots = slice(slot_start, slot_start + b)
        pos = positions.reshape(b).contiguous()
        cross_slots, _ = cache.cross_slots_of(slot_start, b)  # each row's window's cross slot
        x = x.reshape(b, -1)
        if not self.kernels.cpu_decode_rows:
            ops = self.decoder.ops
            for i, block in enumerate(self.decoder.blocks):
                attn = block.attn
                qkv = ops.qkv(attn, norm(block.attn_ln, x))
                k, v = cache.self_k_layers[i][slots], cache.self_v_layers[i][slots]
                x = x + ops.linear(attn.out, kernels.attend_rows(qkv, k, v, k.shape[2], positions=pos))
                cross = block.cross_attn
                q = ops.linear(cross.query, norm(block.cross_attn_ln, x))
                k, v, _, _ = cache.cross_layer(i, slice(None))
                o = kernels.attend_rows(q, k, v, k.shape[2], cross_slots=cross_slots, lengths=cache.cross_lengths)
                x = x + ops.linear(cross.out, o)
                x = x + block.feed_forward(norm(block.mlp_ln, x), ops)
            return norm(self.decoder.ln, x).view(b, 1, -1)
        rows = self._linear_rows
        for i, block in enumerate(self.decoder.blocks):
            attn = block.attn
            qkv = rows(x, attn.qkv_weight, attn.qkv_bias, norm=block.attn_ln)
            k, v = cache.self_k_layers[i][slots], cache.self_v_layers[i][slots]
            x = rows(kernels.attend_rows(qkv, k, v, k.shape[2], positions=pos), attn.out.weight, attn.out.bias,
                     residual=x)  # fmt: skip
            cross = block.cross_attn
            q = rows(x, cross.query.weight, cross.query.bias, norm=block.cross_attn_ln)
            k, v, _, _ = cache.cross_layer(i, slice(None))
            o = kernels.attend_rows(q, k, v, k.shape[2], cross_slots=cross_slots, lengths=cache.cross_lengths)
            x = rows(o, cross.out.weight, cross.out.bias, residual=x)
            fc1, fc2 = block.mlp[0], block.mlp[2]
            x = rows(rows(x, fc1.weight, fc1.bias, norm=block.mlp_ln, gelu=True), fc2.weight, fc2.bias, residual=x)
        return norm(self.decoder.ln, x).view(b, 1, -1)

    def _linear_rows(self, x: Tensor, weight: Tensor, bias: Tensor | None, **fused) -> Tensor:
        """Several rows' product with a decoder weight (out, in), each weight read once for all of them."""
        stored = self.int8.get(id(weight)) or self.blocked.get(id(weight), weight.t())
        return self._adapted(self.native.linear_rows, x, stored, weight, bias, **fused)


def lay_out_for_cpu(decoder: TextDecoder, native: bool, vocab_chunks: int = VOCAB_CHUNKS) -> Tensor:
    """The decoder's weights in the layouts a CPU step streams fastest (see above), in place; returns the one-row
    vocabulary projection's column blocks (vocab_chunks, n_state, padded n_vocab / vocab_chunks). `native`: every
    projection input-major, as the native kernels read them (torch's own products run the square and narrowing
    ones as fast either way)."""
    for block in decoder.blocks:
        projs = [block.mlp[0]]
        if native:
            projs += [block.attn.out, block.cross_attn.query, block.cross_attn.out, block.mlp[2]]
        for proj in projs:
            proj.weight = nn.Parameter(proj.weight.t().contiguous().t(), requires_grad=False)
    weight = decoder.token_embedding.weight
    n_vocab, n_state = weight.shape
    padded = -(-n_vocab // vocab_chunks) * vocab_chunks
    chunks = torch.cat([weight, weight.new_zeros(padded - n_vocab, n_state)]).t()
    return chunks.reshape(n_state, vocab_chunks, padded // vocab_chunks).permute(1, 0, 2).contiguous()


def native_kernels_fit(decoder: TextDecoder, native: CpuKernels, cache_dtype: torch.dtype, int8_cross: bool) -> bool:
    """Whether the native kernels can run this decoder's steps: float32 caches (an int8 cross cache is not) and
    every projection in a layout they read."""
    head_dim = decoder.token_embedding.weight.shape[1] // decoder.blocks[0].attn.n_head
    probe = torch.empty(1, 1, 1, head_dim, dtype=cache_dtype)  # a cache's layout: (..., positions, head_dim)
    if int8_cross or not native.supports_attention(probe, probe):
        return False
    return all(native.supports_linear(w.t()) for w in decoder_products(decoder))


def decoder_products(decoder: TextDecoder) -> list[Tensor]:
    """The weights (out, in) of every decoder block's products, as the native kernels read them."""
    return [w for block in decoder.blocks for w in (
        block.attn.qkv_weight, block.attn.out.weight, block.cross_attn.query.weight, block.cross_attn.out.weight,
        block.mlp[0].weight, block.mlp[2].weight,
    )]  # fmt: skip

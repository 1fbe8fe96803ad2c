"""The batch-invariant GPU backend: a request's tokens do not depend on what else the GPU decodes.

With the default GPU backend a row's float16 logits change in their last bits with the batch: cuBLAS picks
another kernel (another summation order) per row count, a lone row takes one-row kernels, the attention kernels
split their keys by the number of rows, torch's reductions lay their threads out by the tensor's shape. A greedy
decode that meets a near-tie then follows another path (BENCHMARKS.md, batch dependence). Here every operation
of a step computes a row by the same arithmetic in the same order whatever the batch, the graph bucket, the slot
or the other rows:

- every product (the lone row's too) is kernels/invariant_ops.linear: K never split, summed in order, whatever tile
  the row count picks;
- layer norms and residual adds are one program per row (fused_ops.add_norm, norm_rows);
- self-attention is the step kernel with one block shape (decode_attention, invariant=True); a prompt pass runs
  its tokens as rows of that same kernel, each attending its own prefix, so a prompt fed in one pass gives
  bitwise the state that feeding it a token per step would;
- cross-attention splits the keys the same number of ways for every batch (int8_attention.fixed_split_attention);
- the encoder and the cross K/V projections run their products with the wide tile (invariant_ops.linear, wide),
  its convolutions as such products (invariant_ops.conv1d), its attention per (window, head, query block)
  (invariant_ops.attention) and its norms one program per row: a window's features and cross K/V are the same
  whether it is encoded alone or among the others admitted with it (INVARIANT_OPS).

The greedy pick and its log-probability (kernels/greedy_pick.py), the timestamp rules' logsumexp
(kernels/row_logsumexp.py) and each request's own sampling generator make the step after the logits row-invariant
too; those serve both backends.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.backends.gpu import GpuBackend
from engine.kernels import decode_attention, invariant_ops
from engine.kernels.fused_ops import add_norm, norm_rows
from engine.kernels.int8_attention import fixed_split_attention
from engine.kernels.options import KernelOptions
from engine.model.kv_cache import KVCache
from engine.model.layer_ops import LayerOps, Projection
from engine.model.whisper import Whisper


def wide_linear(proj, x: Tensor, pdl: bool = True) -> Tensor:
    return invariant_ops.linear(x, proj.weight, proj.bias, wide=True)


def wide_linear_gelu(proj, x: Tensor) -> Tensor:
    return invariant_ops.linear(x, proj.weight, proj.bias, gelu=True, wide=True)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh form, which the invariant products' epilogue computes."""
    return F.gelu(x, approximate="tanh")


# The model's own passes over whole windows (the encoder, the cross K/V): every operation
# computes a row, a window or a (window, head) alone, the same way whatever else is in the batch
INVARIANT_OPS = LayerOps(
    add_norm=add_norm, norm=norm_rows, linear=wide_linear, linear_gelu=wide_linear_gelu,
    attention=invariant_ops.attention, conv1d=invariant_ops.conv1d, gelu=gelu_tanh,
)  # fmt: skip


def unsupported_reason(model: Whisper, device: torch.device) -> str | None:
    """Why the batch-invariant products cannot run this model here, or None (the self-attention kernel's own
    condition is GpuBackend.reads_own_prefix)."""
    if device.type != "cuda":
        return "it is a GPU mode (a CPU's decode is already batch-invariant)"
    if invariant_ops.triton is None:
        return "it needs Triton"
    dims = model.dims
    w = model.decoder.blocks[0].mlp[0].weight
    if not (invariant_ops.applies(w.new_empty(1, w.shape[1]), w)):
        return f"widths of {dims.n_text_state} do not tile"
    w = model.encoder.blocks[0].mlp[0].weight
    if not (invariant_ops.applies(w.new_empty(1, w.shape[1]), w, wide=True)):
        return f"encoder widths of {dims.n_audio_state} do not tile"
    return None


class BatchInvariantGpuBackend(GpuBackend):
    batch_invariant = True

    def __init__(
        self, model: Whisper, kernels: KernelOptions, cache_dtype: torch.dtype, device: torch.device, fp8: bool
    ):
        if fp8:
            raise ValueError(
                "batch-invariant decoding: the float8 encoder's products are not; use encoder_precision model"
            )
        super().__init__(model, kernels, cache_dtype, device, fp8)
        model.encoder.ops = model.decoder.ops = INVARIANT_OPS
        why = unsupported_reason(model, device)
        if why is None and not self.reads_own_prefix:
            why = f"the self-attention kernel does not support heads of {model.dims.n_text_state // model.dims.n_text_head}"
        if why is not None:
            raise ValueError(f"batch-invariant decoding: {why}")
        self.fused_lone_row = False  # a lone row takes the same kernels as a batch's rows
        self.name = "gpu (batch-invariant)"

    def with_kernels(self, kernels: KernelOptions) -> GpuBackend:
        other = super().with_kernels(kernels)
        other.fused_lone_row = False
        return other

    def decode_step(
        self, tokens: Tensor, positions: Tensor, cache: KVCache, kv_len: int, slot_start: int = 0
    ) -> Tensor:
        return self._layers(self.decoder.embed(tokens, positions), cache, positions, slot_start, 1)

    def prompt_pass(self, tokens: Tensor, cache: KVCache, slot_start: int) -> Tensor:
        """The prompts' tokens as rows of a step, each attending its own prefix: (batch, width, n_state), every
        position bitwise what a step at that position computes (engine.Sequence.feed_prompt_stepwise's result)."""
        b, width = tokens.shape
        positions = torch.arange(width, device=tokens.device).expand(b, width)
        x = self.decoder.embed(tokens, positions).reshape(b * width, 1, -1)
        h = self._layers(x, cache, positions.reshape(b * width, 1), slot_start, width)
        return h.view(b, width, -1)

    def _layers(self, x: Tensor, cache: KVCache, positions: Tensor, slot_start: int, per_slot: int) -> Tensor:
        """x (rows, 1, n_state) at `positions` (rows, 1); `per_slot` consecutive rows share a slot (a prompt's
        tokens, their K/V written before they attend) -> hidden (rows, 1, n_state) after the final norm."""
        dec, kernels = self.decoder, self.kernels
        rows = x.shape[0]
        # a few rows' kernels are launched as programmatic dependents: each starts while the one before it runs
        # (the products asking for their weights meanwhile); the same arithmetic, only started earlier
        pdl = kernels.pdl and rows <= invariant_ops.DEPENDENT_MAX_ROWS

        adapters = self.adapters if self.adapted else None
        if adapters is not None and per_slot > 1:  # the rows' adapters, one per token of each prompt
            adapters.repeat_rows(per_slot)

        few_rows = kernels.invariant_few_rows
        # with the few-rows kernel every row count normalizes at NORM_WARPS, the layout measured with it (a lone
        # row's chain in benchmarks/gpu_one_row.py); its norms stay apart from the products: inside them
        # (invariant_ops.add_norm_linear, the same sums) the chain was slower (H100)
        norm_warps = invariant_ops.NORM_WARPS if few_rows else None

        def linear(h: Tensor, proj, gelu: bool = False) -> Tensor:
            name = adapters and self.adapter_names.get(id(proj.weight))
            if not name:
                return invariant_ops.linear(h, proj.weight, proj.bias, gelu=gelu, pdl=pdl, few_rows=few_rows)
            y = adapters.add_to(invariant_ops.linear(h, proj.weight, proj.bias, pdl=pdl, few_rows=few_rows), name, h)
            return gelu_tanh(y) if gelu else y

        def norm_linear(x: Tensor, y: Tensor | None, ln, proj, gelu: bool = False) -> tuple[Tensor, Tensor]:
            """(x + y, linear(ln(x + y), proj)), y None: (x, linear(ln(x), proj))"""
            if y is None:
                h = norm_rows(ln, x, pdl, warps=norm_warps)
            else:
                x, h = add_norm(x, y, ln, pdl, warps=norm_warps)
            return x, linear(h, proj, gelu)

        slots = slice(slot_start, slot_start + rows // per_slot)
        cross_rows = cache.cross_slots_of(slot_start, rows // per_slot)  # each slot's row reads its window's
        y = None  # the last sub-layer's output, added to the residual stream x before the next norm
        for i, block in enumerate(dec.blocks):
            attn, cross, fc1, fc2 = block.attn, block.cross_attn, block.mlp[0], block.mlp[2]
            x, qkv = norm_linear(x, y, block.attn_ln, Projection(attn.qkv_weight, attn.qkv_bias))
            if per_slot > 1:  # every token's K/V in place before any token attends
                kv = qkv.view(rows // per_slot, per_slot, 3, attn.n_head, cache.head_dim)[:, :, 1:]
                cache.self_kv_layers[i][:, slots, :, :per_slot] = kv.permute(2, 0, 3, 1, 4)
            o = decode_attention.self_attention_step(
                qkv, cache.self_k_layers[i], cache.self_v_layers[i], positions, slot_start, pdl=pdl, invariant=True,
                rows_per_slot=per_slot,
            )  # fmt: skip
            x, q = norm_linear(x, linear(o, attn.out), block.cross_attn_ln, cross.query)
            q = q.view(rows // per_slot, per_slot, cross.n_head, -1).transpose(1, 2)  # (slots, heads, t, dim)
            k, v, k_scale, v_scale = cache.cross_layer(i, slice(None))
            o = fixed_split_attention(q, k, v, k_scale, v_scale, kernels, *cross_rows, pdl=pdl)
            o = o.transpose(1, 2).reshape(rows, 1, -1)
            x, f = norm_linear(x, linear(o, cross.out), block.mlp_ln, fc1, gelu=True)
            y = linear(f, fc2)
        return add_norm(x, y, dec.ln, pdl, warps=norm_warps)[1]

    def logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        n_vocab = self.decoder.token_embedding.weight.shape[0]
        if out is None:
            out = torch.empty(*hidden.shape[:-1], n_vocab, dtype=torch.float32, device=hidden.device)
        return invariant_ops.linear(
            hidden, self.output_weight, out=out, n_valid=n_vocab, pdl=self.kernels.pdl,
            few_rows=self.kernels.invariant_few_rows,
        )  # fmt: skip

    def projection(self, hidden: Tensor) -> Tensor:
        return self.logits(hidden)

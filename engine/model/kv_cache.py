"""Per-slot self- and cross-attention caches, preallocated once and written in place."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.kernels.int8_attention import SCALE_DTYPE
from engine.model.dims import ModelDimensions


@dataclass(frozen=True, slots=True)
class CacheShape:
    n_layer: int
    n_head: int
    head_dim: int
    n_text_ctx: int  # self-attention positions per slot (decoder limit, 448)
    n_audio_ctx: int  # cross-attention positions per slot (encoder output length, 1500)

    @classmethod
    def for_model(cls, dims: ModelDimensions, max_audio_ctx: int | None, max_text_ctx: int | None) -> CacheShape:
        # The cross cache holds every encoder position; sizing it from a smaller configured limit
        # would silently truncate attention over the audio, so such a configuration is refused.
        if max_audio_ctx is not None and max_audio_ctx < dims.n_audio_ctx:
            raise ValueError(
                f"max_audio_ctx={max_audio_ctx} is below the encoder's output length "
                f"n_audio_ctx={dims.n_audio_ctx}: the cross-attention cache must hold all {dims.n_audio_ctx} positions"
            )
        if max_text_ctx is not None and max_text_ctx > dims.n_text_ctx:
            raise ValueError(f"max_text_ctx={max_text_ctx} exceeds the decoder's n_text_ctx={dims.n_text_ctx}")
        return cls(
            n_layer=dims.n_text_layer,
            n_head=dims.n_text_head,
            head_dim=dims.n_text_state // dims.n_text_head,
            n_text_ctx=max_text_ctx or dims.n_text_ctx,
            n_audio_ctx=dims.n_audio_ctx,
        )

    def bytes_per_slot(self, dtype: torch.dtype, int8_cross: bool = False) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        vectors = 2 * self.n_layer * self.n_head  # K and V, every layer
        scale = torch.empty((), dtype=SCALE_DTYPE).element_size()
        cross = self.head_dim + scale if int8_cross else self.head_dim * elem  # int8 values and their scale
        return vectors * (self.n_text_ctx * self.head_dim * elem + self.n_audio_ctx * cross)


class KVCache:
    """self_k/self_v: (layers, slots, heads, n_text_ctx, head_dim); cross_k/cross_v: (..., n_audio_ctx, ...).

    self_k and self_v are the two halves of one tensor, self_kv (layers, 2, slots, ...), so a decoder step writes
    a layer's new keys and values with one indexed copy instead of two (one kernel fewer per layer and step).
    With `int8_cross` the cross cache holds int8 vectors and cross_k_scale/cross_v_scale (layers, slots, heads,
    n_audio_ctx) their bfloat16 scales (engine/kernels/int8_attention.py); otherwise the scales are None."""

    def __init__(
        self, shape: CacheShape, num_slots: int, dtype: torch.dtype, device: torch.device, int8_cross: bool = False
    ):
        self.shape = shape
        self.num_slots = num_slots
        self.head_dim = shape.head_dim
        common = (shape.n_layer, num_slots, shape.n_head)
        self.self_kv = torch.zeros(
            shape.n_layer, 2, num_slots, shape.n_head, shape.n_text_ctx, shape.head_dim, dtype=dtype, device=device
        )
        self.self_k, self.self_v = self.self_kv[:, 0], self.self_kv[:, 1]
        cross_dtype = torch.int8 if int8_cross else dtype
        self.cross_k = torch.zeros(*common, shape.n_audio_ctx, shape.head_dim, dtype=cross_dtype, device=device)
        self.cross_v = torch.zeros_like(self.cross_k)
        self.cross_k_scale = self.cross_v_scale = None
        if int8_cross:
            self.cross_k_scale = torch.zeros(*common, shape.n_audio_ctx, dtype=SCALE_DTYPE, device=device)
            self.cross_v_scale = torch.zeros_like(self.cross_k_scale)

        # each layer's view, made once: indexing [layer] at every use adds an operation per access, and a CPU
        # decode step is bound by the count of its small operations (see model.TextDecoder.forward)
        self.self_kv_layers = self.self_kv.unbind(0)
        self.self_k_layers, self.self_v_layers = self.self_k.unbind(0), self.self_v.unbind(0)
        self.cross_k_layers, self.cross_v_layers = self.cross_k.unbind(0), self.cross_v.unbind(0)
        self.cross_scale_layers = None
        if int8_cross:
            self.cross_scale_layers = list(zip(self.cross_k_scale.unbind(0), self.cross_v_scale.unbind(0)))

    @property
    def int8_cross(self) -> bool:
        return self.cross_k_scale is not None

    def cross_layer(self, layer: int, slots: slice) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """One layer's cross K and V of the slots, as views (read and written in place), and their scales when
        the cache is int8 (else None)."""
        k, v = self.cross_k_layers[layer][slots], self.cross_v_layers[layer][slots]
        if self.cross_scale_layers is None:
            return k, v, None, None
        k_scale, v_scale = self.cross_scale_layers[layer]
        return k, v, k_scale[slots], v_scale[slots]

    def move_slots(self, moves: list[tuple[int, int, int]]) -> None:
        """Copy sequences' caches to other slots (keeps running sequences contiguous): (source, destination, cached
        self positions) per sequence, sources and destinations disjoint. A run of consecutive sources going to
        consecutive destinations moves in one copy per tensor (a finished admission batch frees a run of slots
        that the last-admitted run fills)."""
        for src, dst, n, self_len in _runs(moves):
            _copy_bytes(self.self_kv[:, :, dst : dst + n, :, :self_len], self.self_kv[:, :, src : src + n, :, :self_len])
            for t in (self.cross_k, self.cross_v, self.cross_k_scale, self.cross_v_scale):
                if t is not None:
                    _copy_bytes(t[:, dst : dst + n], t[:, src : src + n])

    def copy_self(self, copies: list[tuple[int, int]], num_positions: int) -> None:
        """Copy self-attention prefixes between slots (a beam forking from another): (source, destination) per
        copy, no slot both. One gather and one scatter for all of them."""
        src = torch.tensor([c[0] for c in copies], device=self.self_kv.device)
        dst = torch.tensor([c[1] for c in copies], device=self.self_kv.device)
        prefix = self.self_kv[:, :, :, :, :num_positions]
        prefix.index_copy_(2, dst, prefix.index_select(2, src))

    def copy_cross(self, source: int, destinations: list[int]) -> None:
        """The cross-attention keys and values (and scales) of slot `source` into each slot of `destinations`."""
        for t in (self.cross_k, self.cross_v, self.cross_k_scale, self.cross_v_scale):
            if t is not None:
                for dst in destinations:
                    _copy_bytes(t[:, dst], t[:, source])


def _runs(moves: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int]]:
    """(source, destination, count, longest self prefix) for each run of moves whose sources and destinations both
    step by one; a run copies its longest prefix in every slot (positions past a sequence's own are never read)."""
    runs: list[list[int]] = []
    for src, dst, self_len in sorted(moves, key=lambda m: m[1]):
        last = runs[-1] if runs else None
        if last is not None and src == last[0] + last[2] and dst == last[1] + last[2]:
            last[2] += 1
            last[3] = max(last[3], self_len)
        else:
            runs.append([src, dst, 1, self_len])
    return [(a, b, n, m) for a, b, n, m in runs]


def _copy_bytes(dst: Tensor, src: Tensor) -> None:
    """dst.copy_(src) for views of one layout, through the widest integer elements that tile their bytes: a copy
    of a non-contiguous view runs element by element, and with 1-byte (int8 cache) or 2-byte elements that reaches
    a fraction of the memory bandwidth (H200, large-v3's int8 cross cache: ~150 us per slot, ~2% of a 256-window
    run spent in moves)."""
    dst_words, src_words = _as_words(dst), _as_words(src)
    if dst_words.dtype != src_words.dtype:
        dst_words, src_words = dst, src
    dst_words.copy_(src_words)


def _as_words(t: Tensor) -> Tensor:
    """t's bytes as the widest integer elements that tile its rows, strides and offset (t itself where none does)."""
    elem = t.element_size()
    if t.stride(-1) != 1:
        return t
    for dtype in (torch.int64, torch.int32, torch.int16):
        width = dtype.itemsize
        offsets = [t.shape[-1], t.storage_offset(), *t.stride()[:-1]]
        if width > elem and all(x * elem % width == 0 for x in offsets):
            return t.view(dtype)
    return t


def plan_num_slots(
    shape: CacheShape,
    dtype: torch.dtype,
    device: torch.device,
    memory_fraction: float,
    reserve_bytes: int,
    int8_cross: bool = False,
) -> tuple[int, str]:
    """Slots that fit in the device memory left after weights and activations; with a log line saying why."""
    per_slot = shape.bytes_per_slot(dtype, int8_cross)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * memory_fraction) - (total - free) - reserve_bytes
    else:
        # On CPU the caches live in RAM; a fixed budget keeps the footprint predictable.
        budget = 4 * 1024**3
    num = budget // per_slot
    why = (
        f"{per_slot / 2**20:.1f} MiB per slot (self {shape.n_text_ctx} + cross {shape.n_audio_ctx} positions"
        f"{', int8 cross' if int8_cross else ''}, "
        f"{shape.n_layer} layers), budget {max(budget, 0) / 2**30:.2f} GiB"
    )
    if num < 1:
        raise RuntimeError(
            f"Not even one decode slot fits: {why}. Each slot needs {per_slot / 2**20:.1f} MiB. "
            "Raise --gpu-memory-fraction, free GPU memory, or use a smaller model or dtype."
        )
    return int(num), why

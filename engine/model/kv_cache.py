"""Per-slot self- and cross-attention caches, preallocated once and written in place."""

from __future__ import annotations

import math
import mmap
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

    def self_bytes(self, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.n_layer * self.n_head * self.n_text_ctx * self.head_dim * elem  # K and V, every layer

    def cross_bytes(self, dtype: torch.dtype, int8_cross: bool = False) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        scale = torch.empty((), dtype=SCALE_DTYPE).element_size()
        cross = self.head_dim + scale if int8_cross else self.head_dim * elem  # int8 values and their scale
        return 2 * self.n_layer * self.n_head * self.n_audio_ctx * cross


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """torch.zeros, but on a CPU in anonymous memory that the operating system zeroes a page at a time when it is
    first written: the caches are sized for every slot (32 sequences on a CPU), and the slots a server does not use
    then take no resident memory (torch.zeros writes every byte up front, about 700 MiB for tiny.en)."""
    count = math.prod(shape)
    if device.type != "cpu" or count == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    size = count * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, size), dtype=dtype, count=count).view(shape)


class KVCache:
    """self_k/self_v: (layers, slots, heads, n_text_ctx, head_dim); cross_k/cross_v: (..., n_audio_ctx, ...).

    self_k and self_v are the two halves of one tensor, self_kv (layers, 2, slots, ...), so a decoder step writes
    a layer's new keys and values with one indexed copy instead of two (one kernel fewer per layer and step).
    With `int8_cross` the cross cache holds int8 vectors and cross_k_scale/cross_v_scale (layers, slots, heads,
    n_audio_ctx) their bfloat16 scales (engine/kernels/int8_attention.py); otherwise the scales are None."""

    def __init__(
        self, shape: CacheShape, num_slots: int, dtype: torch.dtype, device: torch.device, int8_cross: bool = False,
        num_cross_slots: int | None = None,
    ):  # fmt: skip
        self.shape = shape
        self.num_slots = num_slots
        self.num_cross_slots = num_cross_slots or num_slots
        self.head_dim = shape.head_dim
        common = (shape.n_layer, self.num_cross_slots, shape.n_head)
        self.self_kv = zeros(
            (shape.n_layer, 2, num_slots, shape.n_head, shape.n_text_ctx, shape.head_dim), dtype, device
        )
        self.self_k, self.self_v = self.self_kv[:, 0], self.self_kv[:, 1]
        cross_dtype = torch.int8 if int8_cross else dtype
        self.cross_k = zeros((*common, shape.n_audio_ctx, shape.head_dim), cross_dtype, device)
        self.cross_v = zeros(self.cross_k.shape, cross_dtype, device)
        self.cross_k_scale = self.cross_v_scale = None
        if int8_cross:
            self.cross_k_scale = zeros((*common, shape.n_audio_ctx), SCALE_DTYPE, device)
            self.cross_v_scale = zeros(self.cross_k_scale.shape, SCALE_DTYPE, device)

        # each layer's view, made once: indexing [layer] at every use adds an operation per access, and a CPU
        # decode step is bound by the count of its small operations (see model.TextDecoder.forward)
        self.self_kv_layers = self.self_kv.unbind(0)
        self.self_k_layers, self.self_v_layers = self.self_k.unbind(0), self.self_v.unbind(0)
        self.cross_k_layers, self.cross_v_layers = self.cross_k.unbind(0), self.cross_v.unbind(0)
        self.cross_scale_layers = None
        if int8_cross:
            self.cross_scale_layers = list(zip(self.cross_k_scale.unbind(0), self.cross_v_scale.unbind(0)))

        # Which cross slot each row (self slot) reads, on the host and on the device (the kernels read it; a graph
        # reads it where it lives). Rows of one beam search share their window's cross slot. `cross_order`: the
        # running rows sorted by cross slot, then the other rows in order, a permutation the GPU kernels walk so
        # that the rows reading one slot run side by side and its bytes come from the L2 cache after the first.
        index_dtype = torch.int64 if device.type == "cpu" else torch.int32  # the CPU kernels take C longs
        self.row_cross = [i % self.num_cross_slots for i in range(num_slots)]
        self._row_maps = torch.tensor([self.row_cross, list(range(num_slots))], dtype=index_dtype, device=device)
        self.cross_index, self.cross_order = self._row_maps.unbind(0)
        self._runs: dict[tuple[int, int], list[tuple[int, int, int, bool, int]]] = {}
        self._order_rows = -1  # how many leading rows cross_order sorts
        # How many leading positions of each cross slot its window filled: n_audio_ctx, or fewer where the encoder
        # ran on a short context (the window's audio and a margin, fill_cross_cache); a row attends to those only.
        # On the host, and for the CPU kernels as int64 (a backend without short contexts never reads it).
        self.cross_len = [shape.n_audio_ctx] * self.num_cross_slots
        self.cross_lengths = torch.full((self.num_cross_slots,), shape.n_audio_ctx, dtype=torch.int64)

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

    def set_cross_len(self, slot: int, positions: int) -> None:
        """Cross slot `slot` now holds `positions` encoder positions (fill_cross_cache writes them)."""
        if self.cross_len[slot] != positions:
            self.cross_len[slot] = positions
            self.cross_lengths[slot] = positions
            self._runs.clear()

    def map_rows(self, start: int, cross_slots: list[int]) -> None:
        """Rows start.. read the cross slots `cross_slots` (one per row) from the next launch on. The device maps
        are written only when they change (admissions and releases), in one copy ordered after the steps already
        queued."""
        end = start + len(cross_slots)
        if self.row_cross[start:end] == cross_slots and self._order_rows == end:
            return
        self.row_cross[start:end] = cross_slots
        order = sorted(range(end), key=self.row_cross.__getitem__) + list(range(end, self.num_slots))
        self._row_maps.copy_(torch.tensor([self.row_cross, order], dtype=self._row_maps.dtype), non_blocking=True)
        self._order_rows = end
        self._runs.clear()

    def cross_runs(self, start: int, n: int) -> list[tuple[int, int, int, bool, int]]:
        """Rows start..start+n as runs a slice of the cross cache serves: (first row - start, end row - start,
        first cross slot, shared, positions), where a run either reads consecutive cross slots, one per row, or
        (shared) one slot for all its rows (a beam search's), and all its slots hold `positions` encoder positions.
        Without beams, short contexts and with a fresh layout: one run."""
        key = (start, n)
        runs = self._runs.get(key)
        if runs is None:
            rows = self.row_cross[start : start + n]
            runs = self._runs[key] = _cross_runs(rows, [self.cross_len[slot] for slot in rows])
        return runs

    def cross_slots_of(self, start: int, n: int) -> tuple[Tensor, Tensor | None]:
        """The device index of rows start..start+n into the cross cache, and the order in which to walk them (rows
        sharing a slot side by side) where the rows start at 0 (the running rows; else None: in order)."""
        return self.cross_index[start : start + n], self.cross_order if start == 0 else None

    def move_slots(self, moves: list[tuple[int, int, int]]) -> None:
        """Copy sequences' self-attention caches to other rows (keeps running sequences contiguous): (source,
        destination, cached self positions) per sequence, sources and destinations disjoint. A run of consecutive
        sources going to consecutive destinations moves in one copy. The cross caches stay where they are: a row
        finds its own through `row_cross`."""
        for src, dst, n, self_len in _runs(moves):
            _copy_bytes(self.self_kv[:, :, dst : dst + n, :, :self_len], self.self_kv[:, :, src : src + n, :, :self_len])

    def copy_self(self, copies: list[tuple[int, int]], num_positions: int) -> None:
        """Copy self-attention prefixes between rows (beams forking from others): (source, destination) per copy,
        no row both. One gather and one scatter for all of them, queued without waiting for the device (a
        blocking copy of the indices would wait for the steps in flight)."""
        pairs = torch.tensor(copies, dtype=torch.int64).t().contiguous()
        src, dst = pairs.to(self.self_kv.device, non_blocking=True).unbind(0)
        prefix = self.self_kv[:, :, :, :, :num_positions]
        prefix.index_copy_(2, dst, prefix.index_select(2, src))


def _cross_runs(cross: list[int], lengths: list[int]) -> list[tuple[int, int, int, bool, int]]:
    runs: list[list] = []  # [start, end, first cross slot, kind: None (one row), "seq" or "shared", positions]
    for row, (slot, length) in enumerate(zip(cross, lengths)):
        last = runs[-1] if runs else None
        if last is None or length != last[4]:
            runs.append([row, row + 1, slot, None, length])
        elif last[3] != "shared" and slot == last[2] + (last[1] - last[0]):
            last[1], last[3] = row + 1, "seq"
        elif last[3] != "seq" and slot == last[2]:
            last[1], last[3] = row + 1, "shared"
        else:
            runs.append([row, row + 1, slot, None, length])
    return [(a, b, c, kind == "shared", n) for a, b, c, kind, n in runs]


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
    max_rows: int | None = None,
    rows_asked: bool = False,
    shared_gpu: bool = False,
) -> tuple[int, int, str]:
    """Rows (self-attention slots: sequences decoded at once) and cross slots (windows decoded at once) that fit in
    the device memory left after weights and activations, with a log line saying why. A row and a cross slot come
    in pairs, as many as fit up to `max_rows`; when the rows were asked for (`rows_asked`: --max-num-seqs) and
    their pairs do not fit, all the rows are kept and the cross slots take what memory is left: a window's beams
    are rows that share one cross slot. On a GPU the budget is `memory_fraction` of its memory less all that is in
    use; on a GPU `shared_gpu` with other engines (data parallel), less this process's own use only, and never
    more than is free: the engines' fractions then add up whatever order they start or restart in."""
    per_row, per_cross = shape.self_bytes(dtype), shape.cross_bytes(dtype, int8_cross)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        if shared_gpu:
            budget = min(int(total * memory_fraction) - torch.cuda.memory_reserved(device), free) - reserve_bytes
        else:
            budget = int(total * memory_fraction) - (total - free) - reserve_bytes
    else:
        # On CPU the caches live in RAM; a fixed budget keeps the footprint predictable.
        budget = 4 * 1024**3
    pairs = budget // (per_row + per_cross)
    rows = cross = min(pairs, max_rows) if max_rows else pairs
    if rows_asked and max_rows and pairs < max_rows:
        rows = max_rows
        cross = min(rows, (budget - rows * per_row) // per_cross)
        if cross < 1:
            rows = cross = pairs
    why = (
        f"{per_row / 2**20:.1f} MiB per row (self {shape.n_text_ctx} positions), {per_cross / 2**20:.1f} MiB per "
        f"cross slot ({shape.n_audio_ctx} positions{', int8' if int8_cross else ''}), {shape.n_layer} layers, "
        f"budget {max(budget, 0) / 2**30:.2f} GiB"
    )
    if cross < 1:
        raise RuntimeError(
            f"Not even one decode slot fits: {why}. Each window needs {(per_row + per_cross) / 2**20:.1f} MiB. "
            "Raise --gpu-memory-fraction, free GPU memory, or use a smaller model or dtype."
        )
    return int(rows), int(cross), why

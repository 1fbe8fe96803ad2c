"""LoRA adapters in PEFT's format, applied beside the model's products, each row of a pass on its own adapter.

An adapter holds, for some of the model's products (the q/k/v/out projections and fc1/fc2 that PEFT targets in
Whisper's encoder and decoder), two low-rank matrices A (r, in) and B (out, r): the adapted product is
W x + s B A x, s = alpha / r (alpha / sqrt(r) under rsLoRA), and B is kept multiplied by s. The rows of one pass
may each use a different adapter or none (the S-LoRA / Punica idea): the base product runs once over every row,
exactly as without adapters, and each adapter's two small products run over its own rows only. A pass costs the
adapters its rows use; a pass whose rows use none costs nothing more.

Before each pass the runner says which adapter each row uses (Adapters.use, 0 for none); the paths that compute a
product add what the rows' adapters give (Adapters.add_to): the layer operations (with_adapters), the CPU's
native decode kernels and its int8 encoder products. On a GPU a pass over whole windows (the encoder, the cross
K/V) instead runs each product on its weight with the adapter merged in, made for that product and dropped after
it: all of the pass's windows at once where they use one adapter (Adapters.merged), else each run of consecutive
windows of one adapter (the runner orders an encoder pass's windows by adapter) on its own merged weight
(Adapters.merged_runs, where the backend's products write a run's rows in place, LayerOps.linear_into; the
batch-invariant ones add the deltas). Its windows then cost what the base model's do, plus one read and write of
each weight an adapter changes; the deltas would read each window's 1,500 positions once more and read and write its
outputs again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernels import lora as lora_kernels
from engine.kernels import lora_merge
from engine.model.dims import ModelDimensions
from engine.model.layer_ops import LayerOps, Projection
from engine.model.sources import ADAPTER_FILES, resolve_adapter
from engine.model.weights import openai_name

MAX_RANK = 64
# The fewest positions (eight 30 s windows) of one adapter's run that merged_runs merges for: each run costs every
# product a launch more, which the host must issue; below this the deltas over the whole pass cost less than the
# GPU's wait for those launches (benchmarks/gpu_profile.py --loras 16: merging every run of two windows took
# GPU work off and left the GPU waiting for the host; docs/benchmarks/2026-12-07-lora-merge-kernel.md)
MERGED_RUN_MIN_POSITIONS = 12_000
# The most bytes of merged weights that one launch of the merge kernel makes (merged_runs): a product's merges of
# several runs at once, held until their products are done, within the activations' reserve
MERGE_BYTES = 128 << 20
CONFIG_FILE, WEIGHTS_FILE = ADAPTER_FILES
MAX_CONFIG_BYTES = 1 << 20
_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be used with this model: its files, its configuration or its shapes; the message
    names what and never the directory."""


def products(dims: ModelDimensions) -> dict[str, tuple[int, int]]:
    """The products an adapter may target, by openai/whisper name: (out features, in features)."""
    shapes = {}
    for side, n, layers, cross in (
        ("encoder", dims.n_audio_state, dims.n_audio_layer, False),
        ("decoder", dims.n_text_state, dims.n_text_layer, True),
    ):
        for i in range(layers):
            for attn in ("attn", "cross_attn") if cross else ("attn",):
                for proj in ("query", "key", "value", "out"):
                    shapes[f"{side}.blocks.{i}.{attn}.{proj}"] = (n, n)
            shapes[f"{side}.blocks.{i}.mlp.0"] = (4 * n, n)
            shapes[f"{side}.blocks.{i}.mlp.2"] = (n, 4 * n)
    return shapes


@dataclass(frozen=True)
class LoraProduct:
    a: Tensor  # (r, in)
    b: Tensor  # (out, r), multiplied by the adapter's scale


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    rank: int  # the largest of its products'
    weights: dict[str, LoraProduct]  # by openai/whisper product name

    @property
    def nbytes(self) -> int:
        return sum(p.a.nbytes + p.b.nbytes for p in self.weights.values())

    @classmethod
    def load(cls, name: str, folder: str | Path, dims: ModelDimensions, dtype: torch.dtype, device: torch.device):
        """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors), or a hub id fetched into the
        Hugging Face cache, checked against the model."""
        from safetensors import SafetensorError, safe_open

        folder = resolve_adapter(str(folder))
        config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
        if not config_path.is_file() or not weights_path.is_file():
            raise AdapterError(f"adapter {name!r}: a PEFT LoRA directory holds {CONFIG_FILE} and {WEIGHTS_FILE}")
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes")
        try:
            config = json.loads(config_path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} is not JSON ({e})") from None
        _check_config(name, config)
        shapes = products(dims)
        halves: dict[str, dict[str, Tensor]] = {}
        peft_names: dict[str, str] = {}
        try:
            with safe_open(weights_path, framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    match = _LORA_KEY.match(key)
                    if match is None:
                        raise AdapterError(f"adapter {name!r}: tensor {key!r} is not a LoRA A or B matrix")
                    module = match["module"].removeprefix(_PEFT_PREFIX).removeprefix("model.")
                    target = openai_name(module + ".weight").removesuffix(".weight")
                    if target not in shapes:
                        raise AdapterError(f"adapter {name!r}: {module!r} is not a product an adapter may change here")
                    # its shape from the header, before its bytes are read: A (r, in), B (out, r), r <= MAX_RANK
                    shape, (out, inp) = tuple(f.get_slice(key).get_shape()), shapes[target]
                    rank = (shape[0] if match["half"] == "A" else shape[1]) if len(shape) == 2 else 0
                    expected = (rank, inp) if match["half"] == "A" else (out, rank)
                    if shape != expected:
                        raise AdapterError(
                            f"adapter {name!r}: {module!r} has lora_{match['half']} {shape}; this model's product "
                            f"is {out} x {inp} (an adapter of another model size?)"
                        )
                    if not 1 <= rank <= MAX_RANK:
                        raise AdapterError(f"adapter {name!r}: rank {rank} of {module!r}; at most {MAX_RANK}")
                    halves.setdefault(target, {})[match["half"]] = f.get_tensor(key)
                    peft_names[target] = module
        except (SafetensorError, OSError) as e:  # a truncated or foreign file
            raise AdapterError(f"adapter {name!r}: {WEIGHTS_FILE} cannot be read ({type(e).__name__})") from None
        if not halves:
            raise AdapterError(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA matrices")
        weights = {}
        for target, pair in halves.items():
            if set(pair) != {"A", "B"}:
                raise AdapterError(f"adapter {name!r}: {peft_names[target]!r} lacks its lora_A or lora_B matrix")
            a, b = pair["A"], pair["B"]
            rank = a.shape[0]
            if b.shape[1] != rank:
                raise AdapterError(f"adapter {name!r}: {peft_names[target]!r} has lora_A of rank {rank} and lora_B "
                                   f"of rank {b.shape[1]}")  # fmt: skip
            scale = _scale(config, peft_names[target], rank)
            weights[target] = LoraProduct(
                a.to(device=device, dtype=dtype).contiguous(),
                (b.float() * scale).to(device=device, dtype=dtype).contiguous(),
            )
        return cls(name, max(p.a.shape[0] for p in weights.values()), weights)


def _check_config(name: str, config: dict) -> None:
    def refuse(what: str) -> AdapterError:
        return AdapterError(f"adapter {name!r}: {what}")

    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise refuse("only PEFT LoRA adapters (peft_type LORA) are supported")
    if config.get("use_dora"):
        raise refuse("DoRA adapters (use_dora) are not supported")
    if config.get("bias", "none") != "none":
        raise refuse("adapters that train biases (bias other than 'none') are not supported")
    if config.get("modules_to_save"):
        raise refuse("adapters with modules_to_save (whole trained copies of modules) are not supported")
    if config.get("fan_in_fan_out"):
        raise refuse("fan_in_fan_out is for Conv1D layers, which Whisper has none of")
    alpha = config.get("lora_alpha", 8)
    patterns = config.get("alpha_pattern") or {}
    if not isinstance(alpha, int | float) or not isinstance(patterns, dict):
        raise refuse("lora_alpha must be a number and alpha_pattern an object")


def _scale(config: dict, module: str, rank: int) -> float:
    """PEFT's scaling of one module: its alpha (alpha_pattern's first match, else lora_alpha) over its rank, or over
    the rank's square root under rsLoRA."""
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = value
            break
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)


class Adapters:
    """A model's resident adapters, by index (1, 2, ...; 0 is none), and the adapter of each row of the pass being
    run. At most `capacity` stay resident.

    Their matrices are also kept stacked, by product as the model's weights hold them (a fused q/k/v is one product
    of three slices): A (capacity + 1, slices, R, in) and B (capacity + 1, slices, out, R), zeros where an adapter
    has a smaller rank or lacks the product and in index 0. On a CPU, R is the largest resident rank and only the
    products some adapter targets are stacked. A pass whose rows use one adapter runs its two products over those
    rows; one whose rows use several gathers each row's A and B from the stacks and runs two batched products over
    every row (rows without an adapter gather zeros and add exactly nothing).

    On a GPU the stacks hold every product at `max_rank` from the start, so their addresses never change and the
    decode graphs captured over them serve any adapters loaded later. A step's rows (one token each) then go through
    engine/kernels/lora.py: the rows sorted by adapter in a table on the device that use() fills, the same two
    kernels per product whatever the mix. Passes of many positions per row (the encoder, prompts, alignment) take
    the torch paths above."""

    def __init__(
        self, dims: ModelDimensions, capacity: int, dtype: torch.dtype, device: torch.device,
        groups: list[tuple[str, ...]] | None = None, max_rank: int = MAX_RANK, pdl: bool = False,
    ):  # fmt: skip
        self.dims, self.capacity, self.dtype, self.device = dims, capacity, dtype, device
        # the kernels launched as programmatic dependents (KernelOptions.pdl) at any row count: each one's start
        # overlaps the kernel before it, and a layer runs 12 of them (benchmarks/lora_kernels.py --pdl 0 1)
        self.pdl = pdl
        self.shapes = products(dims)
        # the products as the model's weights hold them (a fused q/k/v together, its parts not again), every other
        # one alone
        fused = [group for group in groups or [] if len(group) > 1]
        grouped = {name for group in fused for name in group}
        self.groups = sorted({*fused, *((name,) for name in self.shapes if name not in grouped)})
        self.max_rank = max_rank
        self.indices: dict[str, int] = {}
        self.loaded: dict[int, LoraAdapter] = {}
        self.group_stacks: dict[tuple[str, ...], tuple[Tensor, Tensor]] = {}
        self.stacks: dict[str, tuple[Tensor, Tensor]] = {}  # each product's slice of its group's stacks
        self.static = device.type == "cuda" and lora_kernels.triton is not None
        # whole windows' passes on merged weights (merged): a GPU's; a CPU's encoder products are the int8 kernels,
        # which add the deltas themselves
        self.merges = device.type == "cuda"
        self.min_run_positions = MERGED_RUN_MIN_POSITIONS
        self.ranks: Tensor | None = None  # (capacity + 1,) int32 on the GPU: each index's rank
        self.table: Tensor | None = None  # the step's rows by adapter, on the GPU (reserve_rows)
        self.partial: Tensor | None = None  # the kernel's parts of A x
        self.max_rows = self.table_segments = 0
        if self.static:
            self.ranks = torch.zeros(capacity + 1, dtype=torch.int32, device=device)
            self._allocate(max_rank, self.groups)
        # the pass's rows (use), and what the torch paths need of them, made when first needed
        self._row_list: list[int] = []
        self._active = False
        self._kernel_rows = 0  # rows of one token each that the kernel serves this pass (0: none)
        self._torch_state: tuple[tuple[LoraAdapter, Tensor | None] | None, Tensor | None] | None = None
        self._pass_indices: dict[tuple[int, ...], Tensor] = {}  # adapter indices on the device (_device_indices)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.group_stacks.values())

    def reserve_rows(self, rows: int) -> None:
        """The device table for steps of up to `rows` rows (the GPU's decode slots)."""
        if self.static:
            self.max_rows, self.table_segments = rows, lora_kernels.max_segments(rows, self.capacity)
            self.table = torch.zeros(rows + 3 * self.table_segments, dtype=torch.int32, device=self.device)
            slices = max(len(group) for group in self.groups)
            elements = lora_kernels.partial_elements(self.table_segments, slices, self.max_rank)
            self.partial = torch.empty(elements, dtype=torch.float32, device=self.device)

    def add(self, name: str, folder: str | Path) -> LoraAdapter:
        if name in self.indices:
            raise AdapterError(f"adapter {name!r} is already loaded")
        if len(self.loaded) >= self.capacity:
            raise AdapterError(f"{self.capacity} adapters are resident, the most this server keeps; remove one first")
        adapter = LoraAdapter.load(name, folder, self.dims, self.dtype, self.device)
        if self.static and adapter.rank > self.max_rank:
            raise AdapterError(f"adapter {name!r} has rank {adapter.rank}; this engine's adapters have at most "
                               f"{self.max_rank} (max_lora_rank)")  # fmt: skip
        index = next(i for i in range(1, self.capacity + 2) if i not in self.loaded)
        self.indices[name], self.loaded[index] = index, adapter
        self._stack()
        return adapter

    def remove(self, name: str) -> None:
        self.loaded.pop(self.indices.pop(name))
        self._stack()

    def _allocate(self, rank: int, groups: list[tuple[str, ...]]) -> None:
        self.group_stacks, self.stacks = {}, {}
        for group in groups:
            out, inp = self.shapes[group[0]]
            a = torch.zeros(self.capacity + 1, len(group), rank, inp, dtype=self.dtype, device=self.device)
            b = torch.zeros(self.capacity + 1, len(group), out, rank, dtype=self.dtype, device=self.device)
            self.group_stacks[group] = (a, b)
            for j, name in enumerate(group):
                self.stacks[name] = (a[:, j], b[:, j])

    def _stack(self) -> None:
        if self.static:  # in place: captured graphs read these addresses
            for a, b in self.group_stacks.values():
                a.zero_()
                b.zero_()
            ranks = [0] * (self.capacity + 1)
            for index, adapter in self.loaded.items():
                ranks[index] = adapter.rank
            self.ranks.copy_(torch.tensor(ranks, dtype=torch.int32))
        else:
            rank = max((a.rank for a in self.loaded.values()), default=0)
            targeted = {name for a in self.loaded.values() for name in a.weights}
            self._allocate(rank, [g for g in self.groups if targeted.intersection(g)])
        for index, adapter in self.loaded.items():
            for name, w in adapter.weights.items():
                a, b = self.stacks[name]
                a[index, : w.a.shape[0]] = w.a
                b[index, :, : w.b.shape[1]] = w.b

    def index(self, name: str | None) -> int:
        """The adapter's index (0 for None); KeyError for one not resident."""
        return 0 if name is None else self.indices[name]

    def use(self, rows: list[int]) -> None:
        """The adapter index of each row of the passes that follow (0: the base model)."""
        self._row_list, self._active, self._torch_state, self._kernel_rows = rows, any(rows), None, 0
        self._pass_indices = {}
        if self._active and self.table is not None and len(rows) <= self.max_rows:
            table = lora_kernels.segments(np.asarray(rows, dtype=np.int32), self.max_rows, self.table_segments)
            # from pinned memory the copy is queued behind the step in flight instead of waiting for it
            self.table.copy_(torch.from_numpy(table).pin_memory(), non_blocking=True)
            self._kernel_rows = len(rows)

    def repeat_rows(self, times: int) -> None:
        """Each row of the pass as `times` consecutive rows (a prompt's tokens run as rows of a step)."""
        self.use([index for index in self._row_list for _ in range(times)])

    @contextmanager
    def capturing(self, rows: int):
        """Passes of `rows` one-token rows that launch the kernel for whatever use() puts in the table later (a
        graph's capture)."""
        self._row_list, self._active, self._torch_state, self._kernel_rows = [], True, None, rows
        self._pass_indices = {}
        try:
            yield
        finally:
            self.use([])

    @property
    def active(self) -> bool:
        """Whether a row of the pass uses an adapter."""
        return self._active

    def _kernel_serves(self, x: Tensor) -> bool:
        """Whether `x` is the pass's rows of one token each that the kernel serves (an encoder pass's windows, as
        many as its rows, are not)."""
        return bool(self._kernel_rows) and x.shape[0] == self._kernel_rows and x.numel() == x.shape[0] * x.shape[-1]

    def add_to(self, y: Tensor, names: str | tuple[str, ...], x: Tensor) -> Tensor:
        """y (rows, ..., out) += each row's adapter's product of x (rows, ..., in), in place; `names`: the product, or
        the products whose outputs y holds side by side (a fused q/k/v). Returns y."""
        if not self._active:
            return y
        if isinstance(names, str):
            names = (names,)
        if self._kernel_serves(x):
            stacked = self.group_stacks.get(names)
            if stacked is None and len(names) == 1 and names[0] in self.stacks:  # one part of a fused product
                stacked = tuple(m.unsqueeze(1) for m in self.stacks[names[0]])
            if stacked is not None:
                lora_kernels.add_lora(y, x, self.table, self.max_rows, self.table_segments, *stacked, self.ranks,
                                      self.capacity, self.partial, pdl=self.pdl)  # fmt: skip
            return y
        group, rows = self._torch_paths()
        column = 0
        for name in names:
            width = self.shapes[name][0]
            out = y[..., column : column + width]
            column += width
            if rows is not None:
                stacked = self.stacks.get(name)
                if stacked is not None:
                    a, b = stacked[0][rows], stacked[1][rows]  # each row's: (rows, R, in), (rows, out, R)
                    xs = x.reshape(x.shape[0], -1, x.shape[-1])
                    t = torch.bmm(xs, a.transpose(1, 2))
                    # the sum in the product's epilogue: no pass of its own
                    out.view(x.shape[0], -1, width).baddbmm_(t, b.transpose(1, 2))
                continue
            adapter, members = group
            w = adapter.weights.get(name)
            if w is None:
                continue
            if members is None:
                out2 = out.view(-1, width)  # rows of a fused q/k/v's slice too: a column slice keeps its row stride
                out2.addmm_(F.linear(x.reshape(-1, x.shape[-1]), w.a), w.b.t())
            else:
                out.index_add_(0, members, F.linear(F.linear(x.index_select(0, members), w.a), w.b))
        return y

    def merged(self, weight: Tensor, names: str | tuple[str, ...], x: Tensor) -> Tensor | None:
        """`weight` (out, in) with the pass's adapter merged in, W + B A per product of `names` (a fused q/k/v's
        slices each their own), for a GPU pass whose rows all use one adapter and are many enough that reading and
        writing their inputs and outputs once more (what the deltas cost) outweighs reading and writing the weight
        once (what the merge costs); None where the deltas are cheaper or the stacks do not hold it. `weight` itself
        where the adapter changes none of these products."""
        names = self._mergeable(weight, names, x)
        if names is None or not self._row_list:  # (a graph's capture has no rows)
            return None
        out, inp = weight.shape
        if x.numel() // inp * (out + inp) < out * inp:
            return None
        group, _ = self._torch_paths()
        if group is None or group[1] is not None:  # rows of several adapters, or some on none
            return None
        return self._merge(weight, names, self.indices[group[0].name])

    def merged_runs(
        self, weight: Tensor, names: str | tuple[str, ...], x: Tensor
    ) -> Iterator[tuple[slice, Tensor]] | None:
        """For a GPU pass of whole windows, x (windows, positions, in), whose windows use several adapters (or some
        none) in runs of consecutive windows (the encoder orders them so): each run's windows and `weight` with the
        run's adapter merged in (`weight` itself for the base model's and for an adapter that changes none of
        these products), where every adapter's run is long enough that its merge costs less than its deltas
        (MERGED_RUN_MIN_POSITIONS, and fewer bytes as in merged). One product per
        run then reads each window's input and writes its output once, as a pass without adapters does; the deltas
        would read the input again and read and write the output again, several times a merge's bytes for windows
        of 1,500 positions. None where that does not hold, or for one run (merged)."""
        rows = self._row_list
        names = self._mergeable(weight, names, x)
        if names is None or x.dim() != 3 or x.shape[0] != len(rows):
            return None
        out, inp = weight.shape
        runs, start = [], 0
        for end in range(1, len(rows) + 1):
            if end == len(rows) or rows[end] != rows[start]:
                runs.append((start, end))
                start = end
        positions = x.shape[1]
        if len(runs) < 2 or any(
            rows[start] and (end - start) * positions < max(self.min_run_positions, out * inp / (out + inp))
            for start, end in runs
        ):  # fmt: skip
            return None
        return self._run_weights(weight, names, runs)

    def _run_weights(
        self, weight: Tensor, names: tuple[str, ...], runs: list[tuple[int, int]]
    ) -> Iterator[tuple[slice, Tensor]]:
        """merged_runs' runs and their weights, made as the products come: with the merge kernel, the merges of
        as many runs as MERGE_BYTES holds in one launch, else one run's at a time."""
        rows = self._row_list
        if not lora_merge.applies(weight):
            for start, end in runs:
                yield slice(start, end), self._merge(weight, names, rows[start])
            return
        out, inp = weight.shape
        a, b = self.group_stacks[names]
        per_launch = max(1, MERGE_BYTES // (weight.numel() * weight.element_size()))
        adapted = [run for run in runs if self._changes(rows[run[0]], names)]
        merged: dict[tuple[int, int], Tensor] = {}
        for start, end in runs:
            if adapted and adapted[0] == (start, end):  # the next runs' merges, in one launch
                batch, adapted = adapted[:per_launch], adapted[per_launch:]
                indices = self._device_indices(tuple(rows[s] for s, _ in batch))
                merged = {}  # the last launch's weights, their products done, freed before the next are made
                made = lora_merge.merge(weight.view(len(names), -1, inp), b, a, indices)
                merged = {run: w.view(out, inp) for run, w in zip(batch, made)}
            yield slice(start, end), merged.get((start, end), weight)

    def _mergeable(self, weight: Tensor, names: str | tuple[str, ...], x: Tensor) -> tuple[str, ...] | None:
        """`names` as a tuple where this pass may run `weight`'s product on merged weights: a GPU's, some row on an
        adapter, not the kernels' one-token rows, and the stacks holding the products at the weight's shape."""
        if not self.merges or not self._active or self._kernel_serves(x):
            return None
        if isinstance(names, str):
            names = (names,)
        out, inp = weight.shape
        if names not in self.group_stacks or (len(names) * self.shapes[names[0]][0], self.shapes[names[0]][1]) != (
            out, inp
        ):  # fmt: skip
            return None
        return names

    def _changes(self, index: int, names: tuple[str, ...]) -> bool:
        """Whether the adapter at `index` (0: none) changes any of the products `names`."""
        adapter = self.loaded.get(index)
        return adapter is not None and any(name in adapter.weights for name in names)

    def _merge(self, weight: Tensor, names: tuple[str, ...], index: int) -> Tensor:
        """`weight` (out, in) + B A for the adapter at `index` over the products `names` (a fused q/k/v's slices each
        their own); `weight` itself for index 0 or an adapter that changes none of them."""
        if not self._changes(index, names):
            return weight
        out, inp = weight.shape
        # (adapters, slices, R, in), (adapters, slices, out, R): zeros where an adapter has none
        a, b = self.group_stacks[names]
        sliced = weight.view(len(names), -1, inp)
        if lora_merge.applies(weight):  # one read and one write of the weight, where baddbmm's copy first adds two
            return lora_merge.merge(sliced, b, a, self._device_indices((index,)))[0].view(out, inp)
        return torch.baddbmm(sliced, b[index], a[index]).view(out, inp)

    def _device_indices(self, indices: tuple[int, ...]) -> Tensor:
        """Adapter indices as an int32 tensor on the device, made once per pass (every product of it asks)."""
        made = self._pass_indices.get(indices)
        if made is None:
            made = self._pass_indices[indices] = self._indices(list(indices), torch.int32)
        return made

    def _torch_paths(self) -> tuple[tuple[LoraAdapter, Tensor | None] | None, Tensor | None]:
        """The pass's rows for the torch paths: one adapter's (the adapter, its rows as an index or None for every
        row), or several's (each row's index into the stacks)."""
        if self._torch_state is None:
            rows = self._row_list
            used = set(rows) - {0}
            if len(used) > 1:
                self._torch_state = (None, self._indices(rows))
            else:
                index = used.pop()
                members = [row for row, i in enumerate(rows) if i == index]
                every = len(members) == len(rows)
                self._torch_state = ((self.loaded[index], None if every else self._indices(members)), None)
        return self._torch_state

    def _indices(self, values: list[int], dtype: torch.dtype = torch.int64) -> Tensor:
        """values as an index tensor on the device; on a GPU copied from pinned memory, queued behind the work in
        flight (a copy from pageable memory would wait for the GPU to finish it first)."""
        indices = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return indices
        return indices.pin_memory().to(self.device, non_blocking=True)


def product_names(model: nn.Module) -> dict[int, str | tuple[str, ...]]:
    """Each targetable product weight the model's passes read, by id(), to its name: a fused q/k/v weight to its
    three (in order). Read once the backend has laid the weights out (it may replace them)."""
    names: dict[int, str | tuple[str, ...]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            names[id(module.weight)] = name
        qkv = getattr(module, "qkv_weight", None)
        if qkv is not None:
            names[id(qkv)] = (f"{name}.query", f"{name}.key", f"{name}.value")
    return names


def with_adapters(ops: LayerOps, adapters: Adapters, names: dict[int, str | tuple[str, ...]]) -> LayerOps:
    """`ops` with each product's adapter deltas added for the rows that use one (Adapters.use); on a GPU, passes of
    whole windows take their adapters merged into the weights instead (Adapters.merged, Adapters.merged_runs)."""

    def merged(proj, name, x: Tensor):
        weight = adapters.merged(proj.weight, name, x)
        return None if weight is None else Projection(weight, proj.bias)

    def by_runs(proj, name, x: Tensor, gelu: bool) -> Tensor | None:
        # each run's product writes its rows of the output (a backend without in-place products adds the deltas)
        runs = adapters.merged_runs(proj.weight, name, x) if ops.linear_into is not None else None
        if runs is None:
            return None
        y = x.new_empty(*x.shape[:-1], proj.weight.shape[0])
        for windows, weight in runs:
            ops.linear_into(Projection(weight, proj.bias), x[windows], y[windows], gelu)
        return y

    def linear(proj, x: Tensor, pdl: bool = True) -> Tensor:
        name = names.get(id(proj.weight)) if adapters.active else None
        if name is None:
            return ops.linear(proj, x, pdl)
        if (whole := merged(proj, name, x)) is not None:
            return ops.linear(whole, x, pdl)
        if (y := by_runs(proj, name, x, gelu=False)) is not None:
            return y
        return adapters.add_to(ops.linear(proj, x, pdl), name, x)

    def linear_gelu(proj, x: Tensor) -> Tensor:
        name = names.get(id(proj.weight)) if adapters.active else None
        if name is None:
            return ops.linear_gelu(proj, x)
        if (whole := merged(proj, name, x)) is not None:
            return ops.linear_gelu(whole, x)
        if (y := by_runs(proj, name, x, gelu=True)) is not None:
            return y
        return ops.gelu(adapters.add_to(ops.linear(proj, x), name, x))

    def qkv(attn, x: Tensor) -> Tensor:
        y = ops.qkv(attn, x)
        name = names.get(id(attn.qkv_weight)) if adapters.active else None
        return y if name is None else adapters.add_to(y, name, x)

    return replace(ops, linear=linear, linear_gelu=linear_gelu, qkv=qkv)

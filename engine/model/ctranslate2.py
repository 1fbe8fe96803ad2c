"""CTranslate2 Whisper `model.bin` reader (whole file or split parts) -> openai/whisper state dict."""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from engine.model.dims import ModelDimensions

MAX_BINARY_VERSION = 6
_DTYPES = {0: torch.float32, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.float16, 5: torch.bfloat16}
# Binary versions < 4 store an item size instead of a dtype id; 2 bytes meant int16 then.
_ITEM_SIZE_DTYPES = {4: torch.float32, 2: torch.int16, 1: torch.int8}
# Whisper is GELU (CT2 ActivationType 3), pre-norm, with unscaled embeddings; anything else is another model.
_EXPECTED_FLAGS = {"activation": 3, "pre_norm": 1, "scale_embeddings": 0}


@dataclass(frozen=True, slots=True)
class CT2Model:
    """A CTranslate2 Whisper model mapped to openai/whisper names, plus its config.json fields."""

    dims: ModelDimensions
    state_dict: dict[str, Tensor]
    alignment_heads: list[tuple[int, int]]
    suppress_ids: list[int] | None
    suppress_ids_begin: list[int] | None
    lang_ids: list[int] | None
    quantization: str | None = None  # the integer type of the file's quantized weights (int8, int16); None: floats


class _Stream:
    """Reads a list of files as one byte stream, naming what was being read if the data runs out."""

    def __init__(self, paths: Sequence[Path]):
        self.paths, self.index, self.file, self.position = list(paths), 0, None, 0
        self.reading = "the header"

    def readinto(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            if self.file is None:
                if self.index == len(self.paths):
                    names = ", ".join(str(p) for p in self.paths)
                    raise ValueError(
                        f"CTranslate2 model.bin is truncated: the data stops inside {self.reading} after "
                        f"{self.position} bytes of {names}; a split model needs all its model.bin.part* files, in order"
                    )
                self.file = open(self.paths[self.index], "rb")
                self.index += 1
            n = self.file.readinto(view[done:])
            if not n:
                self.file.close()
                self.file = None
            done += n
            self.position += n

    def read(self, fmt: str) -> int:
        buf = bytearray(struct.calcsize(fmt))
        self.readinto(memoryview(buf))
        return struct.unpack(fmt, buf)[0]

    def read_str(self) -> str:
        buf = bytearray(self.read("<H"))  # the length counts the trailing NUL
        self.readinto(memoryview(buf))
        return buf[:-1].decode("utf-8")

    def trailing_bytes(self) -> int:
        rest = sum(p.stat().st_size for p in self.paths[self.index :])
        return rest + (os.fstat(self.file.fileno()).st_size - self.file.tell() if self.file else 0)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _read_variable(stream: _Stream, version: int, index: int, count: int) -> tuple[str, Tensor]:
    stream.reading = f"the name of variable {index + 1} of {count}"
    name = stream.read_str()
    stream.reading = f"variable '{name}' ({index + 1} of {count})"
    shape = [stream.read("<I") for _ in range(stream.read("<B"))]
    if version >= 4:
        dtype_id, num_bytes = stream.read("<B"), stream.read("<I")
        if dtype_id not in _DTYPES:
            raise ValueError(f"CTranslate2 variable '{name}' has unsupported dtype id {dtype_id}")
        dtype = _DTYPES[dtype_id]
    else:
        item_size = stream.read("<B")
        if item_size not in _ITEM_SIZE_DTYPES:
            raise ValueError(f"CTranslate2 variable '{name}' has unsupported item size {item_size}")
        dtype, num_bytes = _ITEM_SIZE_DTYPES[item_size], stream.read("<I") * item_size
    if num_bytes != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"CTranslate2 variable '{name}' holds {num_bytes} bytes, not shape {shape} of {dtype}")
    raw = torch.empty(num_bytes, dtype=torch.uint8)
    stream.readinto(memoryview(raw.numpy()))
    return name, raw.view(dtype).reshape(shape)


def read_variables(files: Path | Sequence[Path]) -> dict[str, Tensor]:
    """Every variable of a model.bin (parts read as one stream), int8/int16 dequantized, aliases resolved."""
    return read_model(files)[0]


def read_model(files: Path | Sequence[Path]) -> tuple[dict[str, Tensor], str | None]:
    """read_variables, and the integer type its quantized weights were stored in (None: all floating point)."""
    stream = _Stream([Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files])
    try:
        version = stream.read("<I")
        if not 1 <= version <= MAX_BINARY_VERSION:
            raise ValueError(f"{stream.paths[0]} is not a CTranslate2 model.bin (binary version {version})")
        if version >= 2:
            spec, _revision = stream.read_str(), stream.read("<I")
            if spec != "WhisperSpec":
                raise ValueError(f"{stream.paths[0]} holds a CTranslate2 {spec}, not a WhisperSpec")
        count = stream.read("<I")
        variables = dict(_read_variable(stream, version, i, count) for i in range(count))
        stream.reading = "the alias table"
        aliases = [(stream.read_str(), stream.read_str()) for _ in range(stream.read("<I") if version >= 3 else 0)]
        if extra := stream.trailing_bytes():
            raise ValueError(f"CTranslate2 model.bin has {extra} unexpected bytes after its end; check the part files")
    finally:
        stream.close()
    quantization = _dequantize(variables)
    # An alias (decoder/projection -> decoder/embeddings) has no scale of its own, so it is resolved last.
    for alias, target in aliases:
        variables[alias] = variables[target]
    return variables, quantization


def _dequantize(variables: dict[str, Tensor]) -> str | None:
    quantized = [name for name, t in variables.items() if not t.is_floating_point() and name + "_scale" in variables]
    kind = str(variables[quantized[0]].dtype).removeprefix("torch.") if quantized else None
    for name in quantized:
        q, scale = variables[name], variables.pop(name + "_scale").float()
        # One scale per output row (conv weights flattened to 2-D); int16 uses one scale for the whole tensor.
        rows = q.reshape(q.shape[0], -1).float()
        w = rows / scale if scale.ndim == 0 else rows / scale[:, None]
        variables[name] = w.reshape(q.shape)
    if quantized:  # keep one float dtype: the dequantized weights are float32, so promote the rest (exact)
        for name, t in variables.items():
            if t.is_floating_point():
                variables[name] = t.float()
    return kind


class _Mapper:
    """Moves CT2 variables into openai/whisper names, so that leftovers can be reported."""

    def __init__(self, variables: dict[str, Tensor]):
        self.variables, self.state_dict = dict(variables), {}

    def take(self, name: str) -> Tensor:
        if name not in self.variables:
            raise ValueError(f"CTranslate2 model.bin has no variable '{name}'")
        return self.variables.pop(name)

    def linear(self, src: str, dst: str) -> None:
        self.state_dict[f"{dst}.weight"] = self.take(f"{src}/weight")
        self.state_dict[f"{dst}.bias"] = self.take(f"{src}/bias")

    def fused(self, src: str, dsts: Sequence[str]) -> None:
        # CT2 concatenates q,k,v (or k,v) by rows; the zero k bias is dropped: softmax ignores a per-query constant.
        weights, biases = self.take(f"{src}/weight").chunk(len(dsts)), self.take(f"{src}/bias").chunk(len(dsts))
        for dst, w, b in zip(dsts, weights, biases):
            self.state_dict[f"{dst}.weight"] = w.clone()
            if not dst.endswith(".key"):
                self.state_dict[f"{dst}.bias"] = b.clone()

    def norm(self, src: str, dst: str) -> None:
        self.state_dict[f"{dst}.weight"] = self.take(f"{src}/gamma")
        self.state_dict[f"{dst}.bias"] = self.take(f"{src}/beta")

    def layer(self, src: str, dst: str, cross: bool) -> None:
        self.fused(f"{src}/self_attention/linear_0", [f"{dst}.attn.{p}" for p in ("query", "key", "value")])
        self.linear(f"{src}/self_attention/linear_1", f"{dst}.attn.out")
        self.norm(f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
        if cross:
            self.linear(f"{src}/attention/linear_0", f"{dst}.cross_attn.query")
            self.fused(f"{src}/attention/linear_1", [f"{dst}.cross_attn.key", f"{dst}.cross_attn.value"])
            self.linear(f"{src}/attention/linear_2", f"{dst}.cross_attn.out")
            self.norm(f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln")
        self.linear(f"{src}/ffn/linear_0", f"{dst}.mlp.0")
        self.linear(f"{src}/ffn/linear_1", f"{dst}.mlp.2")
        self.norm(f"{src}/ffn/layer_norm", f"{dst}.mlp_ln")


def _num_layers(variables: dict[str, Tensor], side: str) -> int:
    indices = [int(m.group(1)) for name in variables if (m := re.match(rf"{side}/layer_(\d+)/", name))]
    return max(indices, default=-1) + 1


def _scalars(variables: dict[str, Tensor]) -> dict[str, int]:
    """Pops the 0-d flags, checking the ones that would change the architecture."""
    scalars = {name: int(variables.pop(name).item()) for name in [n for n, t in variables.items() if t.ndim == 0]}
    for name, value in scalars.items():
        expected = _EXPECTED_FLAGS.get(name.rsplit("/", 1)[-1])
        if expected is not None and value != expected:
            raise ValueError(f"CTranslate2 flag '{name}' is {value}, Whisper needs {expected}")
    return scalars


def to_state_dict(variables: dict[str, Tensor]) -> tuple[ModelDimensions, dict[str, Tensor]]:
    """Maps read_variables() output to openai/whisper names; every non-scalar variable must be used."""
    m = _Mapper(variables)
    scalars = _scalars(m.variables)
    n_audio_layer, n_text_layer = _num_layers(m.variables, "encoder"), _num_layers(m.variables, "decoder")
    for name in ("conv1", "conv2"):
        m.linear(f"encoder/{name}", f"encoder.{name}")
    if "encoder/position_encodings/encodings" in m.variables:  # else rebuilt as sinusoids by the caller
        m.state_dict["encoder.positional_embedding"] = m.take("encoder/position_encodings/encodings")
    for i in range(n_audio_layer):
        m.layer(f"encoder/layer_{i}", f"encoder.blocks.{i}", cross=False)
    m.norm("encoder/layer_norm", "encoder.ln_post")
    embedding = m.state_dict["decoder.token_embedding.weight"] = m.take("decoder/embeddings/weight")
    m.state_dict["decoder.positional_embedding"] = m.take("decoder/position_encodings/encodings")
    for i in range(n_text_layer):
        m.layer(f"decoder/layer_{i}", f"decoder.blocks.{i}", cross=True)
    m.norm("decoder/layer_norm", "decoder.ln")
    projection = m.variables.pop("decoder/projection/weight", embedding)
    if projection is not embedding and not torch.equal(projection, embedding):
        raise ValueError("CTranslate2 output projection differs from the embeddings; only a tied one is supported")
    if m.variables:
        raise ValueError(f"CTranslate2 variables not used by the Whisper mapping: {sorted(m.variables)}")
    d_audio, n_mels, _ = m.state_dict["encoder.conv1.weight"].shape
    n_text_ctx, d_text = m.state_dict["decoder.positional_embedding"].shape
    # Whisper always has 1500 encoder frames and 64-wide heads: fallbacks for files without those tensors/scalars.
    n_audio_ctx = m.state_dict.get("encoder.positional_embedding", torch.empty(1500)).shape[0]
    dims = ModelDimensions(
        n_mels=n_mels,
        n_audio_ctx=n_audio_ctx,
        n_audio_state=d_audio,
        n_audio_head=scalars.get("encoder/num_heads", d_audio // 64),
        n_audio_layer=n_audio_layer,
        n_vocab=embedding.shape[0],
        n_text_ctx=n_text_ctx,
        n_text_state=d_text,
        n_text_head=scalars.get("decoder/num_heads", d_text // 64),
        n_text_layer=n_text_layer,
    )
    return dims, m.state_dict


def load_ct2(files: Path | Sequence[Path], config_file: Path | None = None) -> CT2Model:
    """Reads a CT2 model.bin (or its parts, in order) and its optional config.json."""
    variables, quantization = read_model(files)
    dims, state_dict = to_state_dict(variables)
    config = json.loads(config_file.read_text()) if config_file is not None and config_file.is_file() else {}
    heads = config.get("alignment_heads")
    if not heads:  # CT2's own default: every head of the last half of the decoder layers
        half = dims.n_text_layer // 2
        heads = [(layer, h) for layer in range(half, dims.n_text_layer) for h in range(dims.n_text_head)]
    return CT2Model(
        dims=dims,
        state_dict=state_dict,
        alignment_heads=[(int(layer), int(head)) for layer, head in heads],
        suppress_ids=config.get("suppress_ids"),
        suppress_ids_begin=config.get("suppress_ids_begin"),
        lang_ids=config.get("lang_ids"),
        quantization=quantization,
    )

"""Whisper hyperparameters (openai/whisper's ModelDimensions) and the state-dict layout they imply."""

from __future__ import annotations

from dataclasses import dataclass, fields

# The multilingual vocabulary has 51765 text tokens + eot/sot + one token per language + task tokens;
# openai/whisper derives the language count from n_vocab with exactly this rule.
MULTILINGUAL_MIN_VOCAB = 51865
BASE_VOCAB = 51765


@dataclass(frozen=True, slots=True)
class ModelDimensions:
    """Whisper model shape, field names as in openai/whisper."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelDimensions.{name} must be a positive int, got {value!r}")
        for side in ("audio", "text"):
            state, heads = getattr(self, f"n_{side}_state"), getattr(self, f"n_{side}_head")
            if state % heads:
                raise ValueError(f"n_{side}_state={state} is not divisible by n_{side}_head={heads}")

    @property
    def is_multilingual(self) -> bool:
        """True for the multilingual vocabularies (51865 tokens, 51866 from large-v3 on)."""
        return self.n_vocab >= MULTILINGUAL_MIN_VOCAB

    @property
    def num_languages(self) -> int:
        """Number of language tokens, openai/whisper's rule."""
        return self.n_vocab - BASE_VOCAB - int(self.is_multilingual)


def _dims(n_mels: int, n_vocab: int, d: int, heads: int, enc_layers: int, dec_layers: int) -> ModelDimensions:
    return ModelDimensions(n_mels, 1500, d, heads, enc_layers, n_vocab, 448, d, heads, dec_layers)


# Real shapes of the published checkpoints, used for random-weight ("dummy") models.
DUMMY_DIMS: dict[str, ModelDimensions] = {
    "tiny": _dims(80, 51865, 384, 6, 4, 4),
    "tiny.en": _dims(80, 51864, 384, 6, 4, 4),
    "base": _dims(80, 51865, 512, 8, 6, 6),
    "base.en": _dims(80, 51864, 512, 8, 6, 6),
    "small": _dims(80, 51865, 768, 12, 12, 12),
    "small.en": _dims(80, 51864, 768, 12, 12, 12),
    "medium": _dims(80, 51865, 1024, 16, 24, 24),
    "medium.en": _dims(80, 51864, 1024, 16, 24, 24),
    "large-v2": _dims(80, 51865, 1280, 20, 32, 32),
    "large-v3": _dims(128, 51866, 1280, 20, 32, 32),
    "large-v3-turbo": _dims(128, 51866, 1280, 20, 32, 4),
}


def _attention(prefix: str, d: int) -> dict[str, tuple[int, ...]]:
    # openai/whisper's key projection has no bias: softmax is invariant to it.
    return {
        f"{prefix}.query.weight": (d, d), f"{prefix}.query.bias": (d,),
        f"{prefix}.key.weight": (d, d),
        f"{prefix}.value.weight": (d, d), f"{prefix}.value.bias": (d,),
        f"{prefix}.out.weight": (d, d), f"{prefix}.out.bias": (d,),
    }


def _block(prefix: str, d: int, cross: bool) -> dict[str, tuple[int, ...]]:
    shapes = _attention(f"{prefix}.attn", d) | {f"{prefix}.attn_ln.weight": (d,), f"{prefix}.attn_ln.bias": (d,)}
    if cross:
        shapes |= _attention(f"{prefix}.cross_attn", d)
        shapes |= {f"{prefix}.cross_attn_ln.weight": (d,), f"{prefix}.cross_attn_ln.bias": (d,)}
    # Whisper's MLP width is always 4 * d (openai/whisper hard-codes it).
    shapes |= {f"{prefix}.mlp.0.weight": (4 * d, d), f"{prefix}.mlp.0.bias": (4 * d,)}
    shapes |= {f"{prefix}.mlp.2.weight": (d, 4 * d), f"{prefix}.mlp.2.bias": (d,)}
    return shapes | {f"{prefix}.mlp_ln.weight": (d,), f"{prefix}.mlp_ln.bias": (d,)}


def state_dict_shapes(dims: ModelDimensions) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in openai/whisper's `Whisper` state dict for these dims."""
    da, dt = dims.n_audio_state, dims.n_text_state
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.conv1.weight": (da, dims.n_mels, 3), "encoder.conv1.bias": (da,),
        "encoder.conv2.weight": (da, da, 3), "encoder.conv2.bias": (da,),
        "encoder.positional_embedding": (dims.n_audio_ctx, da),
    }
    for i in range(dims.n_audio_layer):
        shapes |= _block(f"encoder.blocks.{i}", da, cross=False)
    shapes |= {"encoder.ln_post.weight": (da,), "encoder.ln_post.bias": (da,)}
    shapes |= {"decoder.token_embedding.weight": (dims.n_vocab, dt)}
    shapes |= {"decoder.positional_embedding": (dims.n_text_ctx, dt)}
    for i in range(dims.n_text_layer):
        shapes |= _block(f"decoder.blocks.{i}", dt, cross=True)
    return shapes | {"decoder.ln.weight": (dt,), "decoder.ln.bias": (dt,)}

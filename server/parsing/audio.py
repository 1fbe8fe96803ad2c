"""Uploaded bytes decoded to samples off the event loop, and the known speakers' references."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from engine import SAMPLE_RATE, AudioDecodeError, AudioTooLongError, decode_audio

from ..errors import APIError

KNOWN_REFERENCE_SECONDS = (2.0, 10.0)  # OpenAI's: a reference holds 2 to 10 s of the speaker


async def decode_upload(
    data: bytes, max_audio_seconds: float, param: str = "file", decoder: Callable[..., np.ndarray] | None = None
) -> np.ndarray:
    """Bytes → 16 kHz mono float32 (or what `decoder` makes), off the event loop; undecodable or too long input is
    a 400."""
    try:
        return await asyncio.to_thread(decoder or decode_audio, data, max_audio_seconds)
    except AudioTooLongError as exc:
        raise APIError(400, str(exc), param=param, code="audio_too_long") from exc
    except AudioDecodeError as exc:
        raise APIError(400, str(exc), param=param, code="invalid_value") from exc


async def decode_references(references: tuple[tuple[str, bytes], ...]) -> list[tuple[str, np.ndarray]]:
    """Each known speaker's reference decoded; 2 to 10 s of audio each, as OpenAI asks (400 otherwise)."""
    low, high = KNOWN_REFERENCE_SECONDS
    param = "known_speaker_references[]"
    out = []
    for name, data in references:
        audio = await decode_upload(data, high + 0.5, param)
        seconds = len(audio) / SAMPLE_RATE
        if not low - 0.05 <= seconds <= high + 0.05:
            raise APIError(400, f"The reference of {name!r} holds {seconds:.1f} s of audio; a reference holds "
                                f"{low:g} to {high:g} s of the speaker.", param=param, code="invalid_value")  # fmt: skip
        out.append((name, audio))
    return out

"""A transcription request from its body to its parameters, and the engine's DecodeOptions for them."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request

from engine import DEFAULT_TEMPERATURES, ChunkingOptions, DecodeOptions, Task

from ..protocol import TranscriptionForm, TranscriptionParams, TranslationForm
from ..settings import Settings
from .body import form_fields, known_fields, parse_upload, read_form, validate_model
from .fields import (
    check_model,
    check_supported,
    parse_chunking,
    parse_keywords,
    parse_known_speakers,
    parse_language,
    parse_languages,
    parse_response_format,
    parse_speaker_count,
)

log = logging.getLogger(__name__)


async def parse_transcription(request: Request, settings: Settings, task: Task) -> TranscriptionParams:
    """Read and validate a transcription (or translation) request; raises APIError."""
    max_bytes = settings.max_upload_bytes
    form = await read_form(request, max_bytes)
    try:
        form_cls = TranscriptionForm if task is Task.TRANSCRIBE else TranslationForm
        raw = form_fields(form)
        fields: TranslationForm = validate_model(form_cls, raw)
        unknown = sorted(set(raw) - known_fields(form_cls))
        if unknown:  # OpenAI adds fields over time: a client that sends newer ones is served, and the log says so
            log.debug("ignored form fields %s", unknown)
        check_model(fields.model, settings)
        response_format = parse_response_format(fields.response_format)
        check_supported(fields, response_format)
        is_transcription = isinstance(fields, TranscriptionForm)
        language = parse_language(fields.language) if is_transcription else None
        chunking = parse_chunking(fields.chunking_strategy) if is_transcription else None
        languages = parse_languages(fields.languages) if is_transcription else None
        keywords = parse_keywords(fields.keywords) if is_transcription else ()
        known_speakers = (
            parse_known_speakers(fields.known_speaker_names, fields.known_speaker_references) if is_transcription else ()
        )
        upload = await parse_upload(form, max_bytes)
    finally:
        await form.close()
    return TranscriptionParams(
        upload=upload,
        model=fields.model,
        task=task,
        response_format=response_format,
        language=language,
        prompt=fields.prompt or None,
        temperature=fields.temperature,
        stream=fields.stream,
        chunking=chunking,
        granularities=frozenset(getattr(fields, "timestamp_granularities", None) or ("segment",)),
        best_of=fields.best_of,
        beam_size=fields.beam_size,
        patience=fields.patience,
        length_penalty=fields.length_penalty,
        keywords_in_prompt=getattr(fields, "keywords_in_prompt", None),
        logprobs="logprobs" in (getattr(fields, "include", None) or ()),
        languages=languages,
        keywords=keywords,
        known_speakers=known_speakers,
        speaker_per_channel=getattr(fields, "speaker_per_channel", None),
        speaker_count=parse_speaker_count(fields) if is_transcription else None,
        diarize=bool(getattr(fields, "diarize", None)),
    )


def decode_options(
    task: Task,
    language: str | None,
    prompt: str | None,
    temperature: float,
    chunking: ChunkingOptions | None = None,
    word_timestamps: bool = False,
    settings: Settings | None = None,
    **extra: Any,
) -> DecodeOptions:
    """The engine's options for a request; `extra`: more DecodeOptions fields (logprobs, languages, keywords)."""
    # temperature 0 is OpenAI's "raise the temperature until the thresholds pass", i.e. Whisper's fallback.
    temperatures = DEFAULT_TEMPERATURES if temperature == 0 else (temperature,)
    return DecodeOptions(
        task=task,
        language=language,
        prompt=prompt or None,
        temperatures=temperatures,
        chunking=chunking,
        word_timestamps=word_timestamps,
        **(server_defaults(settings) if settings is not None else {}),
        **extra,
    )


def server_defaults(settings: Settings) -> dict[str, float | int | None]:
    """The decoding settings a server applies to every request unless the request says otherwise: Whisper's
    quality thresholds (with Whisper's defaults), best_of, the beam search's settings, keywords_in_prompt, and the
    benchmarks' fixed token count."""
    return {
        "compression_ratio_threshold": settings.compression_ratio_threshold,
        "log_prob_threshold": settings.log_prob_threshold,
        "no_speech_threshold": settings.no_speech_threshold,
        "fixed_decode_tokens": settings.fixed_decode_tokens,
        "fixed_decode_tokens_per_s": settings.fixed_decode_tokens_per_second,
        "best_of": settings.best_of,
        "beam_size": settings.beam_size,
        "patience": settings.patience,
        "length_penalty": settings.length_penalty,
        "keywords_in_prompt": settings.keywords_in_prompt,
    }

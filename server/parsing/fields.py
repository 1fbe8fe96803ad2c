"""Each request field's own checks: the model, languages, response format, what OpenAI accepts but this server
refuses by name, speaker counts and known speakers, keywords and the chunking strategy."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from engine import LANGUAGES, MAX_SPEAKERS, ChunkingOptions, SpeakerCount

from ..errors import APIError
from ..protocol import ResponseFormat, TranscriptionForm, TranslationForm
from ..settings import Settings

MAX_KNOWN_SPEAKERS = 4  # OpenAI's limit
MAX_SPEAKER_NAME_CHARS = 64
DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[\w.+=-]+)*;base64,(?P<payload>[A-Za-z0-9+/=\s]*)", re.DOTALL)
MAX_KEYWORDS = 100  # keywords[] entries; with MAX_KEYWORD_CHARS, bounds the trie the decode is biased with
MAX_KEYWORD_CHARS = 100
LANGUAGE_CODES = {name: code for code, name in LANGUAGES.items()}
RESPONSE_FORMATS = ", ".join(f"'{f.value}'" for f in ResponseFormat)
# the stream carries text, or (diarized_json) segments with speakers
STREAM_FORMATS = (ResponseFormat.JSON, ResponseFormat.TEXT, ResponseFormat.DIARIZED_JSON)
# chunking_strategy's server_vad fields (OpenAI's names) and what each must be
CHUNKING_FIELDS = {
    "threshold": "a number in [0, 1]",
    "prefix_padding_ms": "a whole number of milliseconds >= 0",
    "silence_duration_ms": "a whole number of milliseconds >= 0",
}


def check_model(model: str, settings: Settings) -> None:
    if model not in settings.model_ids:
        served = []
        for spec in settings.served_models():
            also = ", ".join(f"'{m}'" for m in spec.ids[1:])
            served.append(f"'{spec.id}'" + (f" (also reachable as {also})" if also else ""))
        raise APIError(
            404,
            f"The model '{model}' does not exist. This server serves {' and '.join(served)}.",
            param="model",
            code="model_not_found",
        )


def parse_language(language: str | None, param: str = "language") -> str | None:
    """ISO-639-1 code (or Whisper's English name) → code; None or "" means detect."""
    if not language:
        return None
    value = language.strip().lower()
    if value in LANGUAGES:
        return value
    if value in LANGUAGE_CODES:
        return LANGUAGE_CODES[value]
    raise APIError(
        400,
        f"Invalid language '{language}'. Language parameter must be specified in ISO-639-1 format.",
        param=param,
        code="invalid_value",
    )


def parse_response_format(value: str) -> ResponseFormat:
    try:
        return ResponseFormat(value)
    except ValueError:
        raise APIError(
            400,
            f"Invalid value: '{value}'. Supported values are: {RESPONSE_FORMATS}.",
            param="response_format",
            code="invalid_value",
        ) from None


def _unsupported(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_value")


def check_supported(form: TranslationForm, response_format: ResponseFormat) -> None:
    """Refuse, by name, what OpenAI accepts but this server does not implement yet."""
    if not isinstance(form, TranscriptionForm):
        if form.stream:  # OpenAI has no streaming translations either
            raise _unsupported("stream", "Translations cannot be streamed; send the request without stream.")
        if response_format is ResponseFormat.DIARIZED_JSON:
            raise APIError(400, "response_format 'diarized_json' is for transcriptions, not translations.",
                           param="response_format", code="invalid_value")  # fmt: skip
        return
    if form.stream and response_format not in STREAM_FORMATS:
        raise APIError(
            400,
            f"stream=true sends transcript.text events and needs response_format 'json', 'text' or "
            f"'diarized_json', not '{response_format.value}'.",
            param="stream",
            code="invalid_value",
        )
    for granularity in form.timestamp_granularities or ():
        if granularity not in ("word", "segment"):
            raise APIError(
                400,
                f"Invalid value: '{granularity}'. Supported values are: 'word' and 'segment'.",
                param="timestamp_granularities[]",
                code="invalid_value",
            )
    if form.timestamp_granularities and response_format is not ResponseFormat.VERBOSE_JSON:
        raise APIError(
            400,
            "timestamp_granularities[] requires response_format 'verbose_json'.",
            param="timestamp_granularities[]",
            code="invalid_value",
        )
    for item in form.include or ():
        if item != "logprobs":
            raise _unsupported("include[]", f"include[]={item} is not supported; the supported value is 'logprobs'.")
        if response_format is not ResponseFormat.JSON:
            raise APIError(400, "include[]=logprobs needs response_format 'json'.", param="include[]",
                           code="invalid_value")  # fmt: skip
    if form.diarize and response_format is not ResponseFormat.VERBOSE_JSON:
        raise APIError(400, "diarize labels verbose_json's segments; diarized_json needs no flag.", param="diarize",
                       code="invalid_value")  # fmt: skip
    counts = {"num_speakers": form.num_speakers, "min_speakers": form.min_speakers, "max_speakers": form.max_speakers}
    given = [name for name, value in counts.items() if value is not None]
    if given and response_format is not ResponseFormat.DIARIZED_JSON and not form.diarize:
        raise APIError(400, f"{given[0]} needs response_format 'diarized_json' (or 'verbose_json' with diarize).",
                       param=given[0], code="invalid_value")  # fmt: skip
    if form.num_speakers is not None and len(given) > 1:
        raise APIError(400, "Send num_speakers, or min_speakers and max_speakers, not both.", param=given[1],
                       code="invalid_value")  # fmt: skip
    if (form.min_speakers or 1) > (form.max_speakers or MAX_SPEAKERS):
        raise APIError(400, "min_speakers is above max_speakers.", param="min_speakers", code="invalid_value")
    if form.speaker_per_channel and response_format is not ResponseFormat.DIARIZED_JSON:
        raise APIError(400, "speaker_per_channel needs response_format 'diarized_json'.", param="speaker_per_channel",
                       code="invalid_value")  # fmt: skip
    if form.speaker_per_channel and (form.stream or form.known_speaker_names):
        raise _unsupported("speaker_per_channel", "speaker_per_channel works without stream and known speakers.")
    if (form.known_speaker_names or form.known_speaker_references) and response_format is not (
        ResponseFormat.DIARIZED_JSON
    ):
        raise APIError(400, "known_speaker_names[] and known_speaker_references[] need response_format "
                            "'diarized_json'.", param="known_speaker_names[]", code="invalid_value")  # fmt: skip
    if form.language and form.languages:
        raise APIError(400, "Send either language or languages[], not both.", param="languages[]",
                       code="invalid_value")  # fmt: skip


def parse_languages(values: list[str] | None) -> tuple[str, ...] | None:
    """languages[]: ISO codes (or Whisper's names) detection may pick from; None when not given."""
    if not values:
        return None
    if len(values) > len(LANGUAGES):
        raise APIError(400, f"languages[] holds at most {len(LANGUAGES)} languages.", param="languages[]",
                       code="invalid_value")  # fmt: skip
    return tuple(dict.fromkeys(parse_language(v, "languages[]") for v in values if v.strip()))


def parse_speaker_count(form: TranscriptionForm) -> SpeakerCount | None:
    """num_speakers, or min_speakers and max_speakers (diarized_json's extensions; checked by check_supported)."""
    if form.num_speakers is None and form.min_speakers is None and form.max_speakers is None:
        return None
    if form.num_speakers is not None:
        return SpeakerCount(exactly=form.num_speakers)
    return SpeakerCount(at_least=form.min_speakers or 1, at_most=form.max_speakers or MAX_SPEAKERS)


def parse_known_speakers(names: list[str] | None, references: list[str] | None) -> tuple[tuple[str, bytes], ...]:
    """known_speaker_names[] with known_speaker_references[] (data URLs of audio), pairwise: (name, audio bytes)
    each. Counts, names and the data URLs are checked here; the audio's length once decoded."""
    names, references = names or [], references or []
    if not names and not references:
        return ()
    if len(names) != len(references):
        raise APIError(400, f"known_speaker_names[] has {len(names)} entries and known_speaker_references[] "
                            f"{len(references)}; give one reference per name.", param="known_speaker_references[]",
                       code="invalid_value")  # fmt: skip
    if len(names) > MAX_KNOWN_SPEAKERS:
        raise APIError(400, f"known_speaker_names[] holds at most {MAX_KNOWN_SPEAKERS} speakers.",
                       param="known_speaker_names[]", code="invalid_value")  # fmt: skip
    cleaned = [" ".join(n.split()) for n in names]
    if any(not n or len(n) > MAX_SPEAKER_NAME_CHARS for n in cleaned) or len(set(cleaned)) != len(cleaned):
        raise APIError(400, f"known_speaker_names[] must be distinct, non-empty names of at most "
                            f"{MAX_SPEAKER_NAME_CHARS} characters.", param="known_speaker_names[]",
                       code="invalid_value")  # fmt: skip
    out = []
    for name, reference in zip(cleaned, references):
        match = DATA_URL.fullmatch(reference.strip())
        if match is None or (match["mime"] and not match["mime"].startswith(("audio/", "video/"))):
            raise APIError(400, "known_speaker_references[] entries must be data URLs of audio, e.g. "
                                "'data:audio/wav;base64,...'.", param="known_speaker_references[]",
                           code="invalid_value")  # fmt: skip
        try:
            data = base64.b64decode("".join(match["payload"].split()), validate=True)
        except binascii.Error:
            data = b""
        if not data:
            raise APIError(400, f"The reference of {name!r} holds no audio (empty or not base64).",
                           param="known_speaker_references[]", code="invalid_value")  # fmt: skip
        out.append((name, data))
    return tuple(out)


def parse_keywords(values: list[str] | None) -> tuple[str, ...]:
    """keywords[]: words and phrases to bias toward, bounded in count and length (400 beyond); an empty one, or an
    empty list, is refused too (it biases toward nothing, so it is the client's mistake)."""
    if values is not None and (not values or not all(v.strip() for v in values)):
        raise APIError(400, "keywords[] entries may not be empty.", param="keywords[]", code="invalid_value")
    keywords = tuple(dict.fromkeys(" ".join(v.split()) for v in values or ()))
    if len(keywords) > MAX_KEYWORDS:
        raise APIError(400, f"keywords[] holds at most {MAX_KEYWORDS} entries.", param="keywords[]",
                       code="invalid_value")  # fmt: skip
    for keyword in keywords:
        if len(keyword) > MAX_KEYWORD_CHARS:
            raise APIError(400, f"a keyword has at most {MAX_KEYWORD_CHARS} characters: {keyword[:40]!r}...",
                           param="keywords[]", code="invalid_value")  # fmt: skip
    return keywords


def _bad_chunking(message: str) -> APIError:
    return APIError(400, f"Invalid chunking_strategy: {message}", param="chunking_strategy", code="invalid_value")


def _chunking_number(name: str, value: Any, kind: type) -> float | int:
    """A form string ("0.5", "300") or, from a JSON object, a number."""
    if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
        raise _bad_chunking(f"'{name}' must be {CHUNKING_FIELDS[name]}, got {value!r}.")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise _bad_chunking(f"'{name}' must be {CHUNKING_FIELDS[name]}, got {value!r}.") from None


def parse_chunking(value: str | dict[str, Any] | None) -> ChunkingOptions | None:
    """`chunking_strategy` as the SDK sends it: `auto`, or `chunking_strategy[type]=server_vad` with its knobs.

    A JSON object in one field (`-F 'chunking_strategy={"type": "server_vad"}'`) is accepted too.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _bad_chunking("not valid JSON.") from None
        if not isinstance(value, dict):
            raise _bad_chunking("expected an object.")
    if isinstance(value, str):
        if value == "auto":
            return ChunkingOptions()
        raise _bad_chunking(f"expected 'auto' or an object with type 'server_vad', got '{value}'.")
    if value.get("type") != "server_vad":
        raise _bad_chunking(f"'type' must be 'server_vad', got {value.get('type')!r}.")
    unknown = sorted(set(value) - {"type", *CHUNKING_FIELDS})
    if unknown:
        raise _bad_chunking(f"unknown field '{unknown[0]}'; expected {', '.join(CHUNKING_FIELDS)}.")
    numbers = {
        name: _chunking_number(name, value[name], float if name == "threshold" else int)
        for name in CHUNKING_FIELDS
        if name in value
    }
    try:
        return ChunkingOptions(**numbers)
    except ValueError as exc:
        raise _bad_chunking(f"{exc}.") from None

"""Request bodies → validated params: raw multipart (bracketed SDK fields), size limits, audio decoding."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive

from engine import (
    DEFAULT_TEMPERATURES,
    LANGUAGES,
    MAX_SPEAKERS,
    SAMPLE_RATE,
    AudioDecodeError,
    AudioTooLongError,
    ChunkingOptions,
    DecodeOptions,
    SpeakerCount,
    Task,
    decode_audio,
)

from .errors import APIError, ClientDisconnectedError
from .protocol import ResponseFormat, TranscriptionForm, TranscriptionParams, TranslationForm, Upload
from .settings import MIB, Settings

log = logging.getLogger(__name__)

# room for the non-file fields and multipart framing: up to 4 known speakers' references of 10 s each, as data URLs
FORM_OVERHEAD_BYTES = 8 * MIB
JSON_OVERHEAD_BYTES = MIB  # room for a JSON body's text around its base64 audio
MAX_FIELD_BYTES = 2 * MIB  # one non-file field (a reference's data URL is the largest)
MAX_KNOWN_SPEAKERS = 4  # OpenAI's limit
MAX_SPEAKER_NAME_CHARS = 64
KNOWN_REFERENCE_SECONDS = (2.0, 10.0)  # OpenAI's: a reference holds 2 to 10 s of the speaker
DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[\w.+=-]+)*;base64,(?P<payload>[A-Za-z0-9+/=\s]*)", re.DOTALL)
MAX_FORM_FILES = 4
MAX_FORM_FIELDS = 256
# A chat body's structure: a transcription request has a few messages of a few parts; far more is refused unread.
MAX_JSON_CONTAINERS = 4096
MAX_JSON_DEPTH = 32
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


def too_large(max_upload_bytes: int) -> APIError:
    return APIError(
        413, f"Maximum content size limit ({max_upload_bytes} bytes) exceeded.", param="file", code="request_too_large"
    )


class BodyLimiter:
    """ASGI `receive` wrapper that stops reading a body once it passes `max_body_bytes`."""

    def __init__(self, receive: Receive, max_body_bytes: int, max_upload_bytes: int):
        self.receive = receive
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.num_bytes = 0

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.num_bytes += len(message.get("body", b""))
            if self.num_bytes > self.max_body_bytes:
                raise too_large(self.max_upload_bytes)
        return message


def limited_request(request: Request, max_body_bytes: int, max_upload_bytes: int) -> Request:
    """A view of `request` whose body may not pass `max_body_bytes`: checked from Content-Length, then while reading."""
    content_length = request.headers.get("content-length")
    if content_length is not None and content_length.isdigit() and int(content_length) > max_body_bytes:
        raise too_large(max_upload_bytes)
    return Request(request.scope, BodyLimiter(request.receive, max_body_bytes, max_upload_bytes))


async def read_form(request: Request, max_upload_bytes: int) -> FormData:
    """The multipart form of an upload of at most `max_upload_bytes` (plus room for the other fields)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ("multipart/form-data", "application/x-www-form-urlencoded"):
        raise APIError(
            400,
            f"Content-Type must be multipart/form-data, got '{content_type or 'none'}'.",
            code="invalid_content_type",
        )
    max_body_bytes = max_upload_bytes + FORM_OVERHEAD_BYTES
    try:
        return await limited_request(request, max_body_bytes, max_upload_bytes).form(
            max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES
        )
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc
    except StarletteHTTPException as exc:  # malformed multipart
        raise APIError(400, f"Could not parse the multipart form: {exc.detail}") from exc


async def read_json(request: Request, max_upload_bytes: int) -> Any:
    """A JSON body carrying base64 audio of at most `max_upload_bytes`, of bounded structure."""
    max_body_bytes = max_upload_bytes * 4 // 3 + JSON_OVERHEAD_BYTES  # base64 inflates by 4/3
    try:
        body = await limited_request(request, max_body_bytes, max_upload_bytes).body()
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc
    return parse_json(body)


def parse_json(body: bytes | str, what: str = "The request body") -> Any:
    """JSON of bounded structure (a request body, a realtime event), or an APIError that says what is wrong.

    Containers are counted before parsing: json.loads and validation hold the GIL (and so the event loop) for as
    long as a body has objects, a million tiny messages for seconds; base64 audio has no brackets, so a real body
    has few."""
    brace, bracket = (b"{", b"[") if isinstance(body, bytes) else ("{", "[")
    if body.count(brace) + body.count(bracket) > MAX_JSON_CONTAINERS:
        raise APIError(
            400, f"{what} has too many JSON objects and arrays (more than {MAX_JSON_CONTAINERS}).", code="invalid_value"
        )
    too_deep = APIError(400, f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels.", code="invalid_value")
    try:
        value = json.loads(body)
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:  # JSONDecodeError, undecodable bytes, an integer of thousands of digits
        raise APIError(400, f"{what} is not valid JSON: {exc}", code="invalid_value") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise too_deep
    return value


def json_depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion (a body has at most MAX_JSON_CONTAINERS containers)."""
    depth, level = 0, [(value, 1)]
    while level:
        item, d = level.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        depth = max(depth, d)
        level.extend((child, d + 1) for child in item if isinstance(child, (dict, list)))
    return depth


def form_fields(form: FormData) -> dict[str, Any]:
    """Flatten the SDK's encoding: `a[]` repeated → list, `a[k]=v` → dict, `a=v` → str (last wins)."""
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            value = "<file>"  # only `file` may be one; parse_upload reports it by name
        if key.endswith("[]"):
            fields.setdefault(key, []).append(value)
        elif key.endswith("]") and "[" in key:
            base, sub = key[:-1].split("[", 1)
            nested = fields.get(base)
            fields[base] = nested = nested if isinstance(nested, dict) else {}
            nested[sub] = value
        elif key != "file":
            fields[key] = value
    return fields


def known_fields(model_cls: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model_cls.model_fields.items()}


def validate_model(model_cls: type[BaseModel], fields: dict[str, Any]) -> Any:
    """Validate with pydantic; the first error becomes a 400 naming the wire field."""
    try:
        return model_cls.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "missing":
            raise APIError(
                400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
            ) from None
        raise APIError(
            400, f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value"
        ) from None


def check_model(model: str, settings: Settings) -> None:
    if model not in settings.model_ids:
        also = ", ".join(f"'{m}'" for m in settings.model_ids[1:])
        raise APIError(
            404,
            f"The model '{model}' does not exist. This server serves '{settings.model_id}' (also reachable as {also}).",
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


async def parse_upload(form: FormData, max_bytes: int) -> Upload:
    value = form.get("file")
    if value is None:
        raise APIError(400, "Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
    if not isinstance(value, UploadFile):
        raise APIError(
            400,
            "'file' must be an uploaded file (multipart file part), not a text field.",
            param="file",
            code="invalid_value",
        )
    data = await value.read()
    if len(data) > max_bytes:
        raise too_large(max_bytes)
    if not data:
        raise APIError(400, "The audio file is empty.", param="file", code="invalid_value")
    return Upload(data=data, filename=value.filename, content_type=value.content_type)


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
        **(thresholds(settings) if settings is not None else {}),
        **extra,
    )


def thresholds(settings: Settings) -> dict[str, float | int | None]:
    """Whisper's quality thresholds (server-wide settings with Whisper's defaults), and the benchmarks' fixed
    token count."""
    return {
        "compression_ratio_threshold": settings.compression_ratio_threshold,
        "log_prob_threshold": settings.log_prob_threshold,
        "no_speech_threshold": settings.no_speech_threshold,
        "fixed_decode_tokens": settings.fixed_decode_tokens,
        "best_of": settings.best_of,
        "beam_size": settings.beam_size,
        "patience": settings.patience,
        "length_penalty": settings.length_penalty,
        "keywords_in_prompt": settings.keywords_in_prompt,
    }


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

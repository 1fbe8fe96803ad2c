"""Multipart parsing against the exact bytes the openai SDK puts on the wire."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from starlette.requests import Request

from engine.request import DEFAULT_TEMPERATURES, ChunkingOptions, Task
from server.errors import APIError
from server.parsing.audio import decode_upload
from server.parsing.body import read_json
from server.parsing.fields import parse_language
from server.parsing.options import decode_options, parse_transcription
from server.protocol import ResponseFormat
from server.settings import Settings
from tests.helpers.fake_engine import wav_bytes

WAV = wav_bytes()


def sdk_request(call: Callable[[openai.OpenAI], Any]) -> httpx.Request:
    """The httpx.Request the real SDK builds for `call` (sent to a mock transport)."""
    captured: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(200, json={"text": ""})

    client = openai.OpenAI(
        api_key="test",
        base_url="http://test/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    call(client)
    return captured[0]


def to_starlette(request: httpx.Request, chunk: int = 16384, content_length: bool = True) -> Request:
    """Replay an httpx request as an ASGI request, body in chunks as a server would deliver it."""
    body = request.read()
    headers = [
        (k.lower().encode(), v.encode())
        for k, v in request.headers.items()
        if content_length or k.lower() != "content-length"
    ]
    chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": request.url.path,
        "headers": headers,
        "query_string": b"",
        "app": None,
    }
    return Request(scope, receive)


def parse(
    call: Callable[[openai.OpenAI], Any], task: Task = Task.TRANSCRIBE, settings: Settings | None = None, **replay
):
    request = to_starlette(sdk_request(call), **replay)
    return asyncio.run(parse_transcription(request, settings or Settings(model="tiny.en"), task))


def transcribe(**kwargs) -> Callable[[openai.OpenAI], Any]:
    kwargs.setdefault("file", ("speech.wav", WAV, "audio/wav"))
    kwargs.setdefault("model", "whisper-1")
    return lambda client: client.audio.transcriptions.create(**kwargs)


pytestmark = pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # SDK marks translations


def translate(**kwargs) -> Callable[[openai.OpenAI], Any]:
    kwargs.setdefault("file", ("speech.wav", WAV, "audio/wav"))
    kwargs.setdefault("model", "whisper-1")
    return lambda client: client.audio.translations.create(**kwargs)


def raw_form(fields: dict[str, str], file: tuple | str | None = ("a.wav", WAV, "audio/wav")) -> Callable:
    """A hand-made multipart request the SDK cannot produce (file=None: no file; "as-text": a text field)."""
    url = "http://test/v1/audio/transcriptions"

    def send(client: openai.OpenAI) -> None:
        http = client._client  # the SDK's own httpx client, on the mock transport
        if isinstance(file, tuple):
            http.post(url, data=fields, files={"file": file})
        else:  # a dummy part keeps the body multipart
            data = {**fields, "file": "not a file"} if file == "as-text" else fields
            http.post(url, data=data, files={"dummy": ("d", b"", "text/plain")})

    return send


def error_of(call, task=Task.TRANSCRIBE, settings=None, **replay) -> APIError:
    with pytest.raises(APIError) as info:
        parse(call, task, settings, **replay)
    return info.value


def test_defaults_from_minimal_sdk_call():
    params = parse(transcribe())
    assert params.model == "whisper-1"
    assert params.task is Task.TRANSCRIBE
    assert params.response_format is ResponseFormat.JSON
    assert params.language is None and params.prompt is None and params.temperature == 0.0
    assert params.upload.data == WAV
    assert params.upload.filename == "speech.wav" and params.upload.content_type == "audio/wav"


def test_all_supported_fields_as_the_sdk_sends_them():
    params = parse(
        transcribe(
            language="fr",
            prompt="Bonjour.",
            response_format="verbose_json",
            temperature=0.4,
            timestamp_granularities=["segment"],
            stream=False,
        )
    )
    assert params.language == "fr"
    assert params.prompt == "Bonjour."
    assert params.response_format is ResponseFormat.VERBOSE_JSON
    assert params.temperature == pytest.approx(0.4)


def test_served_model_name_and_alias_accepted_unknown_is_404():
    settings = Settings(model="tiny.en", served_model_name="my-whisper")
    assert parse(transcribe(model="my-whisper"), settings=settings).model == "my-whisper"
    assert parse(transcribe(model="whisper-1"), settings=settings).model == "whisper-1"
    err = error_of(transcribe(model="tiny.en"), settings=settings)
    assert (err.status_code, err.code, err.param) == (404, "model_not_found", "model")
    aliased = Settings(model="tiny.en", model_alias=["gpt-4o-transcribe-diarize"])
    assert parse(transcribe(model="gpt-4o-transcribe-diarize"), settings=aliased).model == "gpt-4o-transcribe-diarize"
    assert "gpt-4o-transcribe-diarize" in error_of(transcribe(model="x"), settings=aliased).message


@pytest.mark.parametrize("fmt", [f.value for f in ResponseFormat])
def test_every_response_format(fmt):
    assert parse(transcribe(response_format=fmt)).response_format is ResponseFormat(fmt)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"include": ["segments"]}, "include[]"),
    ],
)
def test_unimplemented_fields_are_refused_by_name(kwargs, param):
    err = error_of(transcribe(**kwargs))
    assert err.status_code == 400
    assert err.param == param
    assert err.code == "unsupported_value"


def test_logprobs_languages_and_keywords_as_the_sdk_sends_them():
    params = parse(transcribe(include=["logprobs"], languages=["de", "English"], keywords=["Hester  Prynne", "Kubernetes"]))
    assert params.logprobs and params.languages == ("de", "en") and params.keywords == ("Hester Prynne", "Kubernetes")
    plain = parse(transcribe())
    assert not plain.logprobs and plain.languages is None and plain.keywords == ()
    assert error_of(transcribe(include=["logprobs"], response_format="text")).param == "include[]"
    assert error_of(transcribe(language="en", languages=["en"])).param == "languages[]"
    assert error_of(transcribe(keywords=["k"] * 50 + [f"k{i}" for i in range(101)])).param == "keywords[]"


def test_whisper_extensions_and_unknown_fields():
    assert parse(transcribe(extra_body={"best_of": 5, "beam_size": 1})).best_of == 5
    assert parse(transcribe()).best_of is None
    assert parse(transcribe(extra_body={"some_future_field": "x"})).model == "whisper-1"  # served; logged at debug
    beams = parse(transcribe(extra_body={"beam_size": 5, "patience": 1.5, "length_penalty": 0.5}))
    assert beams.decoding_overrides() == {"beam_size": 5, "patience": 1.5, "length_penalty": 0.5}
    assert parse(transcribe()).decoding_overrides() == {}
    assert error_of(transcribe(extra_body={"beam_size": 11})).param == "beam_size"
    assert error_of(transcribe(extra_body={"length_penalty": -1})).param == "length_penalty"
    assert error_of(transcribe(extra_body={"best_of": 0})).param == "best_of"


def test_stream_and_chunking_strategy_as_the_sdk_sends_them():
    assert parse(transcribe(stream=True)).stream is True
    assert parse(transcribe(stream=True, response_format="text")).stream is True
    assert parse(transcribe()).stream is False and parse(transcribe()).chunking is None
    assert parse(transcribe(chunking_strategy="auto")).chunking == ChunkingOptions()
    vad = {"type": "server_vad", "threshold": 0.3, "prefix_padding_ms": 100, "silence_duration_ms": 700}
    assert parse(transcribe(chunking_strategy=vad)).chunking == ChunkingOptions(0.3, 100, 700)
    only_type = parse(transcribe(chunking_strategy={"type": "server_vad"})).chunking
    assert only_type == ChunkingOptions()
    as_json = parse(raw_form({"model": "whisper-1", "chunking_strategy": '{"type": "server_vad", "threshold": 0.2}'}))
    assert as_json.chunking == ChunkingOptions(threshold=0.2)


@pytest.mark.parametrize(
    "strategy",
    [
        "manual",
        {"type": "semantic_vad"},
        {"threshold": 0.5},
        {"type": "server_vad", "threshold": 1.5},
        {"type": "server_vad", "threshold": "high"},
        {"type": "server_vad", "threshold": "nan"},
        {"type": "server_vad", "prefix_padding_ms": -1},
        {"type": "server_vad", "silence_duration_ms": 2.5},
        {"type": "server_vad", "eagerness": "low"},
        '{"type": "server_vad", "threshold": true}',
        '{"type": "server_vad", "silence_duration_ms": 2.5}',
        "{not json",
        "[1, 2]",
    ],
)
def test_bad_chunking_strategy_is_400(strategy):
    if isinstance(strategy, str):
        err = error_of(raw_form({"model": "whisper-1", "chunking_strategy": strategy}))
    else:
        err = error_of(transcribe(chunking_strategy=strategy))
    assert (err.status_code, err.param, err.code) == (400, "chunking_strategy", "invalid_value"), err.message


def test_stream_needs_a_text_format_and_translations_do_not_stream():
    for fmt in ("srt", "vtt", "verbose_json"):
        err = error_of(transcribe(stream=True, response_format=fmt))
        assert (err.status_code, err.param) == (400, "stream")
    # the SDK has no stream argument for translations; a hand-made form can still send one
    err = error_of(raw_form({"model": "whisper-1", "stream": "true"}), task=Task.TRANSLATE)
    assert (err.status_code, err.param, err.code) == (400, "stream", "unsupported_value")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "whisper-1", "temperature": "hot"}, "temperature"),
        ({"model": "whisper-1", "temperature": "1.5"}, "temperature"),
        ({"model": "whisper-1", "temperature": "-0.1"}, "temperature"),
        ({"model": "whisper-1", "response_format": "xml"}, "response_format"),
        ({"model": "whisper-1", "stream": "maybe"}, "stream"),
        ({"model": "whisper-1", "language": "klingon"}, "language"),
        (
            {"model": "whisper-1", "timestamp_granularities[]": "sentence", "response_format": "verbose_json"},
            "timestamp_granularities[]",
        ),
        ({"model": "whisper-1", "timestamp_granularities[]": "segment"}, "timestamp_granularities[]"),
        ({}, "model"),
    ],
)
def test_bad_field_values_are_400_naming_the_field(fields, param):
    err = error_of(raw_form(fields))
    assert err.status_code == 400
    assert err.param == param
    assert err.type == "invalid_request_error"


def test_missing_file_empty_file_and_text_file_field():
    missing = error_of(raw_form({"model": "whisper-1"}, file=None))
    assert (missing.status_code, missing.param, missing.code) == (400, "file", "missing_required_parameter")
    empty = error_of(raw_form({"model": "whisper-1"}, file=("a.wav", b"", "audio/wav")))
    assert (empty.status_code, empty.param) == (400, "file")
    as_text = error_of(raw_form({"model": "whisper-1"}, file="as-text"))
    assert (as_text.status_code, as_text.param) == (400, "file")


def test_unknown_fields_are_ignored():
    params = parse(raw_form({"model": "whisper-1", "hotwords": "x", "vllm_xargs": "{}", "extra[a]": "1"}))
    assert params.model == "whisper-1"


def test_translation_form_has_no_language_and_english_task():
    params = parse(translate(prompt="An English prompt.", response_format="srt"), task=Task.TRANSLATE)
    assert params.task is Task.TRANSLATE and params.language is None
    assert params.response_format is ResponseFormat.SRT
    assert error_of(translate(response_format="diarized_json"), task=Task.TRANSLATE).status_code == 400


def test_json_body_instead_of_multipart_is_400():
    def call(client: openai.OpenAI) -> None:
        client._client.post("http://test/v1/audio/transcriptions", json={"model": "whisper-1"})

    err = error_of(call)
    assert err.status_code == 400 and "multipart/form-data" in err.message


def test_malformed_multipart_is_400():
    def call(client: openai.OpenAI) -> None:
        client._client.post(
            "http://test/v1/audio/transcriptions",
            content=b"--xx\r\ngarbage",
            headers={"content-type": "multipart/form-data"},
        )  # no boundary

    assert error_of(call).status_code == 400


@pytest.mark.parametrize("content_length", [True, False])
def test_upload_over_limit_is_413_early_or_while_reading(content_length):
    settings = Settings(model="tiny.en", max_upload_mb=0.5)
    big = wav_bytes(seconds=40.0)  # 1.28 MB
    err = error_of(transcribe(file=("big.wav", big, "audio/wav")), settings=settings, content_length=content_length)
    assert (err.status_code, err.param) == (413, "file")
    assert str(settings.max_upload_bytes) in err.message


def test_file_just_over_limit_but_body_within_slack_is_413():
    settings = Settings(model="tiny.en", max_upload_mb=0.5)
    file = b"\0" * (settings.max_upload_bytes + 10)
    assert error_of(transcribe(file=("a.wav", file, "audio/wav")), settings=settings).status_code == 413


def test_json_body_limit_and_bad_json():
    def request(body: bytes) -> Request:
        return to_starlette(
            httpx.Request(
                "POST", "http://test/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
        )

    assert asyncio.run(read_json(request(b'{"a": 1}'), 100)) == {"a": 1}
    with pytest.raises(APIError) as info:
        asyncio.run(read_json(request(b"{nope"), 100))
    assert info.value.status_code == 400
    with pytest.raises(APIError) as info:
        asyncio.run(read_json(request(b"x" * 3 * 1024 * 1024), 100))
    assert info.value.status_code == 413


def test_language_codes_and_names():
    assert parse_language("en") == "en"
    assert parse_language("DE") == "de"
    assert parse_language("French") == "fr"
    assert parse_language("") is None and parse_language(None) is None
    with pytest.raises(APIError):
        parse_language("xx")


def test_temperature_zero_is_fallback_schedule_else_single():
    assert decode_options(Task.TRANSCRIBE, None, None, 0.0).temperatures == DEFAULT_TEMPERATURES
    options = decode_options(Task.TRANSLATE, "de", "Hallo", 0.3)
    assert options.temperatures == (0.3,)
    assert (options.task, options.language, options.prompt) == (Task.TRANSLATE, "de", "Hallo")
    assert decode_options(Task.TRANSCRIBE, None, "", 0.0).prompt is None
    assert decode_options(Task.TRANSCRIBE, None, None, 0.0, ChunkingOptions()).chunking == ChunkingOptions()


def test_decode_upload_real_audio_and_garbage():
    audio = asyncio.run(decode_upload(WAV, 60.0))
    assert audio.dtype == np.float32 and abs(len(audio) - 16000) < 200
    for bad in (b"not audio at all" * 100, WAV[:30], b"fLaC" + b"\0" * 200):
        with pytest.raises(APIError) as info:
            asyncio.run(decode_upload(bad, 60.0))
        assert (info.value.status_code, info.value.param) == (400, "file")


@pytest.mark.parametrize(
    ("granularities", "expected"),
    [(None, {"segment"}), (["word"], {"word"}), (["segment", "word"], {"segment", "word"})],
)
def test_timestamp_granularities_are_parsed(granularities, expected):
    kwargs = {"response_format": "verbose_json"}
    if granularities:
        kwargs["timestamp_granularities"] = granularities
    assert parse(transcribe(**kwargs)).granularities == expected

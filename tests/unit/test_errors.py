"""Every failure becomes OpenAI's error envelope with the status the SDK maps to the right exception."""

from __future__ import annotations

import asyncio

import openai
import pytest

from engine.request import EngineDeadError, EngineOverloadedError, InvalidRequestError, RequestAbortedError
from server.errors import APIError, from_engine_error
from tests.helpers.fake_engine import FakeEngine, clients, wav_bytes

FILE = ("speech.wav", wav_bytes(1.0), "audio/wav")
ENVELOPE_KEYS = {"message", "type", "param", "code"}


def run(coro):
    return asyncio.run(coro)


def test_api_error_body_is_openai_envelope():
    err = APIError(400, "bad language", param="language", code="invalid_value")
    assert err.body() == {
        "error": {
            "message": "bad language",
            "type": "invalid_request_error",
            "param": "language",
            "code": "invalid_value",
        }
    }
    assert APIError(500, "x").type == "server_error"
    assert APIError(429, "x").type == "rate_limit_exceeded"
    assert APIError(404, "x").body()["error"]["code"] is None  # code is a string or null, never an int


def test_engine_errors_map_to_statuses():
    overloaded = from_engine_error(EngineOverloadedError("full", retry_after_s=2.1))
    assert overloaded.status_code == 429 and overloaded.headers == {"Retry-After": "3"}
    assert from_engine_error(EngineOverloadedError("full", retry_after_s=0.0)).headers == {"Retry-After": "1"}
    invalid = from_engine_error(InvalidRequestError("English-only model", param="language"))
    assert (invalid.status_code, invalid.param) == (400, "language")
    assert from_engine_error(EngineDeadError("dead")).status_code == 503
    assert from_engine_error(RequestAbortedError("shutdown")).status_code == 503
    assert from_engine_error(RuntimeError("bug")).status_code == 500


def test_unknown_route_and_wrong_method():
    async def body():
        async with clients(FakeEngine()) as (_, http, _app):
            missing = await http.post("/v1/audio/nothing")
            assert missing.status_code == 404
            assert missing.json()["error"]["message"] == "Invalid URL (POST /v1/audio/nothing)"
            wrong = await http.get("/v1/audio/transcriptions")
            assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
            assert set(wrong.json()["error"]) == ENVELOPE_KEYS

    run(body())


def test_fastapi_validation_errors_become_400_envelopes():
    async def body():
        async with clients(FakeEngine()) as (_, http, app):

            @app.get("/test/{number}")
            async def typed(number: int) -> dict:
                return {"number": number}

            response = await http.get("/test/abc")
            assert response.status_code == 400
            error = response.json()["error"]
            assert set(error) == ENVELOPE_KEYS and error["param"] == "number"

    run(body())


@pytest.mark.parametrize(
    ("engine", "exception", "status"),
    [
        (FakeEngine(submit_error=EngineOverloadedError("queue full", retry_after_s=4)), openai.RateLimitError, 429),
        (FakeEngine(submit_error=InvalidRequestError("no", param="language")), openai.BadRequestError, 400),
        (FakeEngine(submit_error=EngineDeadError("gone")), openai.InternalServerError, 503),
        (FakeEngine(result_error=RequestAbortedError("shutting down")), openai.InternalServerError, 503),
        (FakeEngine(result_error=RuntimeError("a real bug")), openai.InternalServerError, 500),
        (FakeEngine(submit_error=ZeroDivisionError()), openai.InternalServerError, 500),
        (FakeEngine(alive=False), openai.InternalServerError, 503),
    ],
)
def test_engine_failures_reach_the_sdk_as_its_exceptions_and_server_keeps_serving(engine, exception, status):
    async def body():
        async with clients(engine) as (sdk, _, _app):
            with pytest.raises(exception) as info:
                await sdk.audio.transcriptions.create(file=FILE, model="whisper-1")
            assert info.value.status_code == status
            assert set(info.value.body) == ENVELOPE_KEYS
            if status == 429:
                assert info.value.response.headers["retry-after"] == "4"
            if status == 500:
                assert "a real bug" not in info.value.body["message"]  # no internals leak
            # The same app answers the next request normally.
            engine.submit_error = engine.result_error = None
            engine.alive = True
            assert (await sdk.audio.transcriptions.create(file=FILE, model="whisper-1")).text

    run(body())


@pytest.mark.parametrize(
    ("kwargs", "exception", "status", "param"),
    [
        ({"file": ("a.wav", b"", "audio/wav")}, openai.BadRequestError, 400, "file"),
        ({"file": ("a.mp3", b"\xff\xfb garbage " * 64, "audio/mpeg")}, openai.BadRequestError, 400, "file"),
        ({"response_format": "yaml"}, openai.BadRequestError, 400, "response_format"),
        ({"temperature": 3}, openai.BadRequestError, 400, "temperature"),
        ({"language": "zz"}, openai.BadRequestError, 400, "language"),
        ({"stream": True, "response_format": "srt"}, openai.BadRequestError, 400, "stream"),
        (
            {"chunking_strategy": {"type": "server_vad", "threshold": 2}},
            openai.BadRequestError,
            400,
            "chunking_strategy",
        ),
        ({"model": "gpt-4o-transcribe"}, openai.NotFoundError, 404, "model"),
        ({"file": ("big.wav", wav_bytes(30.0), "audio/wav")}, openai.APIStatusError, 413, "file"),
    ],
)
def test_bad_inputs_through_the_sdk(kwargs, exception, status, param):
    async def body():
        async with clients(FakeEngine(), max_upload_mb=0.5) as (sdk, _, _app):
            args = {"file": FILE, "model": "whisper-1", **kwargs}
            with pytest.raises(exception) as info:
                await sdk.audio.transcriptions.create(**args)
            assert info.value.status_code == status
            assert info.value.body["param"] == param
            assert (await sdk.audio.transcriptions.create(file=FILE, model="whisper-1")).text

    run(body())

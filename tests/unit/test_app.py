"""Routes end to end in-process (ASGITransport + the real SDK) against a fake engine."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import openai
import pytest
import srt
import webvtt
from openai.types.audio import TranscriptionVerbose
from starlette.requests import Request

from engine.request import DEFAULT_TEMPERATURES, DecodeOptions, Task
from server.drain import Drain
from server.errors import ClientDisconnectedError
from server.streaming import submit, wait_result
from tests.helpers.fake_engine import FakeEngine, clients, wav_bytes

WAV = wav_bytes(2.0)
FILE = ("speech.wav", WAV, "audio/wav")
pytestmark = pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # SDK marks translations



def transcribe(engine, audio, options, request):
    """What the routes do: submit, then wait for the result while watching the client."""
    drain = Drain(5.0)
    return wait_result(submit(engine, audio, options, drain), request, drain)

def run(coro):
    return asyncio.run(coro)


def test_models_list_and_retrieve():
    async def body():
        async with clients(FakeEngine(), served_model_name="my-whisper", model_alias=["gpt-4o-transcribe-diarize"]) as (
            sdk, http, _,
        ):  # fmt: skip
            page = await sdk.models.list()
            assert [m.id for m in page.data] == ["my-whisper", "whisper-1", "gpt-4o-transcribe-diarize"]
            assert all(m.object == "model" and isinstance(m.created, int) for m in page.data)
            assert (await sdk.models.retrieve("whisper-1")).id == "whisper-1"
            with pytest.raises(openai.NotFoundError):
                await sdk.models.retrieve("gpt-4o")
            raw = (await http.get("/v1/models")).json()
            assert raw["object"] == "list" and "shutdown_date" not in raw["data"][0]

    run(body())


def test_health_follows_engine_liveness():
    async def body():
        engine = FakeEngine()
        async with clients(engine) as (_, http, _app):
            ok = await http.get("/health")
            assert ok.status_code == 200 and ok.json()["status"] == "ok"
            engine.alive = False
            dead = await http.get("/health")
            assert dead.status_code == 503 and set(dead.json()["error"]) == {"message", "type", "param", "code"}
        async with clients(None) as (_, http, _app):  # no engine yet (lifespan not run)
            assert (await http.get("/health")).status_code == 503

    run(body())


def test_transcription_passes_options_to_engine():
    async def body():
        engine = FakeEngine()
        async with clients(engine) as (sdk, _, _app):
            result = await sdk.audio.transcriptions.create(
                file=FILE, model="whisper-1", language="de", prompt="Ein Satz.", temperature=0.5
            )
            assert result.text == "Hello there. General Kenobi."
            assert result.usage.type == "duration" and result.usage.seconds == 2
            options = engine.last_options
            assert (options.task, options.language, options.prompt) == (Task.TRANSCRIBE, "de", "Ein Satz.")
            assert options.temperatures == (0.5,)
            await sdk.audio.transcriptions.create(file=FILE, model="tiny.en")
            assert engine.last_options.temperatures == DEFAULT_TEMPERATURES
            assert engine.last_options.language is None
            assert abs(len(engine.handles[-1].audio) - 32000) < 200  # decoded to 16 kHz

    run(body())


def test_every_response_format_through_the_sdk():
    async def body():
        async with clients(FakeEngine()) as (sdk, http, _):
            create = sdk.audio.transcriptions.create
            text = await create(file=FILE, model="whisper-1", response_format="text")
            assert text == "Hello there. General Kenobi.\n"
            subs = list(srt.parse(await create(file=FILE, model="whisper-1", response_format="srt")))
            assert [s.content for s in subs] == ["Hello there.", "General Kenobi."]
            vtt = await create(file=FILE, model="whisper-1", response_format="vtt")
            assert [c.text for c in webvtt.from_string(vtt)] == ["Hello there.", "General Kenobi."]
            verbose = await create(
                file=FILE, model="whisper-1", response_format="verbose_json", timestamp_granularities=["segment"]
            )
            assert isinstance(verbose, TranscriptionVerbose)
            assert verbose.language == "english" and verbose.duration == pytest.approx(2.0)
            assert [s.id for s in verbose.segments] == [0, 1]
            for fmt, media in [
                ("json", "application/json"),
                ("verbose_json", "application/json"),
                ("text", "text/plain; charset=utf-8"),
                ("srt", "text/plain; charset=utf-8"),
                ("vtt", "text/plain; charset=utf-8"),
            ]:
                response = await http.post(
                    "/v1/audio/transcriptions",
                    files={"file": FILE},
                    data={"model": "whisper-1", "response_format": fmt},
                )
                assert response.status_code == 200
                assert response.headers["content-type"] == media

    run(body())


def test_translation_is_english_task_without_language():
    async def body():
        engine = FakeEngine()
        async with clients(engine) as (sdk, _, _app):
            plain = await sdk.audio.translations.create(file=FILE, model="whisper-1")
            assert plain.text == "Hello there. General Kenobi."
            assert engine.last_options.task is Task.TRANSLATE and engine.last_options.language is None
            verbose = await sdk.audio.translations.create(file=FILE, model="whisper-1", response_format="verbose_json")
            assert verbose.language == "english"

    run(body())


def test_decoding_runs_off_the_event_loop(monkeypatch):
    import server.parsing.audio

    threads = []
    real = server.parsing.audio.decode_audio

    def spy(data, max_duration_s):
        threads.append(threading.current_thread())
        return real(data, max_duration_s)

    monkeypatch.setattr(server.parsing.audio, "decode_audio", spy)

    async def body():
        async with clients(FakeEngine()) as (sdk, _, _app):
            await sdk.audio.transcriptions.create(file=FILE, model="whisper-1")
        return threading.current_thread()

    loop_thread = run(body())
    assert threads and threads[0] is not loop_thread


def test_metrics_read_engine_stats_off_the_event_loop():
    threads = []

    class Engine(FakeEngine):
        def stats(self):
            threads.append(threading.current_thread())
            return super().stats()

    async def body():
        async with clients(Engine()) as (_, http, _app):
            assert (await http.get("/metrics")).status_code == 200
        return threading.current_thread()

    loop_thread = run(body())
    assert threads and threads[0] is not loop_thread


def test_disconnect_aborts_the_engine_request():
    engine = FakeEngine(block=True)
    options = DecodeOptions()

    async def body():
        received = asyncio.Event()

        async def receive() -> dict:
            await asyncio.sleep(0.05)
            received.set()
            return {"type": "http.disconnect"}

        request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
        with pytest.raises(ClientDisconnectedError):
            await asyncio.wait_for(transcribe(engine, WAV, options, request), timeout=5)
        assert received.is_set()

    run(body())
    assert engine.aborted == [engine.handles[0].request_id]
    assert engine.handles[0].aborted


def test_cancelled_handler_aborts_too():
    engine = FakeEngine(block=True)

    async def body():
        async def receive() -> dict:
            await asyncio.Event().wait()
            return {}

        request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
        task = asyncio.ensure_future(transcribe(engine, WAV, DecodeOptions(), request))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(body())
    assert engine.handles[0].aborted


def test_metrics_count_requests_engine_gauges_and_audio_seconds():
    async def body():
        async with clients(FakeEngine()) as (sdk, http, _):
            await sdk.audio.transcriptions.create(file=FILE, model="whisper-1")
            with pytest.raises(openai.NotFoundError):
                await sdk.audio.transcriptions.create(file=FILE, model="nope")
            await http.get("/no/such/route")
            response = await http.get("/metrics")
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
            return response.text

    text = run(body())
    assert 'whisper_http_requests_total{method="POST",route="/v1/audio/transcriptions",status="200"} 1.0' in text
    assert 'whisper_http_requests_total{method="POST",route="/v1/audio/transcriptions",status="404"} 1.0' in text
    assert 'route="unmatched",status="404"' in text
    assert "whisper_queue_depth 3.0" in text and "whisper_running_sequences 2.0" in text
    assert 'whisper_audio_seconds_total{model="tiny.en",task="transcribe"} 2.0' in text
    assert 'whisper_http_request_duration_seconds_count{route="/v1/audio/transcriptions"} 2.0' in text


def test_two_apps_have_separate_registries():
    async def body():
        async with clients(FakeEngine()) as (sdk, _, _app), clients(FakeEngine()) as (_, other, _app2):
            await sdk.audio.transcriptions.create(file=FILE, model="whisper-1")
            return (await other.get("/metrics")).text

    text = run(body())
    assert 'whisper_audio_seconds_total{model="tiny.en",task="transcribe"}' not in text
    assert 'route="/v1/audio/transcriptions"' not in text


def chat_body(*, data: str | None = None, text: str | None = None, system: str | None = None, **extra) -> dict:
    parts = [{"type": "input_audio", "input_audio": {"data": data or base64.b64encode(WAV).decode(), "format": "wav"}}]
    if text:
        parts.insert(0, {"type": "text", "text": text})
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": parts})
    return {"model": "whisper-1", "messages": messages, **extra}


def test_chat_completion_with_input_audio():
    async def body():
        engine = FakeEngine()
        async with clients(engine) as (sdk, _, _app):
            completion = await sdk.chat.completions.create(**chat_body(text="Transcribe this."))
            assert completion.object == "chat.completion"
            assert completion.choices[0].message.role == "assistant"
            assert completion.choices[0].message.content == "Hello there. General Kenobi."
            assert completion.choices[0].finish_reason == "stop"
            assert completion.usage.completion_tokens == 11
            assert engine.last_options.task is Task.TRANSCRIBE
            await sdk.chat.completions.create(**chat_body(system="Translate the audio into English."))
            assert engine.last_options.task is Task.TRANSLATE
            await sdk.chat.completions.create(**chat_body(text="Do not translate, just transcribe."))
            assert engine.last_options.task is Task.TRANSCRIBE
            body = chat_body()
            body["messages"].insert(0, {"role": "system", "content": [{"type": "text", "text": "Translate it."}]})
            await sdk.chat.completions.create(**body)
            assert engine.last_options.task is Task.TRANSLATE

    run(body())


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (chat_body(temperature=2), openai.BadRequestError),
        (chat_body(data="@@not base64@@"), openai.BadRequestError),
        (chat_body(data=base64.b64encode(b"garbage" * 50).decode()), openai.BadRequestError),
        ({"model": "whisper-1", "messages": [{"role": "user", "content": "hi"}]}, openai.BadRequestError),
        ({"model": "whisper-1", "messages": []}, openai.BadRequestError),
        ({"model": "gpt-4o", "messages": chat_body()["messages"]}, openai.NotFoundError),
    ],
)
def test_chat_completion_errors(body, error):
    async def go():
        async with clients(FakeEngine()) as (sdk, _, _app):
            with pytest.raises(error) as info:
                await sdk.chat.completions.create(**body)
            assert set(info.value.body) == {"message", "type", "param", "code"}
            assert (await sdk.chat.completions.create(**chat_body())).choices[0].message.content

    run(go())


def test_chat_template_file_is_used(tmp_path):
    template = tmp_path / "custom.jinja"
    template.write_text("[{{ task }}/{{ language_name }}] {{ text }} ({{ segments|length }} segments)")

    async def body():
        async with clients(FakeEngine(), chat_template=str(template)) as (sdk, _, _app):
            completion = await sdk.chat.completions.create(**chat_body())
            return completion.choices[0].message.content

    assert run(body()) == "[transcribe/english] Hello there. General Kenobi. (2 segments)"


def test_openapi_schema_documents_multipart_fields():
    async def body():
        async with clients(FakeEngine()) as (_, http, _app):
            return (await http.get("/openapi.json")).json()

    schema = run(body())
    form = schema["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert {"file", "model", "timestamp_granularities[]"} <= set(form["schema"]["properties"])
    assert json.dumps(schema)  # serializable


def test_settings_from_env_flags_and_engine_config(monkeypatch):
    from server.cli import build_parser, settings_from_args
    from server.settings import Settings

    monkeypatch.setenv("WHISPER_MAX_UPLOAD_MB", "3")
    monkeypatch.setenv("WHISPER_PORT", "1234")
    monkeypatch.setenv("WHISPER_ENFORCE_EAGER", "true")
    parser = build_parser()
    settings = settings_from_args(
        parser,
        parser.parse_args(
            ["serve", "--port", "9000", "--model", "base", "--dtype", "float16", "--served-model-name", "w"]
        ),
    )
    assert (settings.port, settings.max_upload_mb, settings.model, settings.model_id) == (9000, 3.0, "base", "w")
    assert settings.max_upload_bytes == 3 * 1024 * 1024
    config = settings.engine_config()
    assert (config.model, config.dtype, config.enforce_eager, config.device) == ("base", "float16", True, "auto")
    defaults = Settings(_env_prefix="UNUSED_PREFIX_")
    assert (defaults.model, defaults.host, defaults.port, defaults.device) == ("tiny.en", "127.0.0.1", 8000, "auto")
    assert all(field.description for field in Settings.model_fields.values())
    serve_flags = {a.dest for a in parser._subparsers._group_actions[0].choices["serve"]._actions}
    assert set(Settings.model_fields) <= serve_flags
    with pytest.raises(SystemExit):
        settings_from_args(parser, parser.parse_args(["serve", "--max-upload-mb", "-1"]))
    assert not config.kernels.batch_invariant
    invariant = settings_from_args(parser, parser.parse_args(["serve", "--batch-invariant"])).engine_config()
    assert invariant.kernels.batch_invariant and invariant.kernels.pdl  # the other kernel choices kept


def test_every_engine_config_field_is_a_setting():
    """One settings object for every knob: a new EngineConfig field needs a Settings field (and flag, env var)."""
    import dataclasses

    from engine.config import EngineConfig
    from server.settings import Settings

    # shared_gpu is the server's own conclusion from --data-parallel-gpus (Settings.engine_members), not a knob;
    # loras is each served model's own (--lora, a models file's loras:)
    names = {f.name for f in dataclasses.fields(EngineConfig)} - {"shared_gpu", "loras"}
    assert names <= set(Settings.model_fields), names - set(Settings.model_fields)
    members = Settings(device="cuda", data_parallel_size=3, data_parallel_gpus="0,0,1").engine_members()
    assert [(c.gpu_memory_fraction, c.shared_gpu, g) for c, g in members] == [(0.45, True, 0), (0.45, True, 0),
                                                                            (0.9, False, 1)]  # fmt: skip
    config = Settings(max_encoder_batch=3, max_text_ctx=224, tokenizer="tok.json").engine_config()
    assert (config.max_encoder_batch, config.max_text_ctx, config.tokenizer) == (3, 224, "tok.json")
    defaults = EngineConfig()
    from_settings = Settings(_env_prefix="UNUSED_PREFIX_").engine_config()
    assert all(getattr(from_settings, n) == getattr(defaults, n) for n in names)  # same defaults both sides


def test_a_request_makes_no_thread_pool_hop_for_dependencies(monkeypatch):
    """A plain `def` dependency runs in FastAPI's thread pool: a hop per dependency and request, each one waiting
    for the GIL that the engine loop needs. Ours are async, so serving a transcription makes none."""
    import fastapi.dependencies.utils as fastapi_deps

    hops = []
    original = fastapi_deps.run_in_threadpool

    async def counting(func, *args, **kwargs):
        hops.append(getattr(func, "__name__", repr(func)))
        return await original(func, *args, **kwargs)

    monkeypatch.setattr(fastapi_deps, "run_in_threadpool", counting)

    async def body():
        async with clients(FakeEngine()) as (sdk, http, _):
            result = await sdk.audio.transcriptions.create(model="whisper-1", file=FILE)
            assert result.text
            assert (await http.get("/v1/models")).status_code == 200
            assert (await http.get("/metrics")).status_code == 200

    run(body())
    assert hops == []


def test_what_start_up_made_is_frozen_out_of_garbage_collection():
    """server/heap.py: once the app is up, a full collection no longer walks what start-up made (in a CPU server a
    full collection of those paused every session for 150-200 ms)."""
    import gc

    from server.app import create_app
    from server.settings import Settings

    app = create_app(Settings(model="tiny.en"), engine=FakeEngine())
    gc.unfreeze()

    async def body():
        async with app.router.lifespan_context(app):
            return gc.get_freeze_count()

    try:
        assert run(body()) > 1000
    finally:
        gc.unfreeze()


def test_live_decodes_in_flight_default_by_device(monkeypatch):
    """--realtime-max-partial-decodes unset: a GPU's engine batches many live decodes side by side, a CPU's cores
    are the finals'; a value given is kept on either."""
    import torch

    import server.app
    from server.realtime.load import CPU_PARTIAL_DECODES, GPU_PARTIAL_DECODES
    from server.settings import Settings

    def cap(device: str, **flags) -> int:
        monkeypatch.setattr(server.app, "resolve_device", lambda name: torch.device(device))
        settings = Settings(model="tiny.en", realtime_vad_process="off", **flags)
        return server.app.create_app(settings, engine=FakeEngine()).state.realtime.max_partials

    assert (cap("cpu"), cap("cuda")) == (CPU_PARTIAL_DECODES, GPU_PARTIAL_DECODES)
    assert GPU_PARTIAL_DECODES > CPU_PARTIAL_DECODES
    assert cap("cuda", realtime_max_partial_decodes=4) == 4 and cap("cpu", realtime_max_partial_decodes=0) == 0

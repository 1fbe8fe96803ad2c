"""A stand-in for engine.engine.Engine so that route tests run without weights (unit tests only, never e2e)."""

from __future__ import annotations

import asyncio
import io
import itertools
import wave
from contextlib import asynccontextmanager

import httpx
import numpy as np
import openai

from engine.audio.constants import SAMPLE_RATE
from engine.model.lora import AdapterError
from engine.request import DecodeOptions, EngineStats, Segment, SegmentEvent, TranscriptionResult
from server.app import create_app
from server.settings import Settings


def wav_bytes(seconds: float = 1.0) -> bytes:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def fake_result(audio: np.ndarray, options: DecodeOptions) -> TranscriptionResult:
    duration = len(audio) / SAMPLE_RATE
    half = round(duration / 2, 2)
    segments = [
        Segment(
            id=0,
            seek=0,
            start=0.0,
            end=half,
            text=" Hello there.",
            tokens=[50364, 2425, 456, 13, 50414],
            temperature=options.temperatures[0],
            avg_logprob=-0.2,
            compression_ratio=0.9,
            no_speech_prob=0.01,
        ),
        Segment(
            id=1,
            seek=0,
            start=half,
            end=round(duration, 2),
            text=" General Kenobi.",
            tokens=[50414, 6996, 591, 996, 13, 50464],
            temperature=options.temperatures[0],
            avg_logprob=-0.3,
            compression_ratio=0.9,
            no_speech_prob=0.02,
        ),
    ]
    return TranscriptionResult(
        text=" Hello there. General Kenobi.",
        segments=segments,
        language=options.language or "en",
        duration=duration,
        num_tokens=11,
    )


class FakeHandle:
    def __init__(self, engine: FakeEngine, audio: np.ndarray, options: DecodeOptions, request_id: str):
        self.engine = engine
        self.audio = audio
        self.options = options
        self.request_id = request_id
        self.aborted = False

    async def result(self) -> TranscriptionResult:
        if self.engine.block:
            await asyncio.Event().wait()  # never finishes; only a disconnect ends the request
        await asyncio.sleep(0)
        if self.engine.result_error is not None:
            raise self.engine.result_error
        return fake_result(self.audio, self.options)

    async def events(self):
        result = await self.result()
        yield SegmentEvent(segments=result.segments)

    def abort(self) -> None:
        self.aborted = True
        self.engine.aborted.append(self.request_id)


class FakeEngine:
    model_name = "tiny.en"

    def __init__(
        self,
        *,
        alive: bool = True,
        submit_error: Exception | None = None,
        result_error: BaseException | None = None,
        block: bool = False,
        is_multilingual: bool = True,
    ):
        self.alive = alive
        self.submit_error = submit_error
        self.result_error = result_error
        self.block = block
        self.is_multilingual = is_multilingual
        self.handles: list[FakeHandle] = []
        self.aborted: list[str] = []
        self._ids = itertools.count()

    @property
    def is_alive(self) -> bool:
        return self.alive

    @property
    def failure(self) -> str | None:
        return None if self.alive else "the fake engine is down"

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        self.alive = False

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(num_waiting=3, num_running=2, num_slots=8)

    def change_adapter(self, name: str, folder: str | None) -> None:
        raise AdapterError("the fake engine takes no adapters")

    def submit(self, audio: np.ndarray, options: DecodeOptions) -> FakeHandle:
        if self.submit_error is not None:
            raise self.submit_error
        handle = FakeHandle(self, audio, options, f"req-{next(self._ids)}")
        self.handles.append(handle)
        return handle

    @property
    def last_options(self) -> DecodeOptions:
        return self.handles[-1].options


@asynccontextmanager
async def clients(engine: FakeEngine | None = None, **settings):
    """(AsyncOpenAI, httpx.AsyncClient, app) talking to an in-process app through ASGITransport."""
    app = create_app(Settings(**{"model": "tiny.en", **settings}), engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        sdk = openai.AsyncOpenAI(api_key="test", base_url="http://test/v1", http_client=http, max_retries=0)
        yield sdk, http, app

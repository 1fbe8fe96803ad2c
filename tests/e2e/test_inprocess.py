"""The in-process path: create_app(settings, engine=<real started Engine>) behind ASGITransport."""

from __future__ import annotations

import asyncio

import httpx
import openai

from server.app import create_app
from server.settings import Settings
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words


def test_real_engine_in_process(tiny_engine, data_dir):
    app = create_app(Settings(model="tiny.en"), engine=tiny_engine)

    async def run() -> tuple[str, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            client = openai.AsyncOpenAI(api_key="unused", base_url="http://test/v1", http_client=http, max_retries=0)
            result = await client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
            verbose = await client.audio.transcriptions.create(
                file=data_dir / JFK, model="whisper-1", response_format="verbose_json"
            )
            assert verbose.text == result.text and verbose.language == "english"
            return result.text, (await http.get("/health")).status_code

    text, health = asyncio.run(run())
    assert contains_words(text, JFK_WORDS), text
    assert health == 200
    assert tiny_engine.is_alive  # the app does not stop an engine it was handed

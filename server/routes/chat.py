"""POST /v1/chat/completions with an `input_audio` part: the assistant's answer is the transcript."""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from dataclasses import dataclass, replace
from functools import partial

from fastapi import APIRouter, Request

from engine import SAMPLE_RATE, Task

from ..chat_stream import Answer, completion_chunks
from ..deps import MetricsDep, ModelsDep, SettingsDep
from ..errors import APIError
from ..parsing.audio import decode_upload
from ..parsing.body import read_json, validate_model
from ..parsing.fields import check_model, parse_language
from ..parsing.options import decode_options
from ..protocol import ChatCompletionRequest, ChatMessage
from ..streaming import sse_response, submit, wait_result

router = APIRouter(tags=["chat"])

# OpenAI documents wav and mp3; the decoder sniffs the bytes, so the transcription formats work as well.
AUDIO_FORMATS = {"wav", "mp3", "flac", "m4a", "mp4", "mpeg", "mpga", "oga", "ogg", "opus", "webm"}
# "Translate this", "translation please", but not "do not translate".
TRANSLATE_PATTERN = re.compile(r"(?<!not )(?<!n't )(?<!no )\btranslat", re.IGNORECASE)


# base64 is decoded this many characters at a time, the event loop free between pieces (one call over 33 MB
# holds the GIL for ~50-100 ms).
B64_PIECE_CHARS = 1 << 20


@dataclass(frozen=True, slots=True)
class AudioTurn:
    data: str  # base64
    param: str  # where it was in the body, for errors
    instruction: str  # system and user text, e.g. "Translate this into English."


def extract_audio_turn(messages: list[ChatMessage]) -> AudioTurn:
    """The one `input_audio` part of the last user message that has audio, plus the text around it."""
    turns = [
        (i, m)
        for i, m in enumerate(messages)
        if m.role == "user" and isinstance(m.content, list) and any(p.type == "input_audio" for p in m.content)
    ]
    if not turns:
        raise APIError(
            400,
            "No audio found: send the audio as a user message part "
            '{"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav"}}.',
            param="messages",
            code="invalid_value",
        )
    index, message = turns[-1]
    audio_parts = [(j, p) for j, p in enumerate(message.content) if p.type == "input_audio"]
    if len(audio_parts) > 1:
        raise APIError(
            400,
            "Only one input_audio part per request is supported.",
            param=f"messages[{index}].content",
            code="unsupported_value",
        )
    j, part = audio_parts[0]
    param = f"messages[{index}].content[{j}].input_audio"
    if part.input_audio is None:
        raise APIError(400, "input_audio part without an 'input_audio' object.", param=param, code="invalid_value")
    if part.input_audio.format not in AUDIO_FORMATS:
        raise APIError(
            400,
            f"Unsupported input_audio format '{part.input_audio.format}'; use 'wav' or 'mp3'.",
            param=f"{param}.format",
            code="invalid_value",
        )
    if not part.input_audio.data:
        raise APIError(400, "input_audio.data is empty.", param=f"{param}.data", code="invalid_value")
    texts = [message_text(m) for m in messages if m.role in ("system", "developer")]
    instruction = "\n".join([*texts, message_text(message)])
    return AudioTurn(data=part.input_audio.data, param=f"{param}.data", instruction=instruction)


async def decode_base64(turn: AudioTurn) -> bytes:
    """The audio's bytes, decoded a piece at a time with the event loop free in between."""
    text, pieces = turn.data, []
    try:
        for start in range(0, len(text), B64_PIECE_CHARS):  # a multiple of 4: each piece decodes alone
            pieces.append(base64.b64decode(text[start : start + B64_PIECE_CHARS], validate=True))
            await asyncio.sleep(0)
    except (binascii.Error, ValueError):
        raise APIError(400, "input_audio.data is not valid base64.", param=turn.param, code="invalid_value") from None
    return b"".join(pieces)


def message_text(message: ChatMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(p.text for p in message.content or () if p.type == "text" and p.text)


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request, models: ModelsDep, settings: SettingsDep, metrics: MetricsDep):
    """Chat-shaped transcription: a system or user text that asks to translate selects task=translate."""
    body = await read_json(request, settings.max_upload_bytes)
    chat: ChatCompletionRequest = validate_model(ChatCompletionRequest, body)
    check_model(chat.model, settings)
    engine = await models.ready(chat.model)
    served = models.label(chat.model)  # the metrics' model label
    turn = extract_audio_turn(chat.messages)
    task = Task.TRANSLATE if TRANSLATE_PATTERN.search(turn.instruction) else Task.TRANSCRIBE
    language = parse_language(chat.language) if task is Task.TRANSCRIBE else None
    audio = await decode_upload(await decode_base64(turn), settings.max_audio_seconds, param="messages")
    # the token count (usage, max_tokens) is of text tokens, which the segments' logprobs list one by one
    options = decode_options(task, language, None, chat.temperature or 0.0, settings=settings, logprobs=True)
    options = replace(options, adapter=models.adapter(chat.model))
    answer = Answer(request.app.state.chat_template, task, turn.instruction, chat.model, len(audio) / SAMPLE_RATE)
    drain = request.app.state.drain
    handle = submit(engine, audio, options, drain)
    del audio  # the engine has the samples: hours of audio are not held twice while it decodes
    if chat.stream:
        include_usage = chat.stream_options is not None and chat.stream_options.include_usage
        on_done = partial(metrics.observe_result, task, model=served)
        chunks = completion_chunks(answer, handle, chat.token_limit, include_usage, on_done, drain)
        return sse_response(handle, chunks, drain)
    result = await wait_result(handle, request, drain)
    metrics.observe_result(task, result, model=served)
    return answer.completion(result, chat.token_limit)

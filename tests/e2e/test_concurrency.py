"""Continuous batching must not change results: 16 concurrent requests == the same 16 sent one by one.

verbose_json only: the response format does not reach the engine (every format decodes with timestamps), and
verbose_json's body holds what the text format's does (the text) and more (segments, tokens, times), so a run as
`text` would repeat this one's check."""

from __future__ import annotations

import asyncio
import json

# Probabilities may differ in the last bits with the batch size (GEMM blocking); tokens and text may not.
BATCH_SENSITIVE = ("avg_logprob", "no_speech_prob")

CLIPS = [
    "g1_en_jfk.flac",
    "g1_en_librispeech-test-clean_1089-134686-0001.wav",
    "g1_en_librispeech-test-clean_1221-135766-0002.wav",
    "g1_en_librispeech-test-clean_1995-1837-0001.wav",
    "g1_en_librispeech-test-clean_61-70968-0000.flac",
    "g1_en_librispeech-test-other_1688-142285-0001.flac",
    "g1_en_librispeech-test-other_1688-142285-0002.flac",
    "g1_en_librispeech-dev-clean_1272-128104-0000.wav",
    "g1_en_librispeech-dev-clean_2412-153948-0000.flac",
    "g1_en_librivox_sense-and-sensibility-0870.wav",
    "g1_en_librivox_sense-and-sensibility-0880.wav",
    "g1_en_ljspeech_LJ002-0020.wav",
    "g1_en_timit-sample_LDC93S1.wav",
    "g1_en_platforms.wav",
    "g1_en_falsetto_mfa-falsetto.flac",
    "g1_en_3speakers_picovoice-diarization.wav",
]


def test_concurrent_equals_sequential(server, data_dir):
    assert len(CLIPS) == 16

    async def one(client, name: str) -> str:
        raw = await client.audio.transcriptions.with_raw_response.create(
            file=data_dir / name, model="whisper-1", response_format="verbose_json"
        )
        return raw.text  # the exact body bytes, decoded

    async def run() -> tuple[list[str], list[str]]:
        async with server.async_client() as client:
            sequential = [await one(client, name) for name in CLIPS]
            concurrent = await asyncio.gather(*(one(client, name) for name in CLIPS))
        return sequential, list(concurrent)

    sequential, concurrent = asyncio.run(run())
    assert all(body.strip() for body in sequential)
    for name, alone, batched in zip(CLIPS, sequential, concurrent):
        assert comparable(batched) == comparable(alone), f"{name} differs when batched"


def comparable(body: str) -> dict:
    parsed = json.loads(body)
    for segment in parsed["segments"]:
        for key in BATCH_SENSITIVE:
            segment.pop(key)
    return parsed

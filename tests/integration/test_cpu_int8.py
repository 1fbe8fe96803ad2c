"""int8 decode weights on the CPU (KernelOptions.cpu_int8_weights) against float32, real tiny.en on the test
clips: the same words. The packaged tiny.en is float16, so int8 is a quantization of it: where a token's two
likeliest choices are nearly tied it can flip between spellings of one word (`I'm` / `i'm` on the spontaneous
clip), which the comparison normalises (case and punctuation); any other change fails."""

from __future__ import annotations

import re

import pytest

from engine import DecodeOptions, Engine, EngineConfig, KernelOptions, decode_audio

CLIPS = [
    "g1_en_jfk.flac",
    "g1_en_librispeech-test-clean_1221-135766-0001.wav",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
    "g2_en_earnings22_4482311_3-62s.wav",
    "g1_en_librispeech-test-other_1688-142285-0000.flac",
]


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


@pytest.fixture(scope="module")
def transcripts(data_dir):
    from engine.kernels import cpu_kernels

    if cpu_kernels.load() is None:
        pytest.skip("the native CPU kernels do not build here")
    audios = [decode_audio(data_dir / c) for c in CLIPS]
    out = {}
    for int8 in (False, True):
        engine = Engine(EngineConfig(model="tiny.en", device="cpu", kernels=KernelOptions(cpu_int8_weights=int8)))
        engine.start()
        try:
            out[int8] = [engine.transcribe(a, DecodeOptions(language="en")) for a in audios]
        finally:
            engine.shutdown()
    return out


def test_int8_decode_weights_give_float32s_words(transcripts):
    same_tokens = 0
    for clip, f32, int8 in zip(CLIPS, transcripts[False], transcripts[True]):
        assert words(int8.text) == words(f32.text), clip
        same_tokens += [s.tokens for s in f32.segments] == [s.tokens for s in int8.segments]
    assert same_tokens >= len(CLIPS) - 1  # token for token on all but a near-tie

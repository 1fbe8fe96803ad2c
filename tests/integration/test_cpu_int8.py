"""dtype int8 on the CPU (int8 weights in the decoder's and the encoder's products, the encoder's activations a
scale per row) against float32, real tiny.en on the test clips: the same words but for named near-ties. The
packaged tiny.en is float16, so int8 is a quantization of it: where a token's two likeliest choices are nearly tied
it can flip between spellings of one word (`I'm` / `i'm` on the spontaneous clip), which the comparison
normalises (case and punctuation), or drop a closing word; any other change fails."""

from __future__ import annotations

import re

import jiwer
import pytest

from engine import DecodeOptions, Engine, EngineConfig, decode_audio

# One window each: int8 computation is the slow path on a CPU without AVX-512 VNNI (about ten times float32's
# time), and a longer recording's later windows run the same products on more of the same kind of speech.
# Read speech, and the spontaneous clip whose near-ties int8 flips (test_weight_formats.py computes an int8
# checkpoint in int8 on more clips).
CLIPS = [
    "g1_en_jfk.flac",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
]
# The encoder's int8 activations (CTranslate2's scheme, as close to float32 as CTranslate2's own int8 encoder)
# lose the last word, said softly after a pause; faster-whisper int8 keeps it.
INT8_WORD_DIFFERENCES = {"g1_en_spontaneous_mfa-acoustic-corpus.wav": "should be all thanks -> should be all"}
MAX_EDITS = 2


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


@pytest.fixture(scope="module")
def transcripts(data_dir):
    from engine.kernels import cpu_kernels

    if cpu_kernels.load() is None:
        pytest.skip("the native CPU kernels do not build here")
    audios = [decode_audio(data_dir / c) for c in CLIPS]
    out = {}
    for dtype in ("float32", "int8"):
        engine = Engine(EngineConfig(model="tiny.en", device="cpu", dtype=dtype))
        engine.start()
        try:
            assert engine.runner.int8_weights == (dtype == "int8")
            out[dtype] = [engine.transcribe(a, DecodeOptions(language="en")) for a in audios]
        finally:
            engine.shutdown()
    return out


def test_int8_gives_float32s_words(transcripts):
    unexpected = {}
    for clip, f32, int8 in zip(CLIPS, transcripts["float32"], transcripts["int8"]):
        want, got = words(f32.text), words(int8.text)
        if want == got:
            continue
        edits = jiwer.process_words(" ".join(want), " ".join(got))
        if clip not in INT8_WORD_DIFFERENCES or edits.substitutions + edits.deletions + edits.insertions > MAX_EDITS:
            unexpected[clip] = (f32.text, int8.text)
    assert not unexpected, unexpected

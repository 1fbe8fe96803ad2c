"""One set of tiny.en weights in three formats: CTranslate2 float16 (the package), HF safetensors, CTranslate2 int8
(dequantized to float32, and computed in int8: a CPU's default for an int8 checkpoint)."""

from __future__ import annotations

import jiwer
import pytest

from tests.helpers.engine_runs import submit_all, tokens_of
from tests.helpers.transcripts import normalize_english
from tests.helpers.weights_export import write_hf_export

# A spread of speakers, lengths and codecs; submitting them together also exercises batching.
CLIPS = (
    "g1_en_jfk.flac",
    "g1_en_librispeech-test-clean_1089-134686-0001.wav",
    "g1_en_librispeech-test-clean_1995-1837-0001.wav",
    "g1_en_librispeech-test-other_1688-142285-0001.flac",
    "g1_en_librivox_sense-and-sensibility-0890.wav",
    "g1_en_ljspeech_LJ002-0020.wav",
    "g1_en_timit-sample_LDC93S1.wav",
    "g1_en_one-two-three.wav",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
    "g1_en_whispered_mfa-whisper.flac",
    "g1_en_3speakers_picovoice-diarization.wav",
    "g4_en_sonnet1-excerpt_m4a.m4a",
    "g4_en_timit-sample_LDC93S1_44k-stereo.wav",
)
# int8 rounds every weight row to 1/254 of its range, so greedy decoding takes another word where the float16 model
# was unsure. Observed with CTranslate2 4.x's converter (float16 words -> int8 words, after normalize_english).
INT8_WORD_DIFFERENCES = {
    "g1_en_librispeech-test-clean_1995-1837-0001.wav": "the loss of the carton itself -> the loss of the cotton itself",
    "g1_en_librispeech-test-other_1688-142285-0001.flac": "having been a shopboy -> having been a shop boy",
    "g1_en_librivox_sense-and-sensibility-0890.wav": "is to be ill disposed -> is to be old sposed",
    "g1_en_whispered_mfa-whisper.flac": "this is all very whispered -> this is all very whisper",
    "g4_en_sonnet1-excerpt_m4a.m4a": "we desire increase -> we desire and crease",
    "g4_en_timit-sample_LDC93S1_44k-stereo.wav": "she had your duck suit -> she had your dog suit",
}
# Computing in int8 (dtype auto on a CPU for an int8 checkpoint) also quantizes the encoder's activations, a
# scale per row as CTranslate2 does: one more near-tie flips (the 44.1 kHz copy of this clip says "in" in float16).
INT8_COMPUTE_WORD_DIFFERENCES = {
    **INT8_WORD_DIFFERENCES,
    "g1_en_timit-sample_LDC93S1.wav": "dog suit and greasy -> dog suit in greasy",
    # on an AVX2 CPU without AVX-512 (oneDNN's int8 products there differ in rounding from its VNNI kernels)
    "g1_en_spontaneous_mfa-acoustic-corpus.wav": "nothing going else going on -> nothing going on going on",
}
MAX_INT8_WORD_EDITS = 2  # per allow-listed clip: a word or two, never a different transcript
# Computing in int8 costs about ten times float32's time on a CPU without AVX-512 VNNI (oneDNN's slower int8
# kernels), so that test takes three of the clips: the two whose words int8 computation itself flips, and a
# compressed codec whose words the int8 weights alone flip. The loader's tests keep every clip (and
# test_cpu_int8.py checks int8 computation's words against float32's on read and spontaneous speech).
INT8_COMPUTE_CLIPS = (
    "g1_en_timit-sample_LDC93S1.wav",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
    "g4_en_sonnet1-excerpt_m4a.m4a",
)


@pytest.fixture(scope="module")
def audios(load_clip):
    return {name: load_clip(name) for name in CLIPS}


@pytest.fixture(scope="module")
def package(tiny_transcripts):
    """Transcripts from the packaged CTranslate2 float16 weights: the reference for the other formats."""
    return tiny_transcripts(CLIPS)


@pytest.fixture(scope="module")
def hf_export_dir(tiny_engine, tmp_path_factory):
    """The packaged tiny.en written out as a Hugging Face directory (model.safetensors, configs, tokenizer)."""
    from engine.model.weights import load_checkpoint

    return write_hf_export(load_checkpoint("tiny.en"), tmp_path_factory.mktemp("hf") / "tiny.en")


@pytest.fixture(scope="module")
def int8_dir(hf_export_dir, tmp_path_factory):
    """That export quantized by CTranslate2's own converter, as a user would make an int8 model."""
    converters = pytest.importorskip("ctranslate2.converters")
    out = tmp_path_factory.mktemp("ct2-int8") / "tiny.en-int8"
    return converters.TransformersConverter(str(hf_export_dir)).convert(str(out), quantization="int8")


def transcripts_from(model_dir, audios, dtype="auto", int8_weights=False):
    from engine.config import EngineConfig
    from engine.runtime.engine import Engine

    engine = Engine(EngineConfig(model=str(model_dir), device="cpu", dtype=dtype))
    engine.start()
    try:
        assert engine.runner.int8_weights == int8_weights
        return submit_all(engine, audios)
    finally:
        engine.shutdown()


def unexpected_differences(package, other, allowed):
    """Clips whose words differ from the package's other than as `allowed` names; prints every difference."""
    unexpected, seen = {}, {}
    for name in other:
        want, got = normalize_english(package[name].text), normalize_english(other[name].text)
        if want == got:
            continue
        seen[name] = f"{want!r} -> {got!r}"
        edits = jiwer.process_words(want, got)
        num_edits = edits.substitutions + edits.deletions + edits.insertions
        if name not in allowed or num_edits > MAX_INT8_WORD_EDITS:
            unexpected[name] = seen[name]
    print(f"\nwords differ from float16 on {len(seen)}/{len(other)} clips:")
    for name, difference in seen.items():
        print(f"  {name}: {difference}")
    return unexpected


def test_all_clips_are_in_the_manifest(short_english_clips):
    assert set(CLIPS) <= {row["file"] for row in short_english_clips}
    assert set(INT8_COMPUTE_WORD_DIFFERENCES) <= set(CLIPS) and set(INT8_COMPUTE_CLIPS) <= set(CLIPS)


def test_safetensors_export_gives_identical_tokens(package, hf_export_dir, audios):
    from engine.model.weights import resolve_model

    assert resolve_model(str(hf_export_dir)).source_format == "hf"
    export = transcripts_from(hf_export_dir, audios)
    different = [name for name in CLIPS if tokens_of(export[name]) != tokens_of(package[name])]
    assert not different, {name: (package[name].text, export[name].text) for name in different}


def test_int8_gives_the_same_words(package, int8_dir, audios):
    """The int8 file dequantized (dtype float32): the loader's part."""
    from engine.model.weights import resolve_model

    assert resolve_model(str(int8_dir)).source_format == "ct2"
    int8 = transcripts_from(int8_dir, audios, dtype="float32")
    assert not unexpected_differences(package, int8, INT8_WORD_DIFFERENCES)


def test_int8_checkpoint_computes_in_int8_by_default(package, int8_dir, audios):
    """dtype auto on a CPU: an int8 checkpoint's products run on its int8 weights, with the same words."""
    int8 = transcripts_from(int8_dir, {name: audios[name] for name in INT8_COMPUTE_CLIPS}, int8_weights=True)
    assert not unexpected_differences(package, int8, INT8_COMPUTE_WORD_DIFFERENCES)

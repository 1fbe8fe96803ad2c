"""Engine tests on real weights and real audio: faster-whisper references and transcripts, computed once."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.engine_runs import (
    WAIT_S,
    TranscriptCache,
    faster_whisper_model,
    faster_whisper_transcribe,
    submit_all,
)


@pytest.fixture(scope="session")
def tiny_en_dir(tiny_engine):  # the engine fixture skips when the weights are missing
    """The packaged tiny.en CTranslate2 directory (whole model.bin)."""
    from engine.model.weights import resolve_model

    return resolve_model("tiny.en").config_dir


@pytest.fixture(scope="session")
def base_ct2_dir(base_engine, tmp_path_factory):  # likewise
    """base as one CTranslate2 directory: faster-whisper needs a whole model.bin, the package splits it in two."""
    from engine.model.weights import resolve_model

    resolved = resolve_model("base")
    out = tmp_path_factory.mktemp("base-ct2")
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copy(resolved.config_dir / name, out / name)
    with open(out / "model.bin", "wb") as whole:
        for part in resolved.weight_files:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, whole)
    return out


# base costs ~2 s a clip in faster-whisper on 2 cores (it runs the encoder twice: language, then text), so its
# greedy transcripts are compared on one clip of each language the clips hold plus these English ones; tiny.en covers
# the English clips, test_language_detection.py every multilingual clip's language.
BASE_ENGLISH = (
    "g1_en_jfk.flac",
    "g1_en_librispeech-test-other_1688-142285-0000.flac",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
    "g1_en_3speakers_picovoice-diarization.wav",
    "g1_en_whispered_mfa-whisper.flac",
    "g4_en_timit-sample_LDC93S1_8k.wav",
)


@pytest.fixture(scope="session")
def base_parity_clips(short_clips) -> list[str]:
    """The one-window clips whose greedy base transcripts are compared with faster-whisper's: the first of each
    other language (manifest order) and BASE_ENGLISH."""
    first: dict[str, str] = {}
    for row in short_clips:
        if row["language"] != "en":
            first.setdefault(row["language"], row["file"])
    assert set(BASE_ENGLISH) <= {row["file"] for row in short_clips}
    return [*first.values(), *BASE_ENGLISH]


@pytest.fixture(scope="session")
def tiny_fw(tiny_en_dir):
    return faster_whisper_model(tiny_en_dir)


@pytest.fixture(scope="session")
def base_fw(base_ct2_dir):
    return faster_whisper_model(base_ct2_dir)


@pytest.fixture(scope="session")
def tiny_transcripts(tiny_engine, load_clip):
    """The engine's greedy tiny.en transcripts (GREEDY options), shared by every test that needs them."""
    return TranscriptCache(lambda names: submit_all(tiny_engine, {name: load_clip(name) for name in names}))


@pytest.fixture(scope="session")
def tiny_references(tiny_fw, load_clip):
    """faster-whisper's greedy tiny.en transcripts, likewise shared."""
    return TranscriptCache(lambda names: {name: faster_whisper_transcribe(tiny_fw, load_clip(name)) for name in names})


@pytest.fixture(scope="session")
def base_transcripts(base_engine, load_clip):
    """The engine's greedy base transcripts (GREEDY options, the language detected), likewise shared."""
    return TranscriptCache(lambda names: submit_all(base_engine, {name: load_clip(name) for name in names}))


@pytest.fixture(scope="session")
def base_references(base_fw, load_clip):
    """faster-whisper's greedy base transcripts (the language detected), likewise shared."""
    return TranscriptCache(lambda names: {name: faster_whisper_transcribe(base_fw, load_clip(name)) for name in names})


@pytest.fixture(scope="session")
def tiny_alone(tiny_engine, load_clip):
    """(clip, DecodeOptions) -> tiny.en's result for that clip decoded alone, one step per launch: the reference
    that the engines decoding another way (several steps a launch, a stepwise prompt, overlapped steps) must equal.
    Decoded the first time a test asks and then kept, as several tests ask for the same one (the clip decoded to the
    decoder's context limit, 446 tokens, by three of them)."""
    results = {}

    def alone(name: str, options):
        if (name, options) not in results:
            results[name, options] = tiny_engine.submit(load_clip(name), options).wait(timeout=WAIT_S)
        return results[name, options]

    return alone

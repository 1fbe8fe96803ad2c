"""Engine tests on real weights and real audio: faster-whisper references and transcripts, computed once."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.engine_runs import TranscriptCache, faster_whisper_model, faster_whisper_transcribe, submit_all


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

"""Engine tests on real weights and real audio: faster-whisper references and transcripts, computed once."""

from __future__ import annotations

import os
import shutil

import pytest
from engine_utils import faster_whisper_transcribe, submit_all


def faster_whisper_model(model_dir):
    """faster-whisper at float32, the precision our CPU engine runs at."""
    fw = pytest.importorskip("faster_whisper")
    # Its default of 4 threads oversubscribes a 2-core CI runner.
    num_threads = min(4, os.cpu_count() or 1)
    return fw.WhisperModel(str(model_dir), device="cpu", compute_type="float32", cpu_threads=num_threads)


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


class TranscriptCache:
    """name -> transcript, computed on first request for the names still missing (in one batch) and then kept."""

    def __init__(self, compute):
        self._compute = compute  # list of clip names -> {name: transcript}
        self._done: dict = {}

    def __call__(self, names) -> dict:
        if missing := [name for name in names if name not in self._done]:
            self._done.update(self._compute(missing))
        return {name: self._done[name] for name in names}


@pytest.fixture(scope="session")
def tiny_transcripts(tiny_engine, load_clip):
    """The engine's greedy tiny.en transcripts (GREEDY options), shared by every test that needs them."""
    return TranscriptCache(lambda names: submit_all(tiny_engine, {name: load_clip(name) for name in names}))


@pytest.fixture(scope="session")
def tiny_references(tiny_fw, load_clip):
    """faster-whisper's greedy tiny.en transcripts, likewise shared."""
    return TranscriptCache(lambda names: {name: faster_whisper_transcribe(tiny_fw, load_clip(name)) for name in names})

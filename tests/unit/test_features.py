"""Log-mel features: parity with faster-whisper's FeatureExtractor, batching, padding, CUDA."""

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, decode_audio
from engine.features import LogMelSpectrogram, batch_features, mel_filters, pad_or_trim

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
CLIPS = [
    "g3_zh_za-ziji-de-jiao.flac",  # 0.96 s
    "g4_en_timit-sample_LDC93S1_8k.wav",  # 2.9 s, quiet (-41 dBFS)
    "g1_en_jfk.flac",  # 11 s
    "g4_en_sonnet1-excerpt_mp3.mp3",  # 9 s, 44.1 kHz stereo source
    "g4_en_harvard-sentences_OSR_us_000_0034_8k.wav",  # 35.5 s: longer than one window
]
# faster-whisper computes in float32 with numpy's FFT; only FFT round-off differs
MAX_FEATURE_DIFF = 1e-4


def load(name: str) -> np.ndarray:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"{name} is not in the shared data directory")
    return decode_audio(path)


@pytest.fixture(scope="module")
def feature_extractor():
    return pytest.importorskip("faster_whisper.feature_extractor").FeatureExtractor


def synthetic_audio(num_samples: int, seed: int = 0) -> torch.Tensor:
    """A chirp with noise and a silent gap: wide spectrum and a wide dynamic range."""
    generator = torch.Generator().manual_seed(seed)
    t = torch.arange(num_samples, dtype=torch.float64) / SAMPLE_RATE
    audio = 0.3 * torch.sin(2 * torch.pi * (100 + 2000 * t) * t)
    audio += 0.01 * torch.randn(num_samples, generator=generator, dtype=torch.float64)
    audio[num_samples // 3 : num_samples // 2] = 0.0
    return audio.float()


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_faster_whisper(n_mels: int, feature_extractor):
    expected = feature_extractor.get_mel_filters(SAMPLE_RATE, 400, n_mels).astype(np.float32)
    filters = mel_filters(n_mels)
    assert filters.shape == (n_mels, 201) and filters.dtype == torch.float32
    np.testing.assert_allclose(filters.numpy(), expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("name", CLIPS)
def test_log_mel_matches_faster_whisper(name: str, n_mels: int, feature_extractor):
    audio = load(name)
    expected = feature_extractor(feature_size=n_mels)(audio, padding=HOP_LENGTH)
    mel = LogMelSpectrogram(n_mels)(torch.from_numpy(audio))
    assert mel.dtype == torch.float32
    assert mel.shape == expected.shape == (n_mels, (audio.size + HOP_LENGTH) // HOP_LENGTH)
    assert np.abs(mel.numpy() - expected).max() <= MAX_FEATURE_DIFF


@pytest.mark.parametrize("n_mels", [80, 128])
def test_batched_equals_per_item(n_mels: int):
    num_samples = 5 * SAMPLE_RATE
    clips = [synthetic_audio(num_samples, seed) * scale for seed, scale in [(0, 1.0), (1, 0.01), (2, 0.5)]]
    log_mel = LogMelSpectrogram(n_mels)
    batched = log_mel(torch.stack(clips))
    assert batched.shape == (3, n_mels, num_samples // HOP_LENGTH + 1)
    for i, audio in enumerate(clips):
        # the 80 dB floor is per clip, so the quiet clip must not be floored by the loud one
        torch.testing.assert_close(batched[i], log_mel(audio), rtol=0, atol=1e-6)


def test_batch_features_pads_each_clip():
    log_mel = LogMelSpectrogram(80)
    clips = [synthetic_audio(SAMPLE_RATE), synthetic_audio(40 * SAMPLE_RATE, 1), synthetic_audio(7 * SAMPLE_RATE, 2)]
    batch = batch_features(clips, log_mel)
    assert batch.shape == (3, 80, N_FRAMES) and batch.dtype == torch.float32
    for i, audio in enumerate(clips):
        torch.testing.assert_close(batch[i], pad_or_trim(log_mel(audio)), rtol=0, atol=0)
    # a 1 s clip has 101 frames; the rest is log-mel zero padding, not padded audio
    assert batch[0, :, 101:].abs().max() == 0
    assert batch[0, :, :101].abs().max() > 0


def test_pad_or_trim():
    mel = torch.randn(80, 1234)
    padded = pad_or_trim(mel)
    assert padded.shape == (80, N_FRAMES)
    assert torch.equal(padded[:, :1234], mel) and padded[:, 1234:].abs().max() == 0
    long = torch.randn(2, 128, 3500)
    assert torch.equal(pad_or_trim(long), long[..., :N_FRAMES])
    exact = torch.randn(80, N_FRAMES)
    assert torch.equal(pad_or_trim(exact), exact)
    assert pad_or_trim(mel, length=100).shape == (80, 100)


@pytest.mark.parametrize("num_samples", [1, 40, 41, 159, 160, 400])
def test_very_short_audio(num_samples: int):
    mel = LogMelSpectrogram(80)(torch.full((num_samples,), 0.1))
    assert mel.shape == (80, (num_samples + HOP_LENGTH) // HOP_LENGTH)
    assert torch.isfinite(mel).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n_mels", [80, 128])
def test_cuda_matches_cpu(n_mels: int):
    # cuFFT rounds differently from the CPU FFT; on an H200, 32 clips of 30 s differed by up to 1.2e-4
    max_diff = 5e-4
    clips = [synthetic_audio(SAMPLE_RATE * 30, seed) * (0.01 if seed % 2 else 1.0) for seed in range(4)]
    mel_cpu = LogMelSpectrogram(n_mels, "cpu")(torch.stack(clips))
    log_mel = LogMelSpectrogram(n_mels, "cuda")
    mel_gpu = log_mel(torch.stack(clips).cuda())
    assert mel_gpu.device.type == "cuda" and mel_gpu.dtype == torch.float32
    assert (mel_gpu.cpu() - mel_cpu).abs().max() <= max_diff
    for i, audio in enumerate(clips):
        torch.testing.assert_close(mel_gpu[i], log_mel(audio.cuda()), rtol=0, atol=1e-6)
    batch = batch_features([clips[0][: SAMPLE_RATE * 3], clips[1]], log_mel)
    assert batch.device.type == "cuda" and batch.shape == (2, n_mels, N_FRAMES)

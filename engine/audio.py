"""Audio constants and decoding of any FFmpeg-readable input to 16 kHz mono float32."""

from __future__ import annotations

import io
import os
from typing import BinaryIO

import numpy as np

try:
    import av
except ImportError:  # the engine can run without PyAV (e.g. fed arrays on a GPU box); decoding cannot
    av = None
try:
    import soundfile
except (ImportError, OSError):  # OSError: the wheel's libsndfile could not be loaded
    soundfile = None

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in one 30-second window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in one window
N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the encoder's second conv has stride 2
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100: 10 ms per mel frame
TOKENS_PER_SECOND = SAMPLE_RATE // N_SAMPLES_PER_TOKEN  # 50: 20 ms per encoder output

# Decoded samples are buffered and resampled in chunks this long (at the source rate):
# one resampler call per codec frame is about twice as slow on mp3.
RESAMPLE_CHUNK = 500_000
# A corrupt header can claim any rate; outside this range resampling takes minutes or
# turns a small file into gigabytes of samples.
MIN_SOURCE_RATE, MAX_SOURCE_RATE = 1_000, 768_000

SUPPORTED_FORMATS = "wav, flac, mp3, ogg, opus, m4a, mp4, aac, aiff or webm"

AudioSource = bytes | bytearray | memoryview | str | os.PathLike | BinaryIO

# What PyAV raises on malformed input: FFmpegError (InvalidDataError, EOFError, ...) from
# FFmpeg itself, the rest from PyAV's Python layer (frame checks, empty stream tables).
_DECODE_ERRORS = (OSError, EOFError, ValueError, IndexError, KeyError, RuntimeError) + (
    (av.FFmpegError,) if av is not None else ()
)


class AudioDecodeError(ValueError):
    """The input is not audio we can decode; the message is meant for the end user."""


def decode_audio(source: AudioSource, max_duration_s: float | None = None) -> np.ndarray:
    """Decode a file, its bytes or a binary file object to mono float32 at SAMPLE_RATE."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise AudioDecodeError("The audio file is empty (0 bytes).")
        source = io.BytesIO(source)
    elif isinstance(source, os.PathLike):
        source = os.fspath(source)

    pcm = _read_native_pcm16(source, max_duration_s)
    if pcm is None:
        if av is None:
            raise RuntimeError("decoding this audio needs PyAV: pip install av")
        pcm = _decode_with_pyav(source, max_duration_s)
    if pcm.size == 0:
        raise AudioDecodeError("The audio file contains no audio samples (it may be truncated).")
    # int16 -> float32 / 32768 as faster-whisper does, so both decode to identical samples
    return pcm.astype(np.float32) / 32768.0


def _decode_with_pyav(source: str | BinaryIO, max_duration_s: float | None) -> np.ndarray:
    try:
        return _decode_pcm16(source, max_duration_s)
    except AudioDecodeError:
        raise
    except _DECODE_ERRORS as e:
        reason = e.strerror if isinstance(e, av.FFmpegError) and e.strerror else "unreadable data"
        raise AudioDecodeError(
            f"Could not decode the audio file ({reason}). "
            f"Send a complete, valid audio file such as {SUPPORTED_FORMATS}."
        ) from e


def duration_s(audio: np.ndarray) -> float:
    """Length in seconds of audio sampled at SAMPLE_RATE (last axis is time)."""
    return audio.shape[-1] / SAMPLE_RATE


def _read_native_pcm16(source: str | BinaryIO, max_duration_s: float | None) -> np.ndarray | None:
    """16-bit mono 16 kHz WAV/FLAC, the form most clients send, read in one libsndfile call; else None.

    PyAV hands a WAV to Python in packets of 1,024 samples, so a 30 s upload costs ~470 round trips through
    the interpreter (13 ms, holding the GIL the server's event loop needs); libsndfile reads it in one call
    (and cffi releases the GIL). The samples are the ones PyAV would give: no format conversion happens here;
    anything that would need one (another rate, channel count or sample format) goes to PyAV's resampler.
    """
    if soundfile is None:
        return None
    start = source.tell() if not isinstance(source, str) else 0
    try:
        with soundfile.SoundFile(source) as f:
            if (f.samplerate, f.channels, f.subtype, f.format) in _NATIVE_FORMATS:
                if max_duration_s is not None and f.frames > max_duration_s * SAMPLE_RATE:
                    raise AudioDecodeError(f"The audio is longer than the limit of {max_duration_s:g} seconds.")
                return f.read(dtype="int16")
    except AudioDecodeError:
        raise
    except (RuntimeError, ValueError, TypeError, OSError):  # not a file libsndfile reads as is: PyAV decides
        pass
    if not isinstance(source, str):
        source.seek(start)  # PyAV reads the same file object from where it started
    return None


_NATIVE_FORMATS = {(SAMPLE_RATE, 1, "PCM_16", "WAV"), (SAMPLE_RATE, 1, "PCM_16", "FLAC")}


def _decode_pcm16(source: str | BinaryIO, max_duration_s: float | None) -> np.ndarray:
    """Decode the first audio stream to int16 mono samples at SAMPLE_RATE."""
    max_samples = None if max_duration_s is None else int(max_duration_s * SAMPLE_RATE)
    sink = _Pcm16Sink(max_samples)
    with av.open(source, mode="r", metadata_errors="ignore") as container:
        if not container.streams.audio:
            raise AudioDecodeError(
                f"The file contains no audio stream. Send an audio file such as {SUPPORTED_FORMATS}."
            )
        stream = container.streams.audio[0]
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.InvalidDataError:
                continue  # skip a corrupt packet and keep the rest, as the ffmpeg CLI does
            for frame in frames:
                sink.write(frame)
        sink.flush()
    return np.concatenate(sink.chunks) if sink.chunks else np.zeros(0, dtype=np.int16)


class _Pcm16Sink:
    """Buffers decoded frames and resamples them to int16 mono at SAMPLE_RATE."""

    def __init__(self, max_samples: int | None) -> None:
        self.max_samples = max_samples
        self.num_samples = 0
        self.chunks: list[np.ndarray] = []
        self.params: tuple[str, str, int] | None = None
        self.fifo = av.AudioFifo()
        self.resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)

    def write(self, frame: av.AudioFrame) -> None:
        params = (frame.format.name, frame.layout.name, frame.sample_rate)
        if params != self.params:
            if not MIN_SOURCE_RATE <= frame.sample_rate <= MAX_SOURCE_RATE:
                raise AudioDecodeError(
                    f"The audio has an unsupported sample rate ({frame.sample_rate} Hz); "
                    "the file header is probably corrupt."
                )
            # AudioFifo does not check the channel layout, so a mid-stream change would
            # misread memory; start a new fifo and resampler for the new parameters.
            if self.params is not None:
                self.flush()
                self.fifo = av.AudioFifo()
                self.resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            self.params = params
        frame.pts = None  # the fifo rejects timestamp gaps; only the samples matter here
        self.fifo.write(frame)
        if self.fifo.samples >= RESAMPLE_CHUNK:
            self._resample(self.fifo.read())

    def flush(self) -> None:
        if self.fifo.samples:
            self._resample(self.fifo.read())
        self._resample(None)  # None drains the resampler's delay line

    def _resample(self, frame: av.AudioFrame | None) -> None:
        for out in self.resampler.resample(frame):
            self.chunks.append(out.to_ndarray().reshape(-1))
            self.num_samples += out.samples
        if self.max_samples is not None and self.num_samples > self.max_samples:
            raise AudioDecodeError(
                f"The audio is longer than the limit of {self.max_samples / SAMPLE_RATE:g} seconds."
            )

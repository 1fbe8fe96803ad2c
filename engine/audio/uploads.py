"""Decoding of uploaded audio to 16 kHz mono float32 (or two channels).

Uploads are hostile: FFmpeg reads nothing but the uploaded bytes (no demuxer that follows
references to other files, URLs or devices, no protocol at all), and decoding stops once the
audio passes the caller's duration limit, so memory is bounded by the limit, not the upload.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

import numpy as np

from engine.audio.constants import SAMPLE_RATE

try:
    import av
except ImportError:  # the engine can run without PyAV (e.g. fed arrays on a GPU box); decoding cannot
    av = None
try:
    import soundfile
except (ImportError, OSError):  # OSError: the wheel's libsndfile could not be loaded
    soundfile = None

# Tags that are not UTF-8 (an upload's metadata is anyone's) must not fail the open: PyAV before 19 decodes them
# strictly unless told to ignore errors; 19 dropped the option and no longer raises on them.
_OPEN_OPTIONS = {"metadata_errors": "ignore"} if av is not None and int(av.__version__.split(".")[0]) < 19 else {}

# Decoded samples are buffered and resampled in chunks this long (at the source rate):
# one resampler call per codec frame is about twice as slow on mp3.
RESAMPLE_CHUNK = 500_000
# A corrupt header can claim any rate; outside this range resampling takes minutes or
# turns a small file into gigabytes of samples.
MIN_SOURCE_RATE, MAX_SOURCE_RATE = 1_000, 768_000
# 7.1 is the largest layout speech comes in. Every channel is decoded before the downmix, so a
# stream of 255 silent channels (Vorbis and Opus allow that many) would cost 255 times the
# decoding work and buffer memory of mono for the same duration limit.
MAX_CHANNELS = 8
# libsndfile reads a native WAV/FLAC in blocks this long (65 s: one call for a typical upload),
# so each block can be freed as soon as it is converted to float32.
NATIVE_READ_FRAMES = 1 << 20

SUPPORTED_FORMATS = "wav, flac, mp3, ogg, opus, m4a, mp4, aac, aiff or webm"

# The demuxers an upload may be read with: OpenAI's formats (flac, mp3/mpga, mp4/m4a, mpeg,
# ogg, wav, webm) plus aac and aiff, each reading only its own bytes. FFmpeg still probes the
# bytes with every demuxer it has, so an SDP file (binds UDP ports and waits for RTP), an HLS
# playlist or an ffconcat list (fetch URLs, read local files) is recognised as such, and the
# open then fails ("format not on whitelist") before that demuxer reads anything.
# Each comma-separated alias of a demuxer's name matches: "mov" is "mov,mp4,m4a,3gp,3g2,mj2",
# "matroska" is "matroska,webm"; "mpeg" is the MPEG program stream.
ALLOWED_DEMUXERS = ("wav", "flac", "mp3", "ogg", "mov", "matroska", "aac", "aiff", "mpeg")
_CONTAINER_OPTIONS = {
    "format_whitelist": ",".join(ALLOWED_DEMUXERS),
    # PyAV reads the file object itself, so FFmpeg needs no protocol; an empty whitelist makes
    # any nested open an allowed demuxer might attempt (mov data references, say) fail.
    "protocol_whitelist": "",
}
# Demuxers whose duration is not in a header: FFmpeg estimates it from the first frames'
# bitrate (MP3 without a Xing/VBRI header, ADTS AAC) or from timestamps (MPEG-PS), and a
# legitimate VBR file can claim several times its length. Only decoded samples count for these.
_ESTIMATED_DURATION_DEMUXERS = {"mp3", "aac", "mpeg"}

AudioSource = bytes | bytearray | memoryview | str | os.PathLike | BinaryIO

# What PyAV raises on malformed input: FFmpegError (InvalidDataError, EOFError, ...) from
# FFmpeg itself, the rest from PyAV's Python layer (frame checks, empty stream tables).
_DECODE_ERRORS = (OSError, EOFError, ValueError, IndexError, KeyError, RuntimeError) + (
    (av.FFmpegError,) if av is not None else ()
)


class AudioDecodeError(ValueError):
    """The input is not audio we can decode; the message is meant for the end user."""


class AudioTooLongError(AudioDecodeError):
    """The audio lasts longer than the caller's limit: claimed by its header, or found while decoding."""

    def __init__(self, limit_s: float, claimed_s: float | None = None) -> None:
        self.limit_s = limit_s
        self.claimed_s = claimed_s
        claim = "" if claimed_s is None else f" (the file says it lasts {round(claimed_s, 1):g} seconds)"
        super().__init__(f"The audio is longer than the limit of {limit_s:g} seconds{claim}.")


def decode_audio(source: AudioSource, max_duration_s: float | None = None) -> np.ndarray:
    """Decode a file, its bytes or a binary file object to mono float32 at SAMPLE_RATE.

    Audio longer than max_duration_s raises AudioTooLongError: before decoding when the header
    says so, else as soon as the decoded samples pass the limit.
    """
    return _from_source(source, _decode_file, max_duration_s)


def decode_channels(source: AudioSource, max_duration_s: float | None = None) -> np.ndarray:
    """decode_audio's samples kept as two channels, (2, samples) float32 at SAMPLE_RATE: a stereo file's left and
    right (calls often put each party on its own side), a mono file's one channel twice, more channels mixed down
    to two by FFmpeg's resampler."""
    return _from_source(source, _decode_two, max_duration_s)


def _from_source(source: AudioSource, decode, max_duration_s: float | None) -> np.ndarray:
    """`decode(file, max_duration_s)` on a path (opened here), bytes or a binary file object."""
    if isinstance(source, (str, os.PathLike)):
        with _open_local_file(source) as file:
            return decode(file, max_duration_s)
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise AudioDecodeError("The audio file is empty (0 bytes).")
        source = io.BytesIO(source)
    return decode(source, max_duration_s)


def _decode_two(file: BinaryIO, max_duration_s: float | None) -> np.ndarray:
    if av is None:
        raise RuntimeError("decoding this audio needs PyAV: pip install av")
    interleaved = _pcm16_to_float32(_decode_with_pyav(file, _DurationLimit(max_duration_s), layout="stereo"))
    return np.ascontiguousarray(interleaved.reshape(-1, 2).T)


def duration_s(audio: np.ndarray) -> float:
    """Length in seconds of audio sampled at SAMPLE_RATE (last axis is time)."""
    return audio.shape[-1] / SAMPLE_RATE


def _open_local_file(path: str | os.PathLike) -> BinaryIO:
    # Opened here rather than by FFmpeg or libsndfile, which then only read this file object.
    try:
        return open(path, "rb")
    except OSError as e:  # the message names no path: it may reach an end user
        raise AudioDecodeError(f"Could not read the audio file ({e.strerror or 'unreadable'}).") from e


def _decode_file(file: BinaryIO, max_duration_s: float | None) -> np.ndarray:
    limit = _DurationLimit(max_duration_s)
    chunks = _read_native_pcm16(file, limit)
    if chunks is None:
        if av is None:
            raise RuntimeError("decoding this audio needs PyAV: pip install av")
        chunks = _decode_with_pyav(file, limit)
    return _pcm16_to_float32(chunks)


def _pcm16_to_float32(chunks: list[np.ndarray]) -> np.ndarray:
    """Concatenates int16 chunks as float32 / 32768 (faster-whisper's samples), freeing each chunk once copied.

    The peak is the int16 chunks plus the float32 result, with no int16 concatenation or float32
    temporaries; where the allocator returns freed chunks to the system (libsndfile's 2 MB blocks
    are mapped on their own), the result's pages fill as the chunks go, about the result alone.
    """
    total = sum(chunk.size for chunk in chunks)
    if total == 0:
        raise AudioDecodeError("The audio file contains no audio samples (it may be truncated).")
    audio = np.empty(total, dtype=np.float32)
    start = 0
    chunks.reverse()  # pop() from the end releases the chunks in order
    while chunks:
        chunk = chunks.pop()
        np.divide(chunk, np.float32(32768.0), out=audio[start : start + chunk.size], dtype=np.float32)
        start += chunk.size
    return audio


class _DurationLimit:
    """Counts decoded samples against max_duration_s (None: no limit) and raises AudioTooLongError past it."""

    def __init__(self, max_duration_s: float | None) -> None:
        self.max_s = max_duration_s
        self._finished_s = 0.0  # seconds decoded at earlier sample rates
        self._rate = 0
        self._samples = 0  # samples decoded at the current rate: an exact count, no float drift

    def check_claim(self, claimed_s: float | None) -> None:
        if self.max_s is not None and claimed_s is not None and claimed_s > self.max_s:
            raise AudioTooLongError(self.max_s, claimed_s)

    def add(self, num_samples: int, rate: int) -> None:
        if rate != self._rate:
            self._finished_s += self._samples / self._rate if self._rate else 0.0
            self._rate, self._samples = rate, 0
        self._samples += num_samples
        if self.max_s is not None and self._finished_s + self._samples / rate > self.max_s:
            raise AudioTooLongError(self.max_s)


def _read_native_pcm16(file: BinaryIO, limit: _DurationLimit) -> list[np.ndarray] | None:
    """16-bit mono 16 kHz WAV/FLAC, the form most clients send, read by libsndfile in int16 blocks; else None.

    PyAV hands a WAV to Python in packets of 1,024 samples, so a 30 s upload costs ~470 round trips through
    the interpreter (13 ms, holding the GIL the server's event loop needs); libsndfile reads it in one call
    (and cffi releases the GIL). The samples are the ones PyAV would give: no format conversion happens here;
    anything that would need one (another rate, channel count or sample format) goes to PyAV's resampler.
    """
    if soundfile is None:
        return None
    start = file.tell()
    try:
        with soundfile.SoundFile(file) as f:
            # SF_COUNT_MAX: a FLAC whose STREAMINFO leaves the length unknown (0), as streaming
            # encoders write; libsndfile fails at the end of such a stream, PyAV does not.
            if (f.samplerate, f.channels, f.subtype, f.format) in _NATIVE_FORMATS and f.frames != _SF_UNKNOWN_FRAMES:
                limit.check_claim(f.frames / SAMPLE_RATE)
                return _read_int16_blocks(f)
    except AudioDecodeError:
        raise
    except (RuntimeError, ValueError, TypeError, OSError):  # not a file libsndfile reads as is: PyAV decides
        pass
    file.seek(start)  # PyAV reads the same file object from where it started
    return None


_NATIVE_FORMATS = {(SAMPLE_RATE, 1, "PCM_16", "WAV"), (SAMPLE_RATE, 1, "PCM_16", "FLAC")}
_SF_UNKNOWN_FRAMES = 2**63 - 1


def _read_int16_blocks(f: soundfile.SoundFile) -> list[np.ndarray]:
    # libsndfile returns at most f.frames (the header's count), which the caller checked
    # against the limit; a header claiming less than the file holds truncates, never grows.
    chunks = []
    while True:
        block = f.read(NATIVE_READ_FRAMES, dtype="int16")
        if block.size:
            chunks.append(block)
        if block.size < NATIVE_READ_FRAMES:
            return chunks


def _decode_with_pyav(file: BinaryIO, limit: _DurationLimit, layout: str = "mono") -> list[np.ndarray]:
    try:
        with _open_container(file) as container:
            stream = _first_audio_stream(container)
            limit.check_claim(_claimed_duration_s(container, stream))
            return _decode_pcm16(container, stream, limit, layout)
    except AudioDecodeError:
        raise
    except _DECODE_ERRORS as e:
        reason = e.strerror if isinstance(e, av.FFmpegError) and e.strerror else "unreadable data"
        raise AudioDecodeError(
            f"Could not decode the audio file ({reason}). "
            f"Send a complete, valid audio file such as {SUPPORTED_FORMATS}."
        ) from e


def _open_container(file: BinaryIO) -> av.container.InputContainer:
    try:
        return av.open(file, mode="r", container_options=_CONTAINER_OPTIONS, **_OPEN_OPTIONS)
    except av.ArgumentError as e:  # EINVAL from the open: chiefly a format off the whitelist
        raise AudioDecodeError(
            f"The file is not in a supported audio format. Send an audio file such as {SUPPORTED_FORMATS}."
        ) from e


def _first_audio_stream(container: av.container.InputContainer) -> av.audio.stream.AudioStream:
    if not container.streams.audio:
        raise AudioDecodeError(f"The file contains no audio stream. Send an audio file such as {SUPPORTED_FORMATS}.")
    stream = container.streams.audio[0]
    # FFmpeg's default (0) lets a codec start a thread per core; decoding stays on the calling thread, so that it
    # never competes with the engine's threads for the cores
    if stream.codec_context is not None:  # None for a stream with no known codec: decoding reports it
        stream.codec_context.thread_count = 1
    return stream


def _claimed_duration_s(container: av.container.InputContainer, stream: av.audio.stream.AudioStream) -> float | None:
    """The audio's duration as its header states it, or None when there is no statement to trust."""
    if container.format.name in _ESTIMATED_DURATION_DEMUXERS:
        return None
    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:  # e.g. matroska states only the segment's duration
        return container.duration / av.time_base
    return None


def _decode_pcm16(
    container: av.container.InputContainer, stream: av.audio.stream.AudioStream, limit: _DurationLimit,
    layout: str = "mono",
) -> list[np.ndarray]:
    """Decode the stream to int16 chunks at SAMPLE_RATE, mono or (layout "stereo") interleaved left and right."""
    sink = _Pcm16Sink(limit, layout)
    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.InvalidDataError:
            continue  # skip a corrupt packet and keep the rest, as the ffmpeg CLI does
        for frame in frames:
            sink.write(frame)
    sink.flush()
    return sink.chunks


class _Pcm16Sink:
    """Buffers decoded frames and resamples them to int16 at SAMPLE_RATE, mono (or `layout`)."""

    def __init__(self, limit: _DurationLimit, layout: str = "mono") -> None:
        self.limit = limit
        self.layout = layout
        self.chunks: list[np.ndarray] = []
        self.params: tuple[str, str, int] | None = None
        self.fifo = av.AudioFifo()
        self.resampler = av.AudioResampler(format="s16", layout=layout, rate=SAMPLE_RATE)

    def write(self, frame: av.AudioFrame) -> None:
        params = (frame.format.name, frame.layout.name, frame.sample_rate)
        if params != self.params:
            _check_frame_shape(frame)
            # AudioFifo does not check the channel layout, so a mid-stream change would
            # misread memory; start a new fifo and resampler for the new parameters.
            if self.params is not None:
                self.flush()
                self.fifo = av.AudioFifo()
                self.resampler = av.AudioResampler(format="s16", layout=self.layout, rate=SAMPLE_RATE)
            self.params = params
        self.limit.add(frame.samples, frame.sample_rate)
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


def _check_frame_shape(frame: av.AudioFrame) -> None:
    if not MIN_SOURCE_RATE <= frame.sample_rate <= MAX_SOURCE_RATE:
        raise AudioDecodeError(
            f"The audio has an unsupported sample rate ({frame.sample_rate} Hz); the file header is probably corrupt."
        )
    if not 1 <= frame.layout.nb_channels <= MAX_CHANNELS:
        raise AudioDecodeError(
            f"The audio has {frame.layout.nb_channels} channels; at most {MAX_CHANNELS} are supported."
        )

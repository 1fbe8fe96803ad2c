"""A realtime session's input audio: base64 chunks in the session's format -> 16 kHz float32 for the engine.

OpenAI's formats are 24 kHz 16-bit little-endian mono PCM (`audio/pcm`) and G.711 at 8 kHz (`audio/pcmu`,
`audio/pcma`). FFmpeg's decoders and resampler (PyAV) do the work, fed chunk by chunk: the resampler keeps its
filter state between chunks, so a stream appended in pieces becomes the samples the whole stream would.

A large append (OpenAI allows 15 MiB of base64) is decoded a piece at a time: each b64decode call holds the GIL
for its whole input, FFmpeg's work does not, so in a worker thread the pieces leave the event loop its turns.
"""

from __future__ import annotations

import base64
import binascii

import av
import numpy as np

from engine import SAMPLE_RATE

# (FFmpeg decoder, sample rate, bytes per sample) of each format OpenAI defines
FORMATS = {
    "audio/pcm": ("pcm_s16le", 24000, 2),
    "audio/pcmu": ("pcm_mulaw", 8000, 1),
    "audio/pcma": ("pcm_alaw", 8000, 1),
}


BASE64_PIECE = 2**20  # characters per b64decode call (a multiple of 4: each piece decodes on its own)


class AudioFormatError(ValueError):
    pass


def base64_pieces(data: str) -> list[bytes]:
    """Strict base64 (RFC 4648 alphabet, padding checked), decoded BASE64_PIECE characters at a time: garbage is
    an error, not silently skipped bytes, and the pieces joined are what the whole string decodes to."""
    pieces = []
    try:
        for start in range(0, max(len(data), 1), BASE64_PIECE):
            piece = data[start : start + BASE64_PIECE]
            if piece.endswith("=") and start + BASE64_PIECE < len(data):
                raise ValueError("padding before the end")  # each piece alone would accept it
            pieces.append(base64.b64decode(piece, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise AudioFormatError(f"audio is not valid base64: {exc}") from exc
    return pieces


def decode_base64(data: str) -> bytes:
    return b"".join(base64_pieces(data))


def base64_size(data: str) -> int:
    """How many bytes `data` decodes to, if it is valid base64: read from its length, nothing decoded."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def samples_of(frames: list[av.AudioFrame]) -> np.ndarray:
    """The resampler's mono float frames as one array of 16 kHz samples."""
    if not frames:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32, copy=False)


class InputAudio:
    """One stream of input audio: append() returns the 16 kHz samples its bytes complete, flush() the rest at the
    end of a turn (the resampler then starts afresh)."""

    def __init__(self, format_type: str):
        if format_type not in FORMATS:
            raise AudioFormatError(f"unsupported audio format {format_type!r}; supported: {sorted(FORMATS)}")
        self.codec, self.rate, self.sample_bytes = FORMATS[format_type]
        self._pending = b""  # a PCM16 chunk may end inside a sample
        self._open()

    def _open(self) -> None:
        self._decoder = av.CodecContext.create(self.codec, "r")
        self._decoder.sample_rate = self.rate
        self._decoder.layout = "mono"
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)

    def seconds(self, num_bytes: int) -> float:
        return num_bytes / (self.sample_bytes * self.rate)

    def append_base64(self, data: str) -> np.ndarray:
        """append() of base64 audio, a piece at a time; all of it is checked before the stream's state changes."""
        pieces = base64_pieces(data)
        return np.concatenate([self.append(piece) for piece in pieces])

    def append(self, data: bytes) -> np.ndarray:
        data = self._pending + data
        whole = len(data) - len(data) % self.sample_bytes
        self._pending = data[whole:]
        if whole == 0:
            return np.zeros(0, dtype=np.float32)
        frames = self._decoder.decode(av.Packet(data[:whole]))
        return samples_of([f for frame in frames for f in self._resampler.resample(frame)])

    def flush(self) -> np.ndarray:
        """The samples the resampler still holds; the stream starts over (a new turn)."""
        out = samples_of(self._resampler.resample(None))
        self._pending = b""
        self._open()
        return out


class TrackAudio:
    """A WebRTC call's media track (webrtc.py): its decoded frames (48 kHz Opus, stereo or mono) -> 16 kHz float32
    mono, the resampler's filter state carried from one chunk of frames to the next."""

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)

    def resample(self, frames: list[av.AudioFrame]) -> np.ndarray:
        return samples_of([out for frame in frames for out in self._resampler.resample(frame)])


def resample_tracks(work: list[tuple[TrackAudio, list[av.AudioFrame]]]) -> list[np.ndarray | Exception]:
    """Several calls' chunks of track frames, each through its own resampler (a pass of load.SharedLoad.tracks, in a
    worker thread): each one's samples, or what it raised."""
    outcomes: list[np.ndarray | Exception] = []
    for track, frames in work:
        try:
            outcomes.append(track.resample(frames))
        except Exception as exc:  # noqa: BLE001 - that call's own error
            outcomes.append(exc)
    return outcomes


def decode_appends(work: list[tuple[InputAudio, list[str]]]) -> list[list[np.ndarray | Exception]]:
    """Several sessions' small appends, each session's in order into its own stream (a pass of
    load.SharedLoad.appends, in a worker thread): each append's samples, or what it raised (bad base64), that
    append's own error; the stream goes on with the next."""
    outcomes: list[list[np.ndarray | Exception]] = []
    for audio, appends in work:
        session: list[np.ndarray | Exception] = []
        for data in appends:
            try:
                session.append(audio.append_base64(data))
            except Exception as exc:  # noqa: BLE001 - reported for that append, not the others'
                session.append(exc)
        outcomes.append(session)
    return outcomes

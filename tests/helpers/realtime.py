"""What a realtime client does to audio (tests/e2e/test_realtime.py, benchmarks/realtime_sessions.py): a clip as
24 kHz 16-bit PCM through FFmpeg's resampler, cut into a microphone's 100 ms base64 chunks, and the same PCM as
a WAV file for the HTTP route."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import av
import numpy as np
import soundfile as sf

CHUNK_MS = 100  # a microphone's buffer


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """float32 mono through FFmpeg's resampler (PyAV)."""
    frame = av.AudioFrame.from_ndarray(audio.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = rate_in
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate_out)
    frames = [*resampler.resample(frame), *resampler.resample(None)]
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames])


def pcm_at(path: Path, rate: int) -> np.ndarray:
    """A clip as 16-bit samples at `rate`."""
    audio, clip_rate = sf.read(str(path), dtype="float32", always_2d=True)
    return (np.clip(resample(audio.mean(axis=1), clip_rate, rate), -1, 1) * 32767).round().astype("<i2")


def pcm24k(path: Path) -> bytes:
    """A clip as OpenAI's `audio/pcm`: 24 kHz 16-bit little-endian mono."""
    return pcm_at(path, 24000).tobytes()


def wav_bytes(pcm: bytes, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.frombuffer(pcm, dtype="<i2"), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def chunks(data: bytes, bytes_per_ms: int) -> list[str]:
    """The stream as `input_audio_buffer.append` payloads of CHUNK_MS each."""
    step = CHUNK_MS * bytes_per_ms
    return [base64.b64encode(data[i : i + step]).decode() for i in range(0, len(data), step)]


def one_turn(client, pcm: bytes, model: str) -> str:
    """A realtime transcription session on `model` (the openai SDK), 24 kHz PCM appended and committed by hand: the
    turn's completed transcript. Asserts that the session took the model."""
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session={"type": "transcription", "audio": {"input": {
            "turn_detection": None, "transcription": {"model": model}}}})  # fmt: skip
        assert conn.recv().session.audio.input.transcription.model == model
        for piece in chunks(pcm, 48):
            conn.input_audio_buffer.append(audio=piece)
        conn.input_audio_buffer.commit()
        completed = next(ev for ev in conn if ev.type == "conversation.item.input_audio_transcription.completed")
    return completed.transcript


def stream_rounds(clips: list[np.ndarray], seed: int):
    """Live streams' pieces, round by round: each round one piece of each clip, of 0-3,000 samples (some complete
    no VAD frame), until every clip is used up."""
    rng = np.random.default_rng(seed)
    positions = [0] * len(clips)
    while any(p < len(c) for p, c in zip(positions, clips)):
        pieces = []
        for i, clip in enumerate(clips):
            size = int(rng.integers(0, 3000))
            pieces.append(clip[positions[i] : positions[i] + size])
            positions[i] += size
        yield pieces

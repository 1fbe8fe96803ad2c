"""End of turn: whether a speaker has finished what they were saying, from how it sounds (realtime semantic_vad).

Silero hears when speech stops, not whether the speaker is done: a pause before "order a pizza" is as silent as
the one after it. smart-turn v3.2 (pipecat's, BSD-2-Clause) tells them apart from the intonation and rhythm of
the speech before the pause: a small Whisper-style encoder with a classifier head, run with onnxruntime, that
gives the probability that the turn is complete. Its weights (`data/smart-turn-v3.2-cpu.onnx`, 8.7 MB, with
their licence in `data/LICENSE-smart-turn`) are the file pipecat-ai's wheel ships at
`pipecat/audio/turn/smart_turn/data/` (sha256 2bb02632...7e4f); they live here because pipecat-ai is a
voice-agent framework whose requirements would come with them (README, Dependencies).

Its input is what transformers' `WhisperFeatureExtractor(chunk_length=8)` makes of the last 8 s of the turn, as
smart-turn was trained and as pipecat runs it: zeros before a shorter turn, the waveform normalised to zero mean
and unit variance, then Whisper's 80-bin log-mel over 800 frames. That log-mel is the engine's own
(LogMelSpectrogram without end padding); tests/unit/test_turn_end.py checks the features against transformers'.

A call takes the turns of several sessions at once (one onnxruntime run over the batch), on one thread: the
engine's decode keeps the cores, and one 8 s window takes about 50 ms of one core.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from engine.audio.constants import SAMPLE_RATE
from engine.audio.features import LogMelSpectrogram

WEIGHTS = Path(__file__).resolve().parent / "data" / "smart-turn-v3.2-cpu.onnx"
WINDOW_SAMPLES = 8 * SAMPLE_RATE  # the last 8 s of a turn
N_MELS = 80
NORM_EPS = 1e-7  # WhisperFeatureExtractor's zero-mean unit-variance normalisation


def window(audio: np.ndarray) -> np.ndarray:
    """The last 8 s of 16 kHz `audio`, zeros before it if it is shorter, normalised to zero mean and unit
    variance (the padding counts, as in WhisperFeatureExtractor)."""
    audio = np.asarray(audio, dtype=np.float32)[-WINDOW_SAMPLES:]
    padded = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
    padded[WINDOW_SAMPLES - len(audio) :] = audio
    return (padded - padded.mean()) / np.sqrt(padded.var() + NORM_EPS)


class EndOfTurnModel:
    """smart-turn v3.2 on the CPU; its weights load once, on first use."""

    def __init__(self) -> None:
        self._session = None
        self._log_mel = LogMelSpectrogram(N_MELS)
        self._lock = threading.Lock()

    @property
    def session(self):
        with self._lock:
            if self._session is None:
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                self._session = ort.InferenceSession(
                    str(WEIGHTS), sess_options=options, providers=["CPUExecutionProvider"]
                )
        return self._session

    @torch.inference_mode()
    def features(self, audios: list[np.ndarray]) -> np.ndarray:
        """The model's input for each turn's 16 kHz audio: shape (len(audios), 80, 800), float32."""
        windows = torch.from_numpy(np.stack([window(audio) for audio in audios]))
        return self._log_mel(windows, padding=0).numpy()  # each clip's own 80 dB floor

    def probabilities(self, audios: list[np.ndarray]) -> list[float]:
        """The probability that each turn is complete, from its 16 kHz audio up to the pause in question."""
        if not audios:
            return []
        (probs,) = self.session.run(None, {"input_features": self.features(audios)})  # (batch, 1), a sigmoid's
        return [float(p) for p in probs[:, 0]]

"""Whisper's audio constants: the sample rate, the log-mel's frames and the encoder's positions per 30 s window."""

from __future__ import annotations

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in one 30-second window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in one window
N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the encoder's second conv has stride 2
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100: 10 ms per mel frame
TOKENS_PER_SECOND = SAMPLE_RATE // N_SAMPLES_PER_TOKEN  # 50: 20 ms per encoder output

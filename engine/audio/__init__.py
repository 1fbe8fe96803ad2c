"""Audio in: from an upload's bytes to the log-mel windows the encoder reads.

- `constants.py`: Whisper's sample rate, window length, mel frames and encoder positions per second
- `uploads.py`: hostile-upload-safe decoding to 16 kHz mono float32 (or two channels, `decode_channels`)
- `features.py`: the log-mel spectrogram, whole or piece by piece (`LogMelBuilder`), and `pad_or_trim`
- `feature_worker.py`: on a GPU, new requests' log-mels computed on a thread beside the engine loop

May import engine.request and engine.messages; nothing of the loop, the model or the backends.
"""

"""Log-mel spectrogram in torch (CPU or CUDA, batched), numerically matching faster-whisper's."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from engine.audio import HOP_LENGTH, N_FFT, N_FRAMES, SAMPLE_RATE


def mel_filters(n_mels: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Slaney-style mel filterbank, as librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels).

    Returns filters : Tensor, shape = (n_mels, N_FFT // 2 + 1), float32
    """
    # Slaney's scale is linear below 1 kHz (200/3 Hz per mel) and logarithmic above.
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0

    def hz_to_mel(hz: float) -> float:
        return hz / f_sp if hz < min_log_hz else min_log_mel + math.log(hz / min_log_hz) / logstep

    # float64 until the end, like librosa, so the float32 result rounds the same way
    mels = torch.linspace(0.0, hz_to_mel(SAMPLE_RATE / 2), n_mels + 2, dtype=torch.float64)
    hz = torch.where(
        mels >= min_log_mel, min_log_hz * torch.exp(logstep * (mels - min_log_mel)), f_sp * mels
    )
    fft_hz = torch.arange(N_FFT // 2 + 1, dtype=torch.float64) * (SAMPLE_RATE / N_FFT)

    # triangles rising from hz[i] to hz[i+1] and falling to hz[i+2]
    ramps = hz[:, None] - fft_hz[None, :]
    widths = hz.diff()
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    # normalize each band by its width so every band has about the same energy
    weights *= (2.0 / (hz[2:] - hz[:-2]))[:, None]
    return weights.to(device=device, dtype=torch.float32)


class LogMelSpectrogram:
    """Whisper's log-mel front end with its filterbank and window kept on one device."""

    def __init__(self, n_mels: int, device: torch.device | str = "cpu"):
        self.n_mels = n_mels
        self.device = torch.device(device)
        self.filters = mel_filters(n_mels, self.device)
        window = torch.hann_window(N_FFT, periodic=True, dtype=torch.float64)
        self.window = window.to(self.device, torch.float32)

    def __call__(self, audio: torch.Tensor | np.ndarray, padding: int = HOP_LENGTH) -> torch.Tensor:
        """Log-mel of 16 kHz audio, shape (samples,) or (batch, samples).

        Returns mel : Tensor, shape = (n_mels, frames) or (batch, n_mels, frames),
        frames = (samples + padding) // HOP_LENGTH
        """
        audio = torch.as_tensor(audio).to(self.device, torch.float32)
        # stft's reflect padding needs more than N_FFT // 2 samples; only clips shorter
        # than 2.5 ms get these extra zeros
        padding = max(padding, N_FFT // 2 + 1 - audio.shape[-1])
        if padding > 0:
            audio = F.pad(audio, (0, padding))
        stft = torch.stft(
            audio, N_FFT, HOP_LENGTH, window=self.window, center=True, pad_mode="reflect",
            return_complex=True,
        )
        # the last frame is centred past the end of the audio; Whisper drops it
        magnitudes = stft[..., :-1].abs() ** 2

        log_spec = torch.clamp(self.filters @ magnitudes, min=1e-10).log10()
        # dynamic range of 80 dB below each clip's own peak
        peak = log_spec.amax(dim=(-2, -1), keepdim=True)
        log_spec = torch.maximum(log_spec, peak - 8.0)
        return (log_spec + 4.0) / 4.0


def pad_or_trim(mel: torch.Tensor, length: int = N_FRAMES) -> torch.Tensor:
    """Zero-pad or trim the last (frames) axis of a log-mel to `length`."""
    num_frames = mel.shape[-1]
    if num_frames > length:
        return mel[..., :length]
    if num_frames < length:
        return F.pad(mel, (0, length - num_frames))
    return mel


def batch_features(
    audios: list[torch.Tensor | np.ndarray], log_mel: LogMelSpectrogram, length: int = N_FRAMES
) -> torch.Tensor:
    """Features of clips of different lengths, each computed alone then padded or trimmed.

    Returns mel : Tensor, shape = (len(audios), n_mels, length)
    """
    # clips are not padded to a common length first: that would change the reflect padding
    # at each clip's end and the peak that its 80 dB floor is measured from
    return torch.stack([pad_or_trim(log_mel(audio), length) for audio in audios])

"""Log-mel spectrogram in torch (CPU or CUDA, batched), numerically matching faster-whisper's."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from engine.audio.constants import HOP_LENGTH, N_FFT, N_FRAMES, SAMPLE_RATE


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
        padding = _end_padding(audio.shape[-1], padding)
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

    def chunked(
        self, audio: torch.Tensor | np.ndarray, piece_frames: int = N_FRAMES, padding: int = HOP_LENGTH
    ) -> torch.Tensor:
        """The same log-mel as `self(audio)` for 1-D audio, computed `piece_frames` frames at a time,
        so that besides the result only one piece's intermediates are held.

        Returns mel : Tensor, shape = (n_mels, (samples + padding) // HOP_LENGTH)
        """
        builder = LogMelBuilder(self, audio, piece_frames, padding)
        while not builder.step():
            pass
        return builder.result()


def _end_padding(num_samples: int, padding: int) -> int:
    """Zeros appended to the audio before the STFT's own reflect padding."""
    # stft's reflect padding needs more than N_FFT // 2 samples; only clips shorter
    # than 2.5 ms get these extra zeros
    return max(padding, N_FFT // 2 + 1 - num_samples)


# Matrix-product libraries pick kernels by shape. On the CPU (MKL), filters @ magnitudes rounds
# differently when it is under 12 frames wide; from 12 frames on, each frame's column came out the
# same at every width and offset tried, up to the 720,001 frames of 2 hours (in MKL's AVX-512, AVX2
# and AVX code paths; its SSE2 one, MKL_CBWR=COMPATIBLE, is not so regular). So a narrower piece is
# widened with its neighbours' frames to this many, and audio with fewer frames is one product.
# cuBLAS (H200) has no such threshold: some widths, under ~620 frames and a few scattered above,
# take other kernels, so on CUDA pieces and whole differ by a float32 rounding step here and there.
MIN_PRODUCT_FRAMES = 32


class LogMelBuilder:
    """`log_mel(audio)` of 1-D audio built a piece of frames at a time, for audio of any length.

    The result is allocated once; each `step()` computes the next piece's frames into it, and
    `result()` applies the 80 dB floor, whose peak spans the whole audio, and the scaling in place.
    Each piece's STFT takes its frames' samples from the same padded signal as the whole-audio STFT
    (reflect padding at both ends included), so every frame is computed from the same samples; on
    the CPU the result is bitwise equal to `log_mel(audio)`, on CUDA within 1e-6 (see
    MIN_PRODUCT_FRAMES).
    Besides the result, a step holds only one piece's intermediates (a few kB per frame).
    Nothing here waits on the device: the peak stays a device tensor until `result()`.

    The audio is moved to `log_mel.device` as float32 once, at construction, and released when done.
    num_frames : frames of the result, (samples + padding) // HOP_LENGTH
    num_pieces, pieces_done : progress, in steps of at most `piece_frames` frames
    """

    def __init__(
        self,
        log_mel: LogMelSpectrogram,
        audio: torch.Tensor | np.ndarray,
        piece_frames: int = N_FRAMES,
        padding: int = HOP_LENGTH,
    ):
        audio = torch.as_tensor(audio).to(log_mel.device, torch.float32)
        if audio.dim() != 1:
            raise ValueError(f"audio must have shape (samples,), not {tuple(audio.shape)}")
        if piece_frames < 1:
            raise ValueError(f"piece_frames must be at least 1, not {piece_frames}")
        self.log_mel = log_mel
        self.piece_frames = piece_frames
        self._audio = audio
        # the whole-audio STFT's input: the audio, then zeros up to `_length` samples, then
        # reflect padding of N_FFT // 2 samples at both ends
        self._length = audio.shape[0] + _end_padding(audio.shape[0], padding)
        self._num_audio = min(audio.shape[0], self._length)
        self.num_frames = self._length // HOP_LENGTH
        self.num_pieces = -(-self.num_frames // piece_frames)
        self.pieces_done = 0
        self._mel = torch.empty(log_mel.n_mels, self.num_frames, device=log_mel.device)
        self._peak = torch.full((), -math.inf, device=log_mel.device)
        self._result: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self.pieces_done == self.num_pieces

    def step(self) -> bool:
        """Compute the next piece: at most `piece_frames` frames of the log-mel (before its floor).

        Returns done : bool, True once every piece is computed (then further calls do nothing)
        """
        if self.done:
            return True
        start = self.pieces_done * self.piece_frames
        stop = min(start + self.piece_frames, self.num_frames)
        # frames [first, first + width) go through the filterbank product, a superset of [start, stop)
        width = max(stop - start, min(self.num_frames, MIN_PRODUCT_FRAMES))
        first = min(start, self.num_frames - width)

        # frame t of the whole-audio STFT covers padded samples [t * HOP_LENGTH, t * HOP_LENGTH + N_FFT)
        samples = self._padded_samples(first * HOP_LENGTH, (first + width - 1) * HOP_LENGTH + N_FFT)
        stft = torch.stft(
            samples, N_FFT, HOP_LENGTH, window=self.log_mel.window, center=False, return_complex=True
        )
        # the same operations as the whole-audio computation, on the same (frames-major) layout
        magnitudes = stft.abs() ** 2
        mel_spec = (self.log_mel.filters @ magnitudes).clamp_(min=1e-10)
        piece = self._mel[:, start:stop]
        torch.log10(mel_spec[:, start - first : stop - first], out=piece)
        torch.maximum(self._peak, piece.amax(), out=self._peak)

        self.pieces_done += 1
        if self.done:
            self._audio = None
        return self.done

    def result(self) -> torch.Tensor:
        """The log-mel, equal to `log_mel(audio)` (as said above); every piece must have been computed.

        Returns mel : Tensor, shape = (n_mels, num_frames), float32, on `log_mel.device`
        """
        if not self.done:
            raise RuntimeError(f"{self.pieces_done} of {self.num_pieces} pieces computed")
        if self._result is None:
            mel = self._mel
            torch.maximum(mel, self._peak - 8.0, out=mel)
            mel.add_(4.0).div_(4.0)
            self._result = mel
        return self._result

    def _padded_samples(self, start: int, stop: int) -> torch.Tensor:
        """Samples [start, stop) of the whole-audio STFT's padded input.

        Returns samples : Tensor, shape = (stop - start,)
        """
        half = N_FFT // 2
        begin, end = start - half, stop - half  # positions in the audio
        if begin >= 0 and end <= self._num_audio:
            return self._audio[begin:end]
        # near either end: map positions through the reflections, then to audio or appended zeros
        positions = torch.arange(begin, end, device=self._audio.device).abs_()
        last = self._length - 1
        positions = torch.where(positions > last, 2 * last - positions, positions)
        if self._num_audio == 0:
            return torch.zeros(stop - start, device=self._audio.device)
        values = self._audio.take(positions.clamp(max=self._num_audio - 1))
        return torch.where(positions < self._num_audio, values, 0.0)


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

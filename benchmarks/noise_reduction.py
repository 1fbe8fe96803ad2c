"""Does denoising the input help Whisper? The Realtime API's `noise_reduction` (near_field / far_field) measured
before it is offered: WER and voice-activity errors on real speech mixed with noise, with and without a denoiser.

    pip install noisereduce pyrnnoise   # the candidates; not dependencies of the server
    python benchmarks/noise_reduction.py --model tiny.en [--snr 0 5 10 20]

The LibriSpeech clips of tests/data (with their reference texts) are mixed with two noises at each SNR: pink
noise (stationary: a fan, a room's hum, a car) and babble (four other readers from tests/data at once: a cafe, an
office), each seeded. Each mix is then transcribed as served (the engine in this process, greedy with the
temperature fallback) as it is and after each denoiser:
- noisereduce's spectral gating, stationary (a noise profile estimated over the whole clip) and non-stationary
  (a profile that follows the noise over time): DSP, numpy and scipy only;
- RNNoise (pyrnnoise: Xiph's recurrent denoiser, its model compiled into the wheel): the neural near-field
  denoiser that WebRTC stacks ship, at 48 kHz (the wheel resamples).
Printed per noise and SNR: WER against the references (normalized as tests/helpers/transcripts.py does), and VAD
errors: the share of Silero's 32 ms frames whose speech decision (probability >= 0.5) differs from its decision on
the clean clip (what server VAD would get wrong: turns cut or merged).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.audio.constants import SAMPLE_RATE
from engine.audio.uploads import decode_audio
from engine.config import EngineConfig
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from engine.transcription.vad import VoiceActivityDetector
from tests.helpers.transcripts import normalize_english

DATA = ROOT / "tests" / "data"
CLIPS = sorted(p for p in DATA.glob("g1_en_librispeech-*") if p.suffix in (".wav", ".flac"))
BABBLE = [DATA / f"g1_en_librivox_sense-and-sensibility-0{i}.wav" for i in (870, 880, 890, 920)]


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """1/f noise: white noise shaped in the frequency domain."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    return np.fft.irfft(spectrum, n).astype(np.float32)


def babble(n: int, readers: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Four readers at once, each from a random offset, looped to length n, at equal loudness."""
    out = np.zeros(n, dtype=np.float32)
    for audio in readers:
        start = int(rng.integers(len(audio)))
        piece = np.resize(np.roll(audio, -start), n)
        out += piece / (np.sqrt(np.mean(piece**2)) + 1e-9)
    return out


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    gain = np.sqrt(np.mean(speech**2) / (np.mean(noise**2) * 10 ** (snr_db / 10)))
    mixed = speech + gain * noise
    return (mixed / max(1.0, float(np.abs(mixed).max()))).astype(np.float32)  # no clipping


def denoisers() -> dict:
    import noisereduce
    from pyrnnoise import RNNoise

    def rnnoise(audio: np.ndarray) -> np.ndarray:
        pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
        frames = [frame for _, frame in RNNoise(SAMPLE_RATE).denoise_chunk(pcm[None, :], partial=True)]
        out = np.concatenate(frames, axis=-1).reshape(-1).astype(np.float32) / 32767
        return np.pad(out, (0, max(0, len(audio) - len(out))))[: len(audio)]

    return {
        "none": lambda a: a,
        "noisereduce stationary": lambda a: noisereduce.reduce_noise(y=a, sr=SAMPLE_RATE, stationary=True),
        "noisereduce non-stationary": lambda a: noisereduce.reduce_noise(y=a, sr=SAMPLE_RATE, stationary=False),
        "RNNoise": rnnoise,
    }


def wer(references: list[str], hypotheses: list[str]) -> float:
    import jiwer

    return jiwer.wer([normalize_english(r) for r in references], [normalize_english(h) for h in hypotheses])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--snr", nargs="+", type=float, default=[0, 5, 10, 20])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    speech = [decode_audio(p.read_bytes()) for p in CLIPS]
    references = [p.with_suffix(".txt").read_text().strip() for p in CLIPS]
    readers = [decode_audio(p.read_bytes()) for p in BABBLE]
    vad = VoiceActivityDetector()
    clean_speech = [np.array(vad.speech_probs(a)) >= 0.5 for a in speech]
    systems = denoisers()
    engine = Engine(EngineConfig(model=args.model, device="cpu"))
    engine.start()
    options = DecodeOptions()
    try:
        clean = [engine.submit(a, options).wait(timeout=600).text for a in speech]
        print(f"{args.model}, {len(CLIPS)} LibriSpeech clips ({sum(map(len, speech)) / SAMPLE_RATE:.0f} s); clean WER "
              f"{wer(references, clean):.3f}")  # fmt: skip
        names = list(systems)
        print("| noise | SNR dB | " + " | ".join(f"WER: {n}" for n in names) + " | "
              + " | ".join(f"VAD errors: {n}" for n in names) + " |")  # fmt: skip
        print("|---|---|" + "---|" * (2 * len(names)))
        spent = dict.fromkeys(names, 0.0)
        for kind in ("pink", "babble"):
            for snr in args.snr:
                noises = [pink_noise(len(a), rng) if kind == "pink" else babble(len(a), readers, rng) for a in speech]
                mixes = [mix(a, n, snr) for a, n in zip(speech, noises, strict=True)]
                wers, vad_errors = [], []
                for name in names:
                    start = time.perf_counter()
                    cleaned = [systems[name](m).astype(np.float32) for m in mixes]
                    spent[name] += time.perf_counter() - start
                    texts = [engine.submit(a, options).wait(timeout=600).text for a in cleaned]
                    wers.append(wer(references, texts))
                    wrong = []
                    for audio, reference in zip(cleaned, clean_speech, strict=True):
                        heard = np.array(vad.speech_probs(audio)) >= 0.5
                        n = min(len(heard), len(reference))
                        wrong.append(np.mean(heard[:n] != reference[:n]))
                    vad_errors.append(float(np.mean(wrong)))
                print(f"| {kind} | {snr:g} | " + " | ".join(f"{w:.3f}" for w in wers) + " | "
                      + " | ".join(f"{e:.1%}" for e in vad_errors) + " |", flush=True)  # fmt: skip
        audio_s = sum(map(len, speech)) / SAMPLE_RATE * 2 * len(args.snr)
        print("denoiser time per second of audio: "
              + ", ".join(f"{n} {spent[n] / audio_s * 1000:.1f} ms" for n in names if n != "none"))  # fmt: skip
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()

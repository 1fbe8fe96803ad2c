"""Two CPU costs outside the model's arithmetic: decoding a 30 s WAV upload, and page faults of an encoder pass.

    python benchmarks/cpu_components.py [--model tiny.en] [--passes 20]
    python benchmarks/cpu_components.py --default-heap   # the same, with glibc's default heap settings
    python benchmarks/cpu_components.py --step-phases    # instead: where one request's time goes in the engine loop

Decoding: the same 30 s 16 kHz mono 16-bit WAV through libsndfile (the fast path) and through PyAV, ms per call
and whether the samples are equal. Encoder: ms per pass, minor page faults and kernel time per pass
(getrusage). The engine applies `keep_freed_memory()` on a CPU; --default-heap skips it: compare two runs
(separate processes, since the setting is process-wide). --step-phases transcribes the 26.7 s spontaneous clip
greedily without timestamps (as benchmarks/cpu_peers.py does) and prints the engine loop's phases per request.
"""

from __future__ import annotations

import argparse
import io
import resource
import sys
import time
import wave
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_phases import print_engine_phases  # noqa: E402

from engine.audio import uploads as engine_audio  # noqa: E402
from engine.config import EngineConfig  # noqa: E402

CLIP = Path(__file__).resolve().parents[1] / "tests" / "data" / "g1_en_spontaneous_mfa-acoustic-corpus.wav"


def wav_bytes(seconds: float) -> bytes:
    samples = (np.random.default_rng(0).standard_normal(int(seconds * 16000)) * 3000).astype(np.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def ms_per_call(fn, calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--default-heap", action="store_true")
    ap.add_argument("--step-phases", action="store_true")
    ap.add_argument("--clip", type=Path, default=CLIP)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.step_phases:
        step_phases(args)
        return

    data = wav_bytes(30.0)
    fast = ms_per_call(lambda: engine_audio.decode_audio(data), 20)
    samples = engine_audio.decode_audio(data)
    sndfile, engine_audio.soundfile = engine_audio.soundfile, None  # PyAV only
    pyav = ms_per_call(lambda: engine_audio.decode_audio(data), 20)
    same = np.array_equal(samples, engine_audio.decode_audio(data))
    engine_audio.soundfile = sndfile
    print(f"30 s WAV: libsndfile {fast:.2f} ms, PyAV {pyav:.2f} ms per decode; samples equal: {same}")

    from engine.runtime import model_runner

    if args.default_heap:
        model_runner.keep_freed_memory = lambda: False  # the runner applies it on a CPU; here it must not
    runner = model_runner.ModelRunner(EngineConfig(model=args.model, device="cpu", max_num_seqs=1))
    mel = torch.randn(runner.dims.n_mels, 3000)
    for _ in range(3):
        runner.encode_into_slots([mel], 0)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(args.passes):
        runner.encode_into_slots([mel], 0)
    wall = (time.perf_counter() - start) / args.passes * 1e3
    after = resource.getrusage(resource.RUSAGE_SELF)
    faults = (after.ru_minflt - before.ru_minflt) / args.passes
    kernel = (after.ru_stime - before.ru_stime) / args.passes * 1e3
    heap = "glibc defaults" if args.default_heap else "keep_freed_memory()"
    print(f"encoder pass ({args.model}, {heap}): {wall:.1f} ms, {faults:.0f} page faults, {kernel:.1f} ms kernel time")


def step_phases(args) -> None:
    from engine.request import DecodeOptions
    from engine.runtime.engine import Engine

    engine = Engine(EngineConfig(model=args.model, device="cpu", num_threads=args.threads))
    engine.start()
    audio = engine_audio.decode_audio(args.clip)
    options = DecodeOptions(without_timestamps=True, temperatures=(0.0,))

    def run() -> float:
        start = time.perf_counter()
        engine.transcribe(audio, options)
        return time.perf_counter() - start

    print_engine_phases(engine, run, f"{args.model} on {args.clip.name}, CPU, {args.threads} threads")
    engine.shutdown()


if __name__ == "__main__":
    main()

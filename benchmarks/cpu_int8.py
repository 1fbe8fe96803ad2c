"""CPU, int8 and float32: this engine against faster-whisper (CTranslate2), one request and 8 at once, quiet and
under a competing load.

    python benchmarks/cpu_int8.py [--model tiny.en] [--rounds 3] [--load 0 2]

Systems, each in a child process of its own, taking turns over --rounds (medians over rounds):
- ours float32 (a float checkpoint's default) and ours int8 (`--dtype int8`: the decoder's and the encoder's
  products read int8 weights, a scale per output; the encoder's activations a scale per row), with the OpenMP spin
  count the server sets (server/openmp.py); with --libgomp-default also ours int8 with libgomp's own, with
  --fixed-team also ours int8 with every decode step on the full thread team (kernels/cpu_team.py measures, per
  step kind, whether one thread is faster, and takes it); with --dot-forms also ours int8 with the decode products'
  int8 weights widened to floats (KernelOptions.cpu_int8_dot off) and, on a CPU with AVX-512 VNNI, with the integer
  dot products in their AVX2 form (the one a CPU without VNNI runs; the same tokens);
- faster-whisper `compute_type="float32"` and `"int8"` (what a CPU user picks), in the environment as given.
"one": the median time of each clip alone (greedy, no timestamps, load excluded). "8 at once": the 8 test clips
submitted together: ours as 8 requests to one engine (its continuous batching), faster-whisper as 8 threads
calling `transcribe` on a model with 2 workers of 1 thread (CTranslate2's way of serving concurrent calls),
against 8x the sum of one-request times.
--load N starts N busy processes (pure-Python loops) beside each measurement: a container that shares its cores
with other work. Prints one table per load and the ratios to faster-whisper int8.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_peers import CLIPS, DATA, ct2_model_dir, median_time

from server.openmp import set_spin_default

SYSTEMS = ("ours-float32", "ours-int8", "fw-float32", "fw-int8")
LIBGOMP_DEFAULT = "ours-int8-libgomp-default"
FIXED_TEAM = "ours-int8-fixed-team"
WIDENED = "ours-int8-widened"
AVX2_DOT = "ours-int8-avx2-dot"
BATCH_CLIPS = [
    "g1_en_jfk.flac", "g1_en_librispeech-test-clean_1221-135766-0001.wav", "g1_en_spontaneous_mfa-acoustic-corpus.wav",
    "g1_en_librispeech-test-other_1688-142285-0000.flac", "g1_en_librispeech-dev-clean_1272-128104-0000.wav",
    "g1_en_librispeech-test-clean_1089-134686-0001.wav", "g1_en_librispeech-test-clean_61-70968-0000.flac",
    "g1_en_librispeech-dev-clean_2412-153948-0000.flac",
]  # fmt: skip


def busy() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[None]:
    """n busy processes (pure-Python loops) beside the block: a container that shares its cores with other work."""
    loads = [multiprocessing.Process(target=busy, daemon=True) for _ in range(n)]
    for p in loads:
        p.start()
    try:
        yield
    finally:
        for p in loads:
            p.kill()


def measure(system: str, args) -> dict:
    import torch

    from engine.audio.uploads import decode_audio
    from engine.model.weights import resolve_model

    torch.set_num_threads(args.threads)
    clips = {label: decode_audio(args.data / name) for label, name in CLIPS.items()}
    batch = [decode_audio(args.data / name) for name in BATCH_CLIPS]
    with tempfile.TemporaryDirectory() as tmp:
        if system.startswith("ours"):
            from engine import DecodeOptions, Engine, EngineConfig, KernelOptions
            from engine.kernels import cpu_kernels

            dtype = "float32" if system == "ours-float32" else "int8"
            kernels = KernelOptions(cpu_adaptive_team=system != FIXED_TEAM, cpu_int8_dot=system != WIDENED)
            if system == AVX2_DOT:
                cpu_kernels.load().dot_form = "avx2"  # the engine's backend takes this same (cached) object
            engine = Engine(EngineConfig(model=args.model, device="cpu", num_threads=args.threads, dtype=dtype,
                                         kernels=kernels))  # fmt: skip
            engine.start()
            options = DecodeOptions(without_timestamps=True, temperatures=(0.0,))

            def run(audio):
                return [t for s in engine.transcribe(audio, options).segments for t in s.tokens]

            def run_batch():
                handles = [engine.submit(a, options) for a in batch]
                return [h.wait() for h in handles]

        else:
            from faster_whisper import WhisperModel

            model_dir = str(ct2_model_dir(resolve_model(args.model), Path(tmp)))
            compute = system.removeprefix("fw-")
            one = WhisperModel(model_dir, device="cpu", compute_type=compute, cpu_threads=args.threads)
            many = WhisperModel(model_dir, device="cpu", compute_type=compute, cpu_threads=1, num_workers=args.threads)

            def transcribe(model, audio):
                segments, _ = model.transcribe(audio, beam_size=1, temperature=0, without_timestamps=True,
                                               vad_filter=False)  # fmt: skip
                return [t for s in segments for t in s.tokens]

            def run(audio):
                return transcribe(one, audio)

            def run_batch():
                with ThreadPoolExecutor(len(batch)) as pool:
                    return list(pool.map(lambda a: transcribe(many, a), batch))

        with busy_processes(args.load_now):
            tokens = {label: run(audio) for label, audio in clips.items()}
            times = {label: median_time(lambda a=audio: run(a), args.repeats) for label, audio in clips.items()}
            alone = sum(median_time(lambda a=audio: run(a), 1) for audio in batch)
            together = median_time(run_batch, 1)
    return {"times": times, "tokens": tokens, "alone": alone, "together": together}


def vnni_here() -> bool:
    """Whether this CPU runs the VNNI form of the integer dot products (asked in a child: this parent process loads
    neither torch nor the kernels, which would leave their thread pools beside the measurements)."""
    script = "from engine.kernels import cpu_kernels\nk = cpu_kernels.load()\nprint(bool(k and k.vnni))"
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout  # fmt: skip
    return out.strip().splitlines()[-1] == "True"


def environment(system: str) -> dict[str, str]:
    """ours as the server runs it (its OpenMP spin default); the peer and the libgomp A/B in the environment as given"""
    env = dict(os.environ)
    if system != LIBGOMP_DEFAULT and system.startswith("ours"):
        set_spin_default(env)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--load", type=int, nargs="+", default=[0, 2], help="busy processes beside the measurements")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--libgomp-default", action="store_true", help="also ours int8 with libgomp's own spin count")
    ap.add_argument("--fixed-team", action="store_true", help="also ours int8 with every step on the full team")
    ap.add_argument("--dot-forms", action="store_true", help="also ours int8 with its weights widened to floats, "
                    "and with the integer dot products' AVX2 form")  # fmt: skip
    only = (*SYSTEMS, LIBGOMP_DEFAULT, FIXED_TEAM, WIDENED, AVX2_DOT)
    ap.add_argument("--only", choices=only, help=argparse.SUPPRESS)
    ap.add_argument("--load-now", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only is not None:
        print(json.dumps(measure(args.only, args)))
        return
    systems = (*SYSTEMS, *[LIBGOMP_DEFAULT] * args.libgomp_default, *[FIXED_TEAM] * args.fixed_team)
    if args.dot_forms:
        systems += (WIDENED, *[AVX2_DOT] * vnni_here())
    for load in args.load:
        rounds: dict[str, list[dict]] = {s: [] for s in systems}
        for _ in range(args.rounds):
            for system in systems:
                cmd = [sys.executable, __file__, *sys.argv[1:], "--only", system, "--load-now", str(load)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=environment(system)).stdout
                rounds[system].append(json.loads(out.strip().splitlines()[-1]))
        med = {s: {k: statistics.median(r[k] for r in rounds[s]) for k in ("alone", "together")} for s in systems}
        times = {s: {c: statistics.median(r["times"][c] for r in rounds[s]) for c in CLIPS} for s in systems}
        print(
            f"\nmodel {args.model}, {args.threads} threads, {load} busy processes beside; medians of {args.rounds} rounds"
        )
        print("| system | " + " | ".join(f"{c} (s)" for c in CLIPS) + " | 8 clips alone, summed (s) | 8 at once (s) | "
              "8 at once vs alone | fw int8 / this (one) |")  # fmt: skip
        print("|---|" + "---|" * (len(CLIPS) + 4))
        for s in systems:
            one = " | ".join(f"{times[s][c]:.3f}" for c in CLIPS)
            speedup = med[s]["alone"] / med[s]["together"]
            ratio = " / ".join(f"{times['fw-int8'][c] / times[s][c]:.2f}" for c in CLIPS)
            print(f"| {s} | {one} | {med[s]['alone']:.2f} | {med[s]['together']:.2f} | {speedup:.2f}x | {ratio} |")
        same = {c: rounds["ours-int8"][0]["tokens"][c] == rounds["ours-float32"][0]["tokens"][c] for c in CLIPS}
        print(f"ours int8 tokens equal ours float32: {same}")
        for other in (s for s in systems if s.startswith("ours-int8-")):
            same = {c: rounds[other][0]["tokens"][c] == rounds["ours-int8"][0]["tokens"][c] for c in CLIPS}
            print(f"{other} tokens equal ours int8: {same}")


if __name__ == "__main__":
    main()

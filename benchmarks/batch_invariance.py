"""How much a request's tokens depend on what else the GPU decodes: the baseline for batch-invariant decoding.

    python benchmarks/batch_invariance.py --model <tiny.en dir> --data <16 kHz clips> --fillers 7 64 200
    python benchmarks/batch_invariance.py --step-model large-v3 --tokenizer <tok> --batches 2 8 64 256

With --model (a real model, real clips): each clip is decoded alone, then all clips at once between N filler
requests (the clips again, cycled); the table counts the clips whose tokens differ from their lone decode, greedy
with timestamps (the server's way) and without. With --step-model (dummy weights at that size): one decode step of a
probe row alone (a graph of batch 1: the lone-row kernels) against the same row, same slot, among N random rows
(the batched products): are the logits bitwise equal, is the argmax, and how far apart are they.
Peer: the lone decode, in the same run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import DecodeOptions, Engine, EngineConfig, KernelOptions  # noqa: E402


def read_clips(data: Path) -> dict[str, np.ndarray]:
    import soundfile as sf

    clips = {}
    for path in sorted(data.glob("*.wav")):
        audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
        if rate == 16000:
            clips[path.name] = np.ascontiguousarray(audio.mean(axis=1))
    return clips


def tokens(result) -> list[int]:
    return [t for s in result.segments for t in s.tokens]


def transcripts(args) -> None:
    clips = read_clips(Path(args.data))
    engine = Engine(EngineConfig(model=args.model, device="cuda", dtype=args.dtype, max_num_seqs=512, max_waiting=4096,
                                 kernels=KernelOptions(batch_invariant=args.batch_invariant)))
    engine.start()
    names = list(clips)
    mode = "batch-invariant kernels" if args.batch_invariant else "default kernels"
    print(f"{args.model}, {args.dtype}, {mode}, {len(names)} clips; differing = tokens unlike the clip's lone decode")
    print("| timestamps | fillers (besides the clips) | clips differing | tokens differing (of all) |")
    print("|---|---|---|---|")
    for timestamps in (True, False):
        options = DecodeOptions(temperatures=(0.0,), without_timestamps=not timestamps)
        alone = {name: tokens(engine.submit(audio, options).wait(timeout=300)) for name, audio in clips.items()}
        for n in args.fillers:
            # every clip at once, between two halves of n fillers (the clips, cycled): each lands among others
            others = [clips[names[j % len(names)]] for j in range(n)]
            fillers = [engine.submit(audio, options) for audio in others[: n // 2]]
            probes = {name: engine.submit(audio, options) for name, audio in clips.items()}
            fillers += [engine.submit(audio, options) for audio in others[n // 2 :]]
            got = {name: tokens(h.wait(timeout=600)) for name, h in probes.items()}
            for h in fillers:
                h.wait(timeout=600)
            differ = sum(got[name] != alone[name] for name in names)
            bad = sum(sum(a != b for a, b in zip(got[k], alone[k])) + abs(len(got[k]) - len(alone[k])) for k in names)
            total = sum(len(alone[k]) for k in names)
            mode = "yes" if timestamps else "no"
            print(f"| {mode} | {n} | {differ} of {len(names)} | {bad} of {total} |", flush=True)
    engine.shutdown()


def steps(args) -> None:
    engine = Engine(EngineConfig(model=args.step_model, dummy_weights=True, device="cuda", dtype=args.dtype,
                                 tokenizer=args.tokenizer, max_num_seqs=max(args.batches),
                                 kernels=KernelOptions(batch_invariant=args.batch_invariant)))  # fmt: skip
    runner = engine.runner
    graphs, cache, dims = runner.graphs, runner.cache, runner.dims
    gen = torch.Generator("cuda").manual_seed(0)
    with torch.inference_mode():
        feats = torch.randn(cache.num_slots, dims.n_audio_ctx, dims.n_audio_state, device="cuda", generator=gen)
        runner.model.decoder.fill_cross_cache(feats.to(runner.dtype), cache, 0)
        kv = graphs.kv_sizes[-1]
        mode = "batch-invariant kernels" if args.batch_invariant else "default kernels"
        print(f"{args.step_model} (dummy), {args.dtype}, {mode}, decode step graphs; probe = row 0, slot 0, position 40")
        print("| rows in the step | logits bitwise equal | argmax equal | max abs difference | max abs logit |")
        print("|---|---|---|---|---|")
        for trial in range(args.trials):
            token = torch.randint(0, 50000, (1, 1), device="cuda", generator=gen)
            position = torch.full((1, 1), 40, device="cuda")
            # the probe's K/V history: the same for every run below (each run rewrites position 40 only)
            alone = graphs.decode(token, position, kv).clone()
            for n in args.batches:
                tokens_n = torch.randint(0, 50000, (n, 1), device="cuda", generator=gen)
                positions_n = torch.randint(0, kv, (n, 1), device="cuda", generator=gen)
                tokens_n[0], positions_n[0] = token[0], position[0]
                got = graphs.decode(tokens_n, positions_n, kv)[:1].clone()
                diff = (got - alone).abs().max().item()
                same_pick = torch.equal(got.argmax(-1), alone.argmax(-1))
                print(f"| {n} (trial {trial}) | {torch.equal(got, alone)} | {same_pick} | {diff:.3g} "
                      f"| {alone.abs().max().item():.3g} |", flush=True)  # fmt: skip
    engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a real model (path or name) for the transcript check")
    ap.add_argument("--data", default=str(ROOT / "tests" / "data"), help="folder of 16 kHz WAV clips")
    ap.add_argument("--fillers", nargs="+", type=int, default=[7, 64, 200])
    ap.add_argument("--step-model", help="a size name (large-v3, large-v3-turbo) for the decode-step check")
    ap.add_argument("--tokenizer", help="tokenizer.json for a multilingual dummy model")
    ap.add_argument("--batches", nargs="+", type=int, default=[2, 8, 64, 256])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--batch-invariant", action="store_true", help="the batch-invariant kernels (KernelOptions)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.model:
        transcripts(args)
    if args.step_model:
        steps(args)


if __name__ == "__main__":
    main()

"""CPU cost of one decoded token: this engine's decoder step against CTranslate2's (faster-whisper's engine).

    python benchmarks/cpu_decode_step.py [--model tiny.en] [--dtype float32|int8] [--tokens 20 120] [--repeats 3] [--rounds 3] [--batch 1]

A whole request mixes the encoder, features and per-token work, and on this machine the engine's encoder is
faster while its decoder step is slower, so `cpu_peers.py` alone can show the two as level. Here each system
decodes the spontaneous clip's window to two fixed lengths (ours: `fixed_decode_tokens`; CTranslate2: `generate`
with end-of-text suppressed and a length limit, the tokens it actually produced are counted), and the difference
gives milliseconds per token; the rest (encoder, prompt, features for ours) is the intercept. Each system runs in
its own process, alternating over --rounds; medians over rounds. --batch N decodes N copies of the window together
(ours: N requests submitted at once; CTranslate2: one `generate` over a batch of N), so the slope is the time of
one decode step of N sequences. --dot-forms (with --dtype int8) adds ours with the decode products' int8 weights
widened to floats (KernelOptions.cpu_int8_dot off) and with the integer dot products in their AVX2 form (what a CPU
without AVX-512 VNNI runs; on one without it, the default already).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpu_peers import CLIPS, DATA, ct2_model_dir, median_time  # noqa: E402

CLIP = CLIPS["spontaneous 26.7 s"]
DOT_FORMS = ["ours-widened", "ours-avx2-dot"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--tokens", nargs=2, type=int, default=[20, 120])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    ap.add_argument("--dtype", default="float32", choices=["float32", "int8"],
                    help="both systems' weights: ours --dtype, CTranslate2's compute_type")
    ap.add_argument("--no-cpu-kernels", action="store_true", help="ours in torch alone (KernelOptions.cpu_decode off)")
    ap.add_argument("--dot-forms", action="store_true", help="int8: ours also widened, and with AVX2 dot products")
    ap.add_argument("--only", choices=["ours", "ctranslate2", *DOT_FORMS], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only is None:
        systems = ["ours", "ctranslate2", *DOT_FORMS] if args.dot_forms else ["ours", "ctranslate2"]
        rounds: dict[str, list[dict]] = {system: [] for system in systems}
        for _ in range(args.rounds):
            for system in rounds:
                out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--only", system], check=True,
                                     capture_output=True, text=True).stdout  # fmt: skip
                rounds[system].append(json.loads(out.strip().splitlines()[-1]))
        print(f"\nmodel {args.model} ({args.dtype}), {args.threads} threads, {CLIP} x {args.batch} decoded together, median of "
              f"{args.repeats} runs x {args.rounds} rounds")  # fmt: skip
        print("| system | tokens decoded | ms per token (one step of all sequences) | intercept ms (encoder, prompt, ...) |")
        print("|---|---|---|---|")
        per_token = {}
        for system, rs in rounds.items():
            slopes = [(r["ms"][1] - r["ms"][0]) / (r["n"][1] - r["n"][0]) for r in rs]
            per_token[system] = statistics.median(slopes)
            intercept = statistics.median(r["ms"][0] - s * r["n"][0] for r, s in zip(rs, slopes))
            print(f"| {system} | {rs[0]['n'][0]} / {rs[0]['n'][1]} | {per_token[system]:.2f} | {intercept:.0f} |")
        for system in (s for s in systems if s.startswith("ours")):
            print(f"ms per token, {system} / CTranslate2: {per_token[system] / per_token['ctranslate2']:.2f}")
        return

    torch.set_num_threads(args.threads)
    from engine.audio.uploads import decode_audio
    from engine.model.weights import resolve_model

    audio = decode_audio(DATA / CLIP)
    ms, counts = [], []
    if args.only.startswith("ours"):
        from engine.config import EngineConfig
        from engine.kernels import cpu_kernels
        from engine.kernels.options import KernelOptions
        from engine.request import DecodeOptions
        from engine.runtime.engine import Engine

        kernels = KernelOptions(cpu_decode=not args.no_cpu_kernels, cpu_int8_dot=args.only != "ours-widened")
        if args.only == "ours-avx2-dot":
            cpu_kernels.load().dot_form = "avx2"  # the engine's backend takes this same (cached) object
        engine = Engine(EngineConfig(model=args.model, device="cpu", num_threads=args.threads, kernels=kernels,
                                     dtype=args.dtype))
        engine.start()
        for n in args.tokens:
            options = DecodeOptions(without_timestamps=True, temperatures=(0.0,), fixed_decode_tokens=n)

            def run_ours():
                handles = [engine.submit(audio, options) for _ in range(args.batch)]
                return [h.wait(timeout=600) for h in handles]

            counts.append(len(run_ours()[0].segments[0].tokens))
            ms.append(median_time(run_ours, args.repeats) * 1e3)
        engine.shutdown()
    else:
        import ctranslate2
        from faster_whisper.feature_extractor import FeatureExtractor

        resolved = resolve_model(args.model)
        with tempfile.TemporaryDirectory() as tmp:
            model = ctranslate2.models.Whisper(str(ct2_model_dir(resolved, Path(tmp))), device="cpu",
                                               compute_type=args.dtype, intra_threads=args.threads)  # fmt: skip
        feats = FeatureExtractor(feature_size=model.n_mels)(audio)[:, :3000]
        feats = np.pad(feats, ((0, 0), (0, 3000 - feats.shape[1])))[None].astype(np.float32)
        feats = np.ascontiguousarray(np.repeat(feats, args.batch, axis=0))
        features = ctranslate2.StorageView.from_array(feats)
        tok = json.loads((resolved.config_dir / "tokenizer.json").read_text())["added_tokens"]
        ids = {t["content"]: t["id"] for t in tok}
        prompt = [ids["<|startoftranscript|>"], ids["<|notimestamps|>"]]
        for n in args.tokens:
            # CTranslate2 returns fewer tokens than max_length (about half here): count what it returned
            def run():
                encoded = model.encode(features, to_cpu=False)
                return model.generate(encoded, [prompt] * args.batch, max_length=n, beam_size=1,
                                      suppress_tokens=[-1, ids["<|endoftext|>"]])  # fmt: skip

            counts.append(len(run()[0].sequences_ids[0]))
            ms.append(median_time(run, args.repeats) * 1e3)
    print(json.dumps({"ms": ms, "n": counts}))


if __name__ == "__main__":
    main()

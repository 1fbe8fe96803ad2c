"""Engine throughput and latency on a GPU against transformers `generate`, same weights, same run.

    python benchmarks/gpu_throughput.py --models large-v3 large-v3-turbo --concurrency 1 8 64 256

Dummy (random) weights at the real shapes, float16, random 30 s inputs, exactly --tokens tokens per
window (EOS ignored, so both systems do the same work). RTFx = seconds of audio / seconds of wall time. For the
engine also the time to first token (TTFT) of each request, from submission to its first decoded token, as p50
and p90 over the requests of a concurrency level: all of them are submitted at once, so later ones wait for the
encoder batches ahead of them while earlier ones decode. Both systems run each concurrency once untimed first.

--closed-loop R also runs the engine as benchmarks/http_load.py drives a server, without HTTP: the largest
concurrency's number of clients, each submitting its next request when the last one is done, R requests in all.
Its RTFx against the all-at-once figure shows what the arrival pattern alone costs; against http_load's, what
HTTP costs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WINDOW_S = 30.0
# The floor from the card (PERF.md): minimum GPU time per 30 s window at ~100 tokens.
FLOOR_RTFX = {"large-v3": 3400, "large-v3-turbo": 8000}


def run_engine(model: str, concurrency: list[int], tokens: int, repeats: int, tokenizer: str | None, eager: bool,
               stepwise: int | None = None, cross_cache_dtype: str = "auto", overlap: bool | None = None,
               encoder_precision: str = "model", closed_loop: int = 0, multi_step: int | None = None,
               timestamps: bool = False, int8_kernel: str = "cuda", batch_invariant: bool = False,
               invariant_few_rows: bool = True):
    from engine.config import EngineConfig
    from engine.kernels.options import KernelOptions
    from engine.request import DecodeOptions
    from engine.runtime.engine import Engine

    # the last engine's cache back to the device first (its request handles lived until its call returned): the
    # memory plan counts what torch's allocator still holds as used, and both engines must get the same slots
    gc.collect()
    torch.cuda.empty_cache()
    engine = Engine(EngineConfig(model=model, dummy_weights=True, device="cuda", dtype="float16",
                                 tokenizer=tokenizer, enforce_eager=eager, stepwise_prompt_tokens=stepwise,
                                 cross_cache_dtype=cross_cache_dtype, overlap_steps=overlap,
                                 encoder_precision=encoder_precision, max_waiting=max(256, *concurrency),
                                 multi_step=multi_step,
                                 kernels=KernelOptions(int8_attention=int8_kernel, batch_invariant=batch_invariant,
                                                       invariant_few_rows=invariant_few_rows)))
    engine.start()
    # no quality thresholds: random input must not be judged silent and skipped
    options = DecodeOptions(language="en", without_timestamps=not timestamps, temperatures=(0.0,),
                            fixed_decode_tokens=tokens, no_speech_threshold=None, log_prob_threshold=None,
                            compression_ratio_threshold=None)
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(int(WINDOW_S * 16000)) * 0.1).astype(np.float32)
    engine.transcribe(audio, options)  # warm-up
    results, ttfts = {}, {}
    for c in concurrency:
        # one untimed round first: a new concurrency's first round pays one-time costs (allocator growth, the
        # first eager prefill of its shapes) that a serving engine pays once, not per request (0.4 s at 8 windows)
        for h in [engine.submit(audio, options) for _ in range(c)]:
            h.wait(timeout=600)
        times, ttft = [], []
        for _ in range(repeats):
            before = engine.num_tokens
            start = time.perf_counter()
            handles = [engine.submit(audio, options) for _ in range(c)]
            ttft += [h.wait(timeout=600).time_to_first_token for h in handles]
            times.append(time.perf_counter() - start)
            assert engine.num_tokens - before == c * tokens, (engine.num_tokens - before, c * tokens)
        results[c] = statistics.median(times)
        ttfts[c] = (statistics.median(ttft), float(np.percentile(ttft, 90)))
    if closed_loop:
        c = max(concurrency)
        wall = asyncio.run(run_closed_loop(engine, audio, options, c, closed_loop))
        print(f"{model}: closed loop, {c} clients, {closed_loop} requests: {wall:.2f} s, "
              f"RTFx {closed_loop * WINDOW_S / wall:.0f} (all {c} at once: {c * WINDOW_S / results[c]:.0f})", flush=True)
    stats = engine.runner.graphs.stats if engine.runner.graphs else None
    slots = engine.runner.num_slots
    engine.shutdown()  # its memory goes back to the device when the next engine starts (above)
    return results, ttfts, stats, slots


async def run_closed_loop(engine, audio: np.ndarray, options, clients: int, total: int) -> float:
    """Seconds for `total` requests from `clients` clients that each send their next request when the last is done."""
    remaining = total

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await engine.submit(audio, options).result()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start


def run_transformers(model: str, concurrency: list[int], tokens: int, repeats: int):
    import transformers

    from engine.model.dims import DUMMY_DIMS
    from engine.model.weights import Checkpoint, dummy_state_dict
    from tests.helpers.weights_export import hf_configs, to_hf_names

    dims = DUMMY_DIMS[model]
    state = dummy_state_dict(dims, dtype=torch.float16, device="cuda")
    config, _ = hf_configs(Checkpoint(dims, state, None, None, None, None, "dummy"))
    config["dtype"] = "float16"
    hf = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**config)).half()
    hf.load_state_dict(to_hf_names(state), strict=False)
    hf.tie_weights()
    hf = hf.cuda().eval()
    del state
    eot = 50257 if dims.is_multilingual else 50256
    results = {}
    for c in concurrency:
        feats = torch.randn(c, dims.n_mels, 3000, device="cuda", dtype=torch.float16)
        prompt = torch.tensor([[eot + 1]] * c, device="cuda")

        def once():
            with torch.inference_mode():
                out = hf.generate(input_features=feats, decoder_input_ids=prompt, max_new_tokens=tokens,
                                  min_new_tokens=tokens, do_sample=False, num_beams=1, suppress_tokens=[eot])
            torch.cuda.synchronize()
            return out

        once()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            once()
            times.append(time.perf_counter() - start)
        results[c] = statistics.median(times)
        del feats
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["large-v3", "large-v3-turbo"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 64, 256])
    ap.add_argument("--peer-concurrency", nargs="+", type=int, default=None, help="default: same as --concurrency")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for dummy multilingual models")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--stepwise-prompt-tokens", type=int, default=None,
                    help="the engine's stepwise_prompt_tokens (default: its own; 0 = a prefill pass for every prompt)")
    ap.add_argument("--cross-cache-dtype", default="auto", choices=["auto", "model", "int8"],
                    help="the engine's cross_cache_dtype (int8: half the cross-attention bytes per step)")
    ap.add_argument("--overlap-steps", default="auto", choices=["auto", "on", "off"],
                    help="the engine's overlap_steps (on: each step launched before the previous one is read)")
    ap.add_argument("--closed-loop", type=int, default=0, metavar="R",
                    help="also R requests from as many clients as the largest concurrency, each sending its next "
                         "when the last is done (http_load's pattern, without HTTP)")
    ap.add_argument("--encoder-precision", default="model", choices=["model", "float8"],
                    help="the engine's encoder_precision (float8: e4m3 encoder products; transformers stays float16)")
    ap.add_argument("--multi-step", type=int, default=None,
                    help="the engine's multi_step (greedy steps per launch for a few windows; default: its own)")
    ap.add_argument("--timestamps", action="store_true",
                    help="decode with timestamp rules (the server's way) instead of text only")
    ap.add_argument("--int8-kernel", default="cuda", choices=["cuda", "triton"],
                    help="the int8 cross-attention kernel (KernelOptions.int8_attention; cuda falls back to triton "
                         "where it does not build)")
    ap.add_argument("--batch-invariant", default="off", choices=["off", "on", "both"],
                    help="the batch-invariant kernels (KernelOptions.batch_invariant); both: today's kernels, then the "
                         "invariant ones, in one process, and a table of their ratio")
    ap.add_argument("--invariant-few-rows", default="off", choices=["on", "off"],
                    help="a few rows' invariant products in the kernel that reads its weight before waiting "
                         "(KernelOptions.invariant_few_rows); off: the tile kernel at every row count")
    ap.add_argument("--switch-interval-ms", type=float, default=0.5,
                    help="Python's thread switch interval, as `serve` and the engine process set it (its default: 5)")
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    overlap = {"auto": None, "on": True, "off": False}[args.overlap_steps]
    if len(args.models) > 1:
        # one process per model: a finished engine's caches and graph pools are then surely returned
        for model in args.models:
            i = sys.argv.index("--models")
            rest = [a for a in sys.argv[1:i]] + sys.argv[i + 1 + len(args.models):]
            subprocess.run([sys.executable, __file__, "--models", model, *rest], check=True)
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, float16, {args.tokens} tokens per window")
    rows = []
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.batch_invariant]
    for model in args.models:
        runs = {}
        for invariant in modes:
            runs[invariant] = run_engine(model, args.concurrency, args.tokens, args.repeats, args.tokenizer, False,
                                         args.stepwise_prompt_tokens, args.cross_cache_dtype, overlap,
                                         args.encoder_precision, args.closed_loop, args.multi_step,
                                         args.timestamps, args.int8_kernel, invariant,
                                         args.invariant_few_rows == "on")
            print(f"{model} (batch-invariant {invariant}): {runs[invariant][3]} slots; graph stats {runs[invariant][2]}",
                  flush=True)
        ours, ttfts, _, _ = runs[modes[-1]]
        peer = {} if args.no_peer else run_transformers(model, args.peer_concurrency or args.concurrency,
                                                         args.tokens, max(1, args.repeats - 1))
        for c in args.concurrency:
            rtfx = c * WINDOW_S / ours[c]
            p = peer.get(c)
            rows.append((model, c, ours[c], rtfx, p, c * WINDOW_S / p if p else None, *ttfts[c]))
            print(rows[-1], flush=True)
        if len(runs) == 2:
            print(f"\n{model}: batch-invariant kernels against today's, same process")
            print("| concurrency | today s | invariant s | throughput ratio | TTFT p50 today / invariant s |")
            print("|---|---|---|---|---|")
            (base, base_ttft, _, _), (inv, inv_ttft, _, _) = runs[False], runs[True]
            for c in args.concurrency:
                print(f"| {c} | {base[c]:.3f} | {inv[c]:.3f} | {base[c] / inv[c]:.2f} | "
                      f"{base_ttft[c][0]:.3f} / {inv_ttft[c][0]:.3f} |")
    # time to first token: from submission (all c requests at once) to each request's first decoded token
    print("\n| model | concurrency | engine s | engine RTFx | TTFT p50 / p90 s | transformers s | transformers RTFx | ratio | floor RTFx | of floor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, c, t, rtfx, p, prtfx, ttft50, ttft90 in rows:
        floor = FLOOR_RTFX.get(model)
        peer_cols = f"{p:.3f} | {prtfx:.0f} | {rtfx / prtfx:.1f}x" if p else "- | - | -"
        of_floor = f"{rtfx / floor * 100:.0f}%" if floor else "-"
        print(f"| {model} | {c} | {t:.3f} | {rtfx:.0f} | {ttft50:.3f} / {ttft90:.3f} | {peer_cols} | {floor or '-'} | {of_floor} |")


if __name__ == "__main__":
    main()

"""Beam search: tokens against faster-whisper's, word error rate against greedy, and the cost on a GPU.

    python benchmarks/beam_search.py parity [--models tiny.en base]     # CPU, float32, tests/data
    python benchmarks/beam_search.py cost --model large-v3 [--windows 1 64 256] [--tokens 100] [--max-num-seqs N]  # GPU

parity: every clip of one window (tiny.en: the English ones; base: all) decoded with beam_size=5 at temperature 0
without timestamps, all submitted at once (the beams share the batch), against faster-whisper's
`transcribe(beam_size=5, temperature=0, without_timestamps=True, vad_filter=False)` at float32; then the WER of
beam 5 and of greedy on the LibriSpeech clips and on the long-form English clips (> 30 s), and the 60 s clip's
long-form transcript (timestamps, previous-text conditioning, fallback) against faster-whisper's
`transcribe(beam_size=5)`.

cost: `windows` windows of dummy weights, each decoding exactly `tokens` tokens, greedy and with beam_size=5 in one
run: wall time per window, decode slots held at the peak, and the cross-attention cache bytes held.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data"
LONG_CLIP = "g2_en_earnings22_4482311_3-62s.wav"


def clips() -> list[dict[str, str]]:
    with open(DATA / "MANIFEST.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def fw_model(name: str, tmp: Path):
    """faster-whisper on the packaged CTranslate2 weights (a split model.bin joined in a temporary folder)."""
    from faster_whisper import WhisperModel

    from engine.model.weights import resolve_model

    resolved = resolve_model(name)
    folder = resolved.config_dir
    if len(resolved.weight_files) > 1:
        folder = tmp / name
        folder.mkdir()
        for f in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copy(resolved.config_dir / f, folder / f)
        with open(folder / "model.bin", "wb") as whole:
            whole.writelines(part.read_bytes() for part in resolved.weight_files)
    return WhisperModel(str(folder), device="cpu", compute_type="float32", cpu_threads=2)


def parity(models: list[str]) -> None:
    import jiwer

    from engine import DecodeOptions, Engine, EngineConfig
    from engine.audio.uploads import decode_audio
    from tests.helpers.transcripts import normalize_english

    rows = clips()
    audio = {r["file"]: decode_audio((DATA / r["file"]).read_bytes(), 600) for r in rows}
    beam = DecodeOptions(without_timestamps=True, temperatures=(0.0,), beam_size=5)
    greedy = DecodeOptions(without_timestamps=True, temperatures=(0.0,))
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            english_only = model.endswith(".en")
            short = [
                r["file"] for r in rows if float(r["duration_s"]) <= 30 and (r["language"] == "en" or not english_only)
            ]
            engine = Engine(EngineConfig(model=model))
            engine.start()
            fw = fw_model(model, Path(tmp))
            start = time.perf_counter()
            handles = {n: engine.submit(audio[n], beam) for n in short}
            ours = {n: h.wait(timeout=3600) for n, h in handles.items()}
            our_s = time.perf_counter() - start
            start = time.perf_counter()
            theirs = {}
            for n in short:
                segments, _ = fw.transcribe(audio[n], beam_size=5, temperature=0, without_timestamps=True,
                                            vad_filter=False)  # fmt: skip
                theirs[n] = [t for s in segments for t in s.tokens]
            fw_s = time.perf_counter() - start
            differ = [n for n in short if [t for s in ours[n].segments for t in s.tokens] != theirs[n]]
            table.append((model, f"{len(short) - len(differ)}/{len(short)}", f"{our_s:.1f}", f"{fw_s:.1f}"))
            for n in differ:
                print(f"{model} differs on {n}:\n  ours:           {ours[n].text!r}\n"
                      f"  faster-whisper: {engine.tokenizer.decode(theirs[n])!r}")  # fmt: skip
            if english_only:
                wer_rows(engine, audio, rows, beam, greedy, normalize_english, jiwer)
                longform(engine, fw, audio[LONG_CLIP])
            engine.shutdown()
    print(
        "\n| model | beam 5 clips token-identical to faster-whisper | ours, all at once (s) | faster-whisper, one by one (s) |"
    )
    print("|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")


def wer_rows(engine, audio, rows, beam, greedy, normalize, jiwer) -> None:
    import dataclasses

    sets = {
        "LibriSpeech (one window)": [r for r in rows if "librispeech" in r["file"]],
        "long-form English (> 30 s)": [r for r in rows if float(r["duration_s"]) > 30 and r["language"] == "en"],
    }
    print("\n| clips | greedy WER | beam 5 WER |\n|---|---|---|")
    for label, chosen in sets.items():
        refs = [normalize(r["reference_text"]) for r in chosen]
        out = []
        for opts in (greedy, beam):
            if "long" in label:  # long-form: timestamps, conditioning and fallback as a transcription request does
                opts = dataclasses.replace(opts, without_timestamps=False, temperatures=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0))
            handles = [engine.submit(audio[r["file"]], opts) for r in chosen]
            hyps = [normalize(h.wait(timeout=3600).text) for h in handles]
            out.append(f"{jiwer.wer(refs, hyps):.2%}")
        print(f"| {label} ({len(chosen)}) | {out[0]} | {out[1]} |")


def longform(engine, fw, audio) -> None:
    from engine import DecodeOptions

    ours = engine.transcribe(audio, DecodeOptions(language="en", beam_size=5))
    segments, _ = fw.transcribe(audio, beam_size=5, vad_filter=False, condition_on_previous_text=True, language="en")
    theirs = list(segments)
    same = [s.tokens for s in ours.segments] == [s.tokens for s in theirs]
    print(f"\nlong-form {LONG_CLIP} with beam_size=5: {len(ours.segments)} segments, faster-whisper {len(theirs)}; "
          f"tokens equal: {same}")  # fmt: skip
    if not same:
        print("  ours:          ", ours.text)
        print("  faster-whisper:", "".join(s.text for s in theirs).strip())


def cost(model: str, windows: list[int], tokens: int, tokenizer: str | None, max_num_seqs: int | None,
         max_text_ctx: int | None) -> None:
    import numpy as np
    import torch

    from engine import DecodeOptions, Engine, EngineConfig

    config = EngineConfig(model=model, dummy_weights=True, tokenizer=tokenizer, max_waiting=4096,
                          max_num_seqs=max_num_seqs, max_text_ctx=max_text_ctx)  # fmt: skip
    engine = Engine(config)
    engine.start()
    runner = engine.runner
    cache = runner.cache
    per_cross = sum(t[:, 0].nbytes for t in (cache.cross_k, cache.cross_v, cache.cross_k_scale, cache.cross_v_scale)
                    if t is not None)  # fmt: skip
    rng = np.random.default_rng(0)
    audio = [rng.standard_normal(16000 * 30).astype(np.float32) * 0.1 for _ in range(max(windows))]
    print(f"{model}: {runner.num_slots} rows, {runner.num_cross_slots} cross slots of {per_cross / 2**20:.0f} MiB")
    print("| windows | greedy s/window | beam 5 s/window | ratio | peak rows, cross slots (GiB) greedy | beam 5 |")
    print("|---|---|---|---|---|---|")
    for n in windows:
        row = [str(n)]
        peaks = []
        for beam in (1, 5):
            opts = DecodeOptions(language="en", without_timestamps=True, fixed_decode_tokens=tokens, beam_size=beam)
            engine.transcribe(audio[0], opts)  # warm: graphs of this batch shape
            peak, done = [0, 0], threading.Event()
            watcher = threading.Thread(target=watch, args=(engine, peak, done))
            watcher.start()
            start = time.perf_counter()
            handles = [engine.submit(a, opts) for a in audio[:n]]
            for h in handles:
                h.wait()
            row.append(f"{(time.perf_counter() - start) / n:.4f}")
            done.set()
            watcher.join()
            peaks.append(f"{peak[0]}, {peak[1]} ({peak[1] * per_cross / 2**30:.1f})")
        row.append(f"{float(row[2]) / float(row[1]):.2f}")
        print("| " + " | ".join(row + peaks) + " |")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    engine.shutdown()


def watch(engine, peak: list[int], done: threading.Event) -> None:
    """The most rows and cross slots held at once, sampled until `done`."""
    while not done.is_set():
        running = list(engine.scheduler.running)
        peak[0] = max(peak[0], len(running))
        peak[1] = max(peak[1], len({s.cross_slot for s in running}))
        time.sleep(0.0005)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("parity")
    p.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    c = sub.add_parser("cost")
    c.add_argument("--model", default="large-v3")
    c.add_argument("--windows", nargs="+", type=int, default=[1, 64, 256])
    c.add_argument("--tokens", type=int, default=100)
    c.add_argument("--tokenizer", default=None, help="tokenizer.json (or its folder) for dummy multilingual weights")
    c.add_argument("--max-num-seqs", type=int, default=None, help="decode rows (default: the engine's)")
    c.add_argument("--max-text-ctx", type=int, default=None, help="self-attention positions per row")
    args = ap.parse_args()
    if args.what == "parity":
        parity(args.models)
    else:
        cost(args.model, args.windows, args.tokens, args.tokenizer, args.max_num_seqs, args.max_text_ctx)


if __name__ == "__main__":
    main()

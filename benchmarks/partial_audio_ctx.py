"""Short encoder contexts for realtime partial decodes (DecodeOptions.context_margin_s) against full windows: cost
and words, through the engine, decoded as the server's partials are (greedy, text only, no fallback).

    python benchmarks/partial_audio_ctx.py --model tiny.en [--margins 1 2 3] [--cuts 1 2 3 4 5 6 8] [--clips GLOB]

A growing turn's partial decode hears its first L seconds. As a full window those are L seconds of audio and 30 - L
of padding, 1,500 encoder positions; on a short context the encoder sees the audio and `margin` seconds of the
padding only, and the decoder attends to those positions (whisper.cpp's `audio_ctx`), at least SHORT_CONTEXT_FLOOR_S
under SHORT_CONTEXT_MIN_S of audio (engine/transcription/sequential.py); such a decode is capped at a few tokens per
second of audio and gives no text when it reaches the cap (engine/transcription/sequential.py
SHORT_CONTEXT_TOKENS: it is repeating itself). For each real clip in tests/data and each cut L, the full window and
each margin are decoded one request at a time on the engine (this CPU). Per margin it prints: the decodes that gave
no text (capped, or no speech heard), how many of the full windows' words the short decodes give in the same order
(difflib's matching blocks over normalized words) and how many they give besides, the identical texts, and the total
time against the full windows'. `--clips`: a glob in tests/data (default the LibriSpeech clips).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.audio.constants import SAMPLE_RATE
from engine.audio.uploads import decode_audio
from engine.config import EngineConfig
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from tests.helpers.transcripts import normalize_text

PARTIAL = DecodeOptions(temperatures=(0.0,), without_timestamps=True)  # as server/realtime/connection.py decodes one


def decode_all(engine: Engine, pieces: list, options: DecodeOptions) -> tuple[list[str], float]:
    start = time.perf_counter()
    texts = [engine.submit(piece, options).wait(timeout=600).text for piece in pieces]
    return texts, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--cuts", nargs="+", type=float, default=[1, 2, 3, 4, 5, 6, 8])
    ap.add_argument("--margins", nargs="+", type=float, default=[1.0, 2.0, 3.0])
    ap.add_argument("--clips", default="g1_en_librispeech-*", help="a glob of the clips in tests/data")
    args = ap.parse_args()
    clips = sorted(p for p in (ROOT / "tests" / "data").glob(args.clips) if p.suffix in (".wav", ".flac"))
    engine = Engine(EngineConfig(model=args.model, device="cpu"))
    engine.start()
    try:
        audios = [decode_audio(p.read_bytes()) for p in clips]
        pieces = [a[: int(cut * SAMPLE_RATE)] for cut in args.cuts for a in audios]
        full, full_s = decode_all(engine, pieces, PARTIAL)
        reference = [normalize_text(t).split() for t in full]
        total = sum(len(words) for words in reference)
        print(f"{args.model}, {len(clips)} clips ({args.clips}) cut at {' '.join(f'{c:g}' for c in args.cuts)} s: "
              f"{len(pieces)} decodes one at a time, {torch.get_num_threads()} threads; full windows {full_s:.1f} s, "
              f"{sum(not w for w in reference)} without text")  # fmt: skip
        print("| margin s | no text | words of the full windows matched | other words | same text | time vs full |")
        print("|---|---|---|---|---|---|")
        for margin in args.margins:
            texts, seconds = decode_all(engine, pieces, dataclasses.replace(PARTIAL, context_margin_s=margin))
            words = [normalize_text(t).split() for t in texts]
            matched = sum(
                b.size
                for ref, got in zip(reference, words)
                for b in difflib.SequenceMatcher(a=ref, b=got, autojunk=False).get_matching_blocks()
            )
            same = sum(a == b for a, b in zip(full, texts))
            other = sum(len(w) for w in words) - matched
            print(f"| {margin:g} | {sum(not w for w in words)} of {len(pieces)} | {matched} of {total} "
                  f"({matched / total:.0%}) | {other} | {same} of {len(pieces)} | {seconds / full_s:.2f}x |",
                  flush=True)  # fmt: skip
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()

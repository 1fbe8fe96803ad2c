"""CPU single-request latency: this engine vs faster-whisper float32 vs transformers generate, same run.

    python benchmarks/cpu_peers.py [--model tiny.en] [--repeats 3] [--threads 2]

Model load is excluded; each figure is the median of --repeats runs of features + encoder + greedy
decode without timestamps. Each system runs in its own child process, one after the other: thread pools left
spinning by one library (OpenMP, CTranslate2) would otherwise slow the next on a small machine.
Prints a table and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
CLIPS = {
    "LibriSpeech 16.7 s": "g1_en_librispeech-test-clean_1221-135766-0001.wav",
    "spontaneous 26.7 s": "g1_en_spontaneous_mfa-acoustic-corpus.wav",
}


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--only", choices=["ours", "faster-whisper", "transformers"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only is None:
        results = {}
        for system in ("ours", "faster-whisper", "transformers"):
            out = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--only", system], check=True, capture_output=True, text=True
            ).stdout
            results[system] = json.loads(out.strip().splitlines()[-1])
        print(f"\nmodel {args.model}, {args.threads} threads, median of {args.repeats}, load excluded")
        print("| clip | this engine (s) | faster-whisper fp32 (s) | transformers (s) | fw / ours | hf / ours |")
        print("|---|---|---|---|---|---|")
        for label in CLIPS:
            o, f, h = (results[s][label] for s in ("ours", "faster-whisper", "transformers"))
            print(f"| {label} | {o:.3f} | {f:.3f} | {h:.3f} | {f / o:.2f}x | {h / o:.2f}x |")
        return
    torch.set_num_threads(args.threads)

    from faster_whisper import WhisperModel
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from engine.audio import decode_audio
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.request import DecodeOptions
    from engine.weights import load_checkpoint, resolve_model

    sys.path.insert(0, str(ROOT / "tests"))
    from weights_export import write_hf_export

    resolved = resolve_model(args.model)
    audios = {label: decode_audio(args.data / name) for label, name in CLIPS.items()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only == "ours":
            engine = Engine(EngineConfig(model=args.model, device="cpu", num_threads=args.threads))
            engine.start()
            options = DecodeOptions(without_timestamps=True, temperatures=(0.0,))
            run = lambda audio: engine.transcribe(audio, options).text  # noqa: E731
        elif args.only == "faster-whisper":
            ct2_dir = Path(tmp) / "ct2"
            ct2_dir.mkdir()
            for f in resolved.config_dir.iterdir():
                if f.suffix in (".json", ".txt"):
                    (ct2_dir / f.name).write_bytes(f.read_bytes())
            with open(ct2_dir / "model.bin", "wb") as out:  # faster-whisper wants one model.bin
                for part in resolved.weight_files:
                    out.write(part.read_bytes())
            fw = WhisperModel(str(ct2_dir), device="cpu", compute_type="float32", cpu_threads=args.threads)

            def run(audio):
                segments, _ = fw.transcribe(audio, beam_size=1, temperature=0, without_timestamps=True, vad_filter=False)
                return "".join(s.text for s in segments)
        else:
            checkpoint = load_checkpoint(resolved)
            hf_dir = write_hf_export(checkpoint, Path(tmp) / "hf")
            extractor = WhisperFeatureExtractor(feature_size=checkpoint.dims.n_mels)
            hf = WhisperForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()

            def run(audio):
                feats = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
                with torch.inference_mode():
                    return hf.generate(feats, num_beams=1, do_sample=False, max_new_tokens=440)

        times = {label: median_time(lambda: run(audio), args.repeats) for label, audio in audios.items()}
    print(json.dumps(times))


if __name__ == "__main__":
    main()

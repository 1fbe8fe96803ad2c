"""CPU: one request through the server (HTTP, int8) against faster-whisper int8 in process, quiet and beside busy
processes, over several runs.

    python benchmarks/cpu_server.py [--model tiny.en] [--runs 5] [--load 0 2] [--repeats 3] [--serve-args "..."]

Each run and load: `busy` processes (pure-Python loops) start, then the server (`serve --model M --dtype int8`,
the product as a user runs it) answers each clip --repeats times (median, after one untimed request), then
faster-whisper (`compute_type="int8"`, 2 threads, in a child process of its own) transcribes the same clips the
same way: greedy with its temperature fallback and timestamps, as the server decodes. Load is excluded from both.
Prints every run's ratio (ours / faster-whisper: below 1 ours is faster) and, per load, the median and how many
runs were within --target. "windows": the encoder passes of one request, ours / faster-whisper's (ours from /metrics,
faster-whisper's counted in its process): where a clip's last segment ends before its audio does, Whisper decodes
the rest in a window of its own, and two systems whose last segment ends differently then differ by an encoder pass.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_int8 import busy_processes
from cpu_peers import CLIPS, DATA, ct2_model_dir, median_time

from tests.helpers.server import RemoteServer, metric


def time_server(server: RemoteServer, data: Path, repeats: int) -> tuple[dict[str, float], dict[str, int]]:
    """Each clip's median time through the server, and the windows one request of it encoded."""
    times, windows = {}, {}
    with httpx.Client(timeout=300) as client:
        for label, name in CLIPS.items():
            body = (data / name).read_bytes()

            def post(body=body, name=name):
                r = client.post(f"{server.base_url}/audio/transcriptions", files={"file": (name, body)},
                                data={"model": "whisper-1"})  # fmt: skip
                r.raise_for_status()

            times[label] = median_time(post, repeats)
            before = metric(server, "whisper_engine_total", '{name="windows_encoded"}')
            post()
            windows[label] = round(metric(server, "whisper_engine_total", '{name="windows_encoded"}') - before)
    return times, windows


def time_faster_whisper(args) -> dict[str, tuple[float, int]]:
    """In this (child) process: faster-whisper int8's median time per clip, the upload decoded as the server does,
    and the windows one transcription of it encoded."""
    from faster_whisper import WhisperModel

    from engine.audio.uploads import decode_audio
    from engine.model.weights import resolve_model

    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = WhisperModel(str(ct2_model_dir(resolve_model(args.model), Path(tmp))), device="cpu",
                             compute_type="int8", cpu_threads=args.threads)  # fmt: skip
        for label, name in CLIPS.items():

            def run(name=name):
                segments, _ = model.transcribe(decode_audio(args.data / name), beam_size=1, vad_filter=False)
                return [s.text for s in segments]

            seconds = median_time(run, args.repeats)
            encodes, encode = [], model.encode

            def counted(features, encodes=encodes, encode=encode):
                encodes.append(1)
                return encode(features)

            model.encode = counted
            run()
            model.encode = encode
            times[label] = (seconds, len(encodes))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--load", type=int, nargs="+", default=[0, 2], help="busy processes beside the measurements")
    ap.add_argument("--target", type=float, nargs="+", default=[0.8, 1.2], help="the ratio to stay under, per load")
    ap.add_argument("--serve-args", default="", help="more flags for serve (an A/B of a kernel option, say)")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_only:
        print(json.dumps(time_faster_whisper(args)))
        return
    serve = [
        "--model",
        args.model,
        "--dtype",
        "int8",
        "--num-threads",
        str(args.threads),
        *shlex.split(args.serve_args),
    ]
    print(f"ours: serve {shlex.join(serve)}; peer: faster-whisper int8, {args.threads} threads, in process")
    print("| run | busy processes | clip | ours s | faster-whisper s | ours / faster-whisper | windows |")
    print("|---|---|---|---|---|---|---|")
    ratios: dict[int, list[float]] = {load: [] for load in args.load}
    for run in range(1, args.runs + 1):
        for load in args.load:
            with busy_processes(load):
                with RemoteServer(*serve) as server:
                    ours, windows = time_server(server, args.data, args.repeats)
                cmd = [sys.executable, __file__, "--peer-only", "--model", args.model, "--repeats", str(args.repeats),
                       "--threads", str(args.threads), "--data", str(args.data)]  # fmt: skip
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                theirs = json.loads(out.strip().splitlines()[-1])
            for label in CLIPS:
                seconds, encodes = theirs[label]
                ratio = ours[label] / seconds
                ratios[load].append(ratio)
                print(f"| {run} | {load} | {label} | {ours[label]:.3f} | {seconds:.3f} | {ratio:.2f}x | "
                      f"{windows[label]} / {encodes} |", flush=True)  # fmt: skip
    print("\n| busy processes | ratios (every run and clip) | median | target | within it |")
    print("|---|---|---|---|---|")
    for load, target in zip(args.load, args.target):
        r = ratios[load]
        print(f"| {load} | {' '.join(f'{x:.2f}' for x in r)} | {statistics.median(r):.2f}x | <= {target}x | "
              f"{sum(x <= target for x in r)} of {len(r)} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""A model loaded on demand and unloaded when idle (--model-ttl-s): the server's memory and the requests' latency.

    python benchmarks/model_ttl.py --spawn "--model tiny.en --model base --model-ttl-s 3" --model base

Prints the server's resident memory (its process tree) before the model loads, once a request has loaded it, and
after its TTL has unloaded it; the first request's latency (it waits for the load) against the next one's (the
peer: the same request on the loaded model), both the JFK clip.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.server import spawn_or_exit, tree_rss_mib

CLIP = ROOT / "tests" / "data" / "g1_en_jfk.flac"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spawn", default="--model tiny.en --model base --model-ttl-s 3")
    ap.add_argument("--model", default="base", help="the model the requests name")
    args = ap.parse_args()
    server = spawn_or_exit(args.spawn)
    try:
        client, audio = server.client(), CLIP.read_bytes()

        def transcribe() -> float:
            start = time.perf_counter()
            client.audio.transcriptions.create(file=(CLIP.name, audio), model=args.model)
            return time.perf_counter() - start

        idle = tree_rss_mib(server.proc.pid)
        first = transcribe()
        loaded = tree_rss_mib(server.proc.pid)
        second = transcribe()
        while httpx.get(f"{server.url}/health").json()["models"][args.model] != "unloaded":
            time.sleep(0.2)
        unloaded = tree_rss_mib(server.proc.pid)
        print(
            "| server RSS MiB: before / loaded / after the TTL | first request s (loads the model) | next request s |"
        )
        print("|---|---|---|")
        print(f"| {idle:.0f} / {loaded:.0f} / {unloaded:.0f} | {first:.2f} | {second:.2f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()

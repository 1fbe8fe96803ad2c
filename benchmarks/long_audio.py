"""Hours of audio in a few kilobytes through a real server: what a long upload costs in time and memory, and what it
costs a short request sent beside it.

    python benchmarks/long_audio.py --hours 1 2 2.9

For each length (--hours, under the server's limit: 3 hours by default) a FLAC of digital silence (58 KB for four
hours, tests/helpers/hostile_media.py's silent_flac) is uploaded as verbose_json to a server of its own (--server:
serve's flags), and 1 s later the short clip (--plain, response_format json) is sent once. The table: the long
request's time and RTFx, the server's peak RSS growth over its RSS before the upload (sampled every 50 ms), and the
short request's latency alone (the median of --repeats, before the upload) and beside the long one.

tests/e2e/test_long_audio.py asserts the bounds on 40 minutes (growth under 500 MB, the short request under twice its
time alone plus 1.5 s); this script measures the longer uploads that would make the suite slow.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.data import DATA
from tests.helpers.hostile_media import silent_flac
from tests.helpers.server import spawn_or_exit

TIMEOUT_S = 3600


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) / 1024


def post(url: str, name: str, data: bytes, response_format: str) -> tuple[float, dict]:
    """Seconds from sending the upload to the end of its answer, and the answer (a non-200 ends the script)."""
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": (name, data)},
                   data={"model": "whisper-1", "response_format": response_format}, timeout=TIMEOUT_S)  # fmt: skip
    seconds = time.perf_counter() - start
    if r.status_code != 200:
        raise SystemExit(f"{name} answered {r.status_code}: {r.text[:300]}")
    return seconds, r.json()


def measure(flags: str, hours: float, plain: tuple[str, bytes], repeats: int) -> tuple:
    """(upload KB, long request s, peak growth MB, plain alone s, plain beside s) on a fresh server."""
    data = silent_flac(hours * 3600)
    server = spawn_or_exit(flags)
    try:
        post(server.url, *plain, "json")  # warm-up, untimed
        alone = statistics.median(post(server.url, *plain, "json")[0] for _ in range(repeats))
        pid = server.proc.pid
        baseline = rss_mb(pid)
        peak, done, outcome = [baseline], threading.Event(), {}

        def watch() -> None:
            while not done.is_set():
                peak.append(rss_mb(pid))
                time.sleep(0.05)

        def long_request() -> None:
            outcome["seconds"], outcome["body"] = post(server.url, "silence.flac", data, "verbose_json")

        watcher, worker = threading.Thread(target=watch), threading.Thread(target=long_request)
        watcher.start()
        worker.start()
        try:
            time.sleep(1.0)  # the long request is decoded, its features under way
            beside = post(server.url, *plain, "json")[0]
            worker.join()
        finally:
            done.set()
            watcher.join()
        if abs(outcome["body"]["duration"] - hours * 3600) > 1:
            raise SystemExit(f"{hours} h came back as {outcome['body']['duration']} s")
        return len(data) / 1024, outcome["seconds"], max(peak) - baseline, alone, beside
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, nargs="+", default=[1.0, 2.0], help="lengths of silence, each on a server")
    ap.add_argument("--server", default="", metavar="FLAGS", help="serve's flags (write one as --server=--flag)")
    ap.add_argument("--plain", default="g1_en_jfk.flac", help="the short request's clip (tests/data)")
    ap.add_argument("--repeats", type=int, default=5, help="short requests alone before the upload (their median)")
    args = ap.parse_args()

    plain = (args.plain, (DATA / args.plain).read_bytes())
    rows = []
    for hours in args.hours:
        rows.append((hours, *measure(args.server, hours, plain, args.repeats)))
        print(f"{hours:g} h: {rows[-1][1:]}", file=sys.stderr, flush=True)

    print(f"\nsilence as verbose_json, server flags `{args.server or '(defaults)'}`, `{args.plain}` beside it")
    print("| hours | upload KB | long request s | RTFx | peak RSS growth MB | short alone s | short beside s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for hours, kb, seconds, growth, alone, beside in rows:
        print(f"| {hours:g} | {kb:.0f} | {seconds:.1f} | {hours * 3600 / seconds:.0f} | {growth:.0f} | {alone:.2f} | "
              f"{beside:.2f} | {beside / alone:.1f}x |")  # fmt: skip


if __name__ == "__main__":
    main()

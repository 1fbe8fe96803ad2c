"""HTTP load test of a running server: N concurrent clients, M transcription requests in total.

    python benchmarks/http_load.py --url http://127.0.0.1:8000 --concurrency 8 --requests 32
    python benchmarks/http_load.py --spawn "--model tiny.en" --compare-sequential --concurrency 8 --requests 8
    python benchmarks/http_load.py --spawn "--model large-v3 --dummy-weights" --synthetic-seconds 30 \
        --concurrency 64 --requests 256

Each request is the multipart upload the OpenAI SDK sends for `client.audio.transcriptions.create(file=path,
model=..., response_format="json")`: a `file` part named after the file, plus `model` and `response_format` fields.
Files are read once and sent from memory; requests cycle through --files. One warm-up request per run is not
counted. RTFx = seconds of audio transcribed / seconds of wall time. Latency is per request, from send to the end
of the response body.

--compare-sequential sends the same --requests one at a time first (concurrency 1), then --concurrency at a time,
and prints both rows and the throughput ratio (what continuous batching buys).

--spawn "ARGS" starts `python -m server serve ARGS --host 127.0.0.1 --port <free port>` from the repository root,
waits for GET /health to answer 200, runs the benchmark against it and stops it (tests/helpers/server.py's
RemoteServer, the one the end-to-end tests start their servers with). `--spawn` alone starts the defaults
(tiny.en); write a single flag as `--spawn=--dummy-weights` so that it is not read as this script's own.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import multiprocessing
import sys
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.server import spawn_or_exit  # noqa: E402

DATA = ROOT / "tests" / "data"
DEFAULT_FILE = DATA / "g1_en_librispeech-dev-clean_2412-153948-0000.flac"  # 11.66 s of read speech
SAMPLE_RATE = 16000


@dataclass(frozen=True)
class Upload:
    """One audio file as the client sends it."""

    name: str
    data: bytes
    seconds: float


@dataclass
class RunResult:
    label: str
    concurrency: int
    wall_s: float
    latencies: list[float] = field(default_factory=list)  # successful requests only
    audio_s: float = 0.0  # audio of the successful requests
    errors: int = 0
    first_error: str | None = None
    engine_totals: tuple[dict[str, float], dict[str, float]] = ({}, {})  # /metrics before and after the run

    @property
    def requests(self) -> int:
        return len(self.latencies) + self.errors

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.wall_s if self.wall_s > 0 else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")


def synthetic_wav(seconds: float, seed: int = 0) -> bytes:
    """`seconds` of 16 kHz mono 16-bit noise as a WAV file (for dummy-weight runs, where content does not matter)."""
    rng = np.random.default_rng(seed)
    samples = np.clip(rng.standard_normal(int(seconds * SAMPLE_RATE)) * 0.1, -1.0, 1.0)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes((samples * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def load_uploads(files: list[Path], synthetic_seconds: float | None) -> list[Upload]:
    if synthetic_seconds is not None:
        return [Upload(f"synthetic-{synthetic_seconds:g}s.wav", synthetic_wav(synthetic_seconds), synthetic_seconds)]
    from engine.audio.uploads import decode_audio  # decodes exactly as the server does, for the audio length

    uploads = []
    for path in files:
        data = path.read_bytes()
        uploads.append(Upload(path.name, data, len(decode_audio(data)) / SAMPLE_RATE))
    return uploads


async def run_load(url: str, model: str, uploads: list[Upload], concurrency: int, num_requests: int,
                   timeout_s: float, label: str, barrier=None) -> RunResult:
    """`num_requests` transcriptions, at most `concurrency` in flight; request i sends uploads[i % len]."""
    endpoint = f"{url.rstrip('/')}/v1/audio/transcriptions"
    # Connections idle longer than uvicorn's 5 s keep-alive are closed by the server; a client that reuses one
    # just then gets a ReadError (the warm-up's connection sat idle while the first batch was decoded).
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
    headers = {"Authorization": "Bearer unused"}
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=headers) as client:

        async def send(upload: Upload) -> tuple[float, str | None]:
            start = time.perf_counter()
            try:
                response = await client.post(
                    endpoint,
                    files={"file": (upload.name, upload.data)},
                    data={"model": model, "response_format": "json"},
                )
                elapsed = time.perf_counter() - start
                if response.status_code != 200:
                    return elapsed, f"HTTP {response.status_code}: {response.text[:200]}"
                if "text" not in response.json():
                    return elapsed, f"no text in {response.text[:200]}"
                return elapsed, None
            except (httpx.HTTPError, ValueError) as exc:
                return time.perf_counter() - start, f"{type(exc).__name__}: {exc}"

        # Warm-up: the first request may pay for lazy initialisation; it is not counted.
        _, error = await send(uploads[0])
        if error is not None:
            raise SystemExit(f"warm-up request failed: {error}")

        if barrier is not None:  # other client processes: start the timed run together
            await asyncio.to_thread(barrier.wait)
        result = RunResult(label, concurrency, wall_s=0.0)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(num_requests):
            queue.put_nowait(i)

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                upload = uploads[i % len(uploads)]
                elapsed, error = await send(upload)
                if error is None:
                    result.latencies.append(elapsed)
                    result.audio_s += upload.seconds
                else:
                    result.errors += 1
                    result.first_error = result.first_error or error

        before = engine_totals((await client.get(f"{url}/metrics")).text)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, num_requests))))
        result.wall_s = time.perf_counter() - start
        result.engine_totals = (before, engine_totals((await client.get(f"{url}/metrics")).text))
    return result


def print_table(results: list[RunResult]) -> None:
    header = ("run", "concurrency", "requests", "wall s", "req/s", "audio s", "RTFx", "p50 s", "p95 s", "p99 s",
              "errors")
    rows = [
        (r.label, str(r.concurrency), str(r.requests), f"{r.wall_s:.2f}", f"{r.throughput:.3f}", f"{r.audio_s:.1f}",
         f"{r.audio_s / r.wall_s:.2f}" if r.wall_s > 0 else "-", f"{r.percentile(50):.2f}", f"{r.percentile(95):.2f}",
         f"{r.percentile(99):.2f}", str(r.errors))
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |")
    for r in results:
        if r.first_error:
            print(f"{r.label}: first error: {r.first_error}")


def _client_process(args: tuple) -> RunResult:
    return asyncio.run(run_load(*args))


def run_load_processes(url: str, model: str, uploads: list[Upload], concurrency: int, num_requests: int,
                       timeout_s: float, label: str, processes: int) -> RunResult:
    """run_load split over client processes: one Python process cannot push hundreds of 1 MB uploads a second
    through httpx, and a load generator that is itself the bottleneck measures nothing about the server."""
    if processes == 1:
        return asyncio.run(run_load(url, model, uploads, concurrency, num_requests, timeout_s, label))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(processes + 1)
        jobs = [
            (url, model, uploads, concurrency // processes + (i < concurrency % processes),
             num_requests // processes + (i < num_requests % processes), timeout_s, label, barrier)
            for i in range(processes)
        ]
        with ctx.Pool(processes) as pool:
            pending = pool.map_async(_client_process, jobs)
            barrier.wait()  # every client has made its warm-up request
            before = engine_totals(httpx.get(f"{url}/metrics", timeout=10).text)
            parts = pending.get()
    merged = RunResult(label, concurrency, wall_s=max(p.wall_s for p in parts))
    for p in parts:
        merged.latencies += p.latencies
        merged.audio_s += p.audio_s
        merged.errors += p.errors
        merged.first_error = merged.first_error or p.first_error
    merged.engine_totals = (before, engine_totals(httpx.get(f"{url}/metrics", timeout=10).text))
    return merged


def engine_totals(metrics_text: str) -> dict[str, float]:
    """The server's `whisper_engine_total{name=...}` gauges (steps, tokens, busy_seconds, graph counters), and the
    time-to-first-token histogram's count and sum (as ttft_count, ttft_sum)."""
    totals = {}
    for line in metrics_text.splitlines():
        if line.startswith('whisper_engine_total{name="'):
            name, value = line[len('whisper_engine_total{name="') :].split('"} ')
            totals[name] = float(value)
        elif line.startswith(("whisper_time_to_first_token_seconds_count ", "whisper_time_to_first_token_seconds_sum ")):
            name, value = line.split()
            totals["ttft_" + name.rsplit("_", 1)[1]] = float(value)
    return totals


def print_engine_load(before: dict[str, float], after: dict[str, float], wall_s: float) -> None:
    """How busy the engine loop was during the run: if it idles, the HTTP side is what limits throughput."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = delta.get("steps", 0.0)
    if steps <= 0 or wall_s <= 0:
        return
    print(
        f"engine loop: busy {delta.get('busy_seconds', 0.0) / wall_s:.0%} of the run's wall time, {steps:.0f} steps, "
        f"{delta.get('tokens', 0.0) / steps:.1f} tokens per step, {delta.get('busy_seconds', 0.0) / steps * 1e3:.2f} ms per step"
    )
    if delta.get("ttft_count", 0.0) > 0:
        print(f"time to first token (engine): mean {delta['ttft_sum'] / delta['ttft_count']:.3f} s over "
              f"{delta['ttft_count']:.0f} requests")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (ignored with --spawn)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    ap.add_argument("--requests", type=int, default=None, help="requests in total (default: 4 x --concurrency)")
    ap.add_argument("--files", type=Path, nargs="+", default=[DEFAULT_FILE], help="audio files, sent round-robin")
    ap.add_argument("--model", default="whisper-1", help="`model` form field")
    ap.add_argument("--synthetic-seconds", type=float, default=None, metavar="S",
                    help="send an S-second noise WAV generated in memory instead of --files")
    ap.add_argument("--compare-sequential", action="store_true",
                    help="first send the same requests one by one, then concurrently; print the throughput ratio")
    ap.add_argument("--spawn", nargs="?", const="", default=None, metavar="ARGS",
                    help='start `python -m server serve ARGS` on a free local port for the run (e.g. "--model base")')
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    ap.add_argument("--processes", type=int, default=1,
                    help="client processes sharing --concurrency and --requests (for loads one process cannot drive)")
    args = ap.parse_args()
    if args.concurrency < 1:
        ap.error("--concurrency must be >= 1")
    num_requests = args.requests if args.requests is not None else 4 * args.concurrency
    if num_requests < 1:
        ap.error("--requests must be >= 1")
    if args.synthetic_seconds is not None and args.synthetic_seconds <= 0:
        ap.error("--synthetic-seconds must be > 0")
    uploads = load_uploads(args.files, args.synthetic_seconds)
    names = ", ".join(f"{u.name} ({u.seconds:.2f} s)" for u in uploads)

    spawned = spawn_or_exit(args.spawn) if args.spawn is not None else None
    url = spawned.url if spawned else args.url
    try:
        results = []
        if args.compare_sequential:
            results.append(asyncio.run(run_load(url, args.model, uploads, 1, num_requests, args.timeout, "sequential")))
        label = "concurrent" if args.compare_sequential else "load"
        results.append(run_load_processes(url, args.model, uploads, args.concurrency, num_requests, args.timeout,
                                          label, args.processes))
    finally:
        if spawned:
            spawned.stop()

    print(f"\n{url}, model field {args.model!r}, files: {names}")
    print_table(results)
    print_engine_load(*results[-1].engine_totals, results[-1].wall_s)
    if args.compare_sequential:
        sequential, concurrent = results
        if sequential.throughput > 0:
            ratio = concurrent.throughput / sequential.throughput
            print(f"\nthroughput ratio concurrent / sequential: {ratio:.2f}x")
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Prometheus collectors on a per-app registry, and the middleware that counts requests.

With several front-end processes (--api-servers) prometheus_client runs in its multiprocess mode (frontends.py):
counters and histograms are summed over the front-ends, the sessions open and diarizations pending too (of the
live ones), and the engine's gauges, which each front-end sets from the engine's stats as it answers a scrape, are
the most recent.
"""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine import EngineStats, Task, TranscriptionResult

from .errors import CLIENT_CLOSED_REQUEST

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
ENGINE = "mostrecent"  # an engine gauge's mode across front-ends: the latest front-end's reading of the engine
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """All collectors of one app; a registry per app so that several apps can live in one process (tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "whisper_http_requests",
            "HTTP requests by route and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "whisper_http_request_duration_seconds",
            "HTTP request latency by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "whisper_audio_seconds", "Seconds of audio transcribed or translated, by task and served model.",
            ["task", "model"], registry=self.registry,
        )  # fmt: skip
        # Under load a new request waits for a slot and an encoder batch while running ones keep decoding:
        # this is the latency that scheduling trades against throughput.
        self.time_to_first_token = Histogram(
            "whisper_time_to_first_token_seconds",
            "Seconds from a request reaching the engine to its first decoded token, by served model.",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.queue_depth = Gauge("whisper_queue_depth", "Requests waiting for a decode slot.", registry=self.registry,
                                 multiprocess_mode=ENGINE)  # fmt: skip
        self.running = Gauge("whisper_running_sequences", "Sequences being decoded.", registry=self.registry,
                             multiprocess_mode=ENGINE)  # fmt: skip
        self.slots = Gauge("whisper_decode_slots", "Decode slots of the engine.", registry=self.registry,
                           multiprocess_mode=ENGINE)  # fmt: skip
        # Engine totals (steps, tokens, CUDA-graph replays and eager fallbacks), so a silent fall back to
        # eager execution shows up on a dashboard.
        self.engine_restarts = Counter(
            "whisper_engine_restarts", "Times the engine was restarted after it died.", registry=self.registry
        )
        self.realtime_sessions = Gauge(
            "whisper_realtime_sessions", "Realtime sessions open (WebSocket and WebRTC).", registry=self.registry,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.realtime_audio_seconds = Counter(
            "whisper_realtime_audio_seconds", "Seconds of audio received by realtime sessions.", registry=self.registry
        )
        self.realtime_completed_latency = Histogram(
            "whisper_realtime_completed_latency_seconds",
            "Seconds from the end of a realtime turn (its commit, or the silence that ended it) to its transcript.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.realtime_early_finals = Counter(
            "whisper_realtime_early_finals",
            "Realtime turns' final decodes started before the server VAD ended the turn, by outcome (used: the turn "
            "ended there; dropped: the speech resumed).",
            ["outcome"], registry=self.registry,
        )
        self.realtime_partial_decodes = Counter(
            "whisper_realtime_partial_decodes",
            "Realtime turns' partial (live) decodes finished, by whether they continued the words already sent as "
            "their prefix (--realtime-partial-prefix).",
            ["prefix"], registry=self.registry,
        )
        self.realtime_delta_latency = Histogram(
            "whisper_realtime_delta_latency_seconds",
            "Seconds from the audio a live delta covers to the delta (the decode of the turn so far).",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.diarizations = Counter(
            "whisper_diarizations", "Recordings diarized (diarized_json, diarize), by outcome.", ["outcome"],
            registry=self.registry,
        )
        self.diarization_latency = Histogram(
            "whisper_diarization_duration_seconds",
            "Seconds from a recording's arrival at the diarizer to its speaker turns (its wait for a pass included).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.diarization_pass = Histogram(
            "whisper_diarization_pass_recordings",
            "Recordings diarized together in one pass of the diarization models.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.diarization_pending = Gauge(
            "whisper_diarization_pending", "Recordings waiting for or in the diarizer.", registry=self.registry,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.batch_invariant = Gauge(
            "whisper_batch_invariant",
            "1 when the engine runs the batch-invariant GPU kernels (a request's tokens do not depend on the batch).",
            registry=self.registry, multiprocess_mode=ENGINE,
        )
        self.engine_totals = Gauge(
            "whisper_engine_total", "Engine counters since start, by name.", ["name"], registry=self.registry,
            multiprocess_mode=ENGINE,
        )

        # data parallel engines, each labelled by its index (--data-parallel-size > 1)
        self.engine_up = Gauge(
            "whisper_engine_up",
            "1 while engine `engine` runs (a data parallel engine's index, or a served model's id).",
            ["engine"],
            registry=self.registry,
            multiprocess_mode=ENGINE,
        )
        self.engine_waiting = Gauge(
            "whisper_engine_queue_depth", "Requests waiting for a decode slot, by data parallel engine.", ["engine"],
            registry=self.registry, multiprocess_mode=ENGINE,
        )  # fmt: skip
        self.engine_running = Gauge(
            "whisper_engine_running_sequences", "Sequences being decoded, by data parallel engine.", ["engine"],
            registry=self.registry, multiprocess_mode=ENGINE,
        )  # fmt: skip
        self.engine_member_totals = Gauge(
            "whisper_engine_member_total", "Engine counters since its start, by data parallel engine and name.",
            ["engine", "name"], registry=self.registry, multiprocess_mode=ENGINE,
        )  # fmt: skip

    def observe_result(self, task: Task, result: TranscriptionResult, *, model: str) -> None:
        """A request's result, counted for `model` (the served model's own id, whatever alias the request named)."""
        self.audio_seconds.labels(task.value, model).inc(result.duration)
        if result.time_to_first_token is not None:
            self.time_to_first_token.labels(model).observe(result.time_to_first_token)

    def render(
        self, stats: EngineStats | None, members: list[tuple[int | str, EngineStats | None]] | None = None
    ) -> bytes:
        """Prometheus text exposition; engine gauges are read at scrape time. `members`: each data parallel
        engine's stats, or each served model's (None: down), for the series labelled by engine (its index, or the
        model's id); `stats` is then their sum."""
        for index, each in members or ():
            engine = str(index)
            self.engine_up.labels(engine).set(each is not None)
            if each is not None:
                self.engine_waiting.labels(engine).set(each.num_waiting)
                self.engine_running.labels(engine).set(each.num_running)
                for name, value in each.extra.items():
                    self.engine_member_totals.labels(engine, name).set(value)
        if stats is not None:
            self.queue_depth.set(stats.num_waiting)
            self.running.set(stats.num_running)
            self.slots.set(stats.num_slots)
            self.batch_invariant.set(stats.batch_invariant)
            for name, value in stats.extra.items():
                self.engine_totals.labels(name).set(value)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # every front-end's series, from their files
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts every HTTP request by its route template (not the raw path, to bound label cardinality)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = CLIENT_CLOSED_REQUEST  # stays so if no response is ever started

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        except Exception:
            status = 500
            raise
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, scope["method"], str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)

"""The per-address connection count (server/deadlines.py) and the log's redaction of query credentials
(server/logs.py); the deadlines themselves are timed on a real server in tests/e2e/test_read_deadlines.py."""

from __future__ import annotations

import json
import logging

from server.deadlines import ConnectionGuard, ReadLimits, error_response, too_many_connections
from server.logs import JsonFormatter, RedactFilter, redact
from server.settings import Settings


def test_the_cap_counts_each_address_and_frees_on_close():
    guard = ConnectionGuard(ReadLimits(10, 10, 8192, max_connections_per_ip=2))
    assert guard.admit("10.0.0.1") and guard.admit("10.0.0.1")
    assert not guard.admit("10.0.0.1")
    assert guard.admit("10.0.0.2")
    guard.release("10.0.0.1")
    assert guard.admit("10.0.0.1")
    for _ in range(2):
        guard.release("10.0.0.1")
    guard.release("10.0.0.2")
    assert not guard.open_by_ip  # no entry kept for an address with nothing open
    unlimited = ConnectionGuard(ReadLimits(10, 10, 8192, max_connections_per_ip=0))
    assert all(unlimited.admit("10.0.0.1") for _ in range(5000))


def test_limits_come_from_the_settings():
    settings = Settings(_env_prefix="UNUSED_PREFIX_")
    assert (settings.header_timeout_s, settings.body_min_rate_kib_s, settings.body_grace_s) == (10.0, 8.0, 10.0)
    assert settings.max_connections_per_ip == 1024
    limits = ConnectionGuard.from_settings(Settings(body_min_rate_kib_s=2, max_connections_per_ip=0)).limits
    assert limits.body_min_rate_bytes_s == 2048 and limits.max_connections_per_ip == 0


def test_a_refusal_is_a_whole_response_with_the_openai_envelope():
    raw = error_response(too_many_connections(3), [(b"server", b"uvicorn")])
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 ") and b"retry-after: 1" in head.lower() and b"connection: close" in head
    assert int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) == len(body)
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "too_many_connections"


def test_query_credentials_are_redacted_in_text_and_json_lines():
    assert redact("/v1/models?api_key=secret123&x=1") == "/v1/models?api_key=***&x=1"
    assert redact("/v1/realtime?intent=transcription&API-KEY=abc") == "/v1/realtime?intent=transcription&API-KEY=***"
    assert redact("/x?tokens=3&token=zz&access_token=yy") == "/x?tokens=3&token=***&access_token=***"
    assert redact("/v1/models?keyword=api_key=1") == "/v1/models?keyword=api_key=1"  # only a query's own names
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/v1/models?api_key=secret123", "1.1", 200), None)  # fmt: skip
    assert RedactFilter().filter(record)
    record.request_id = "-"
    line = JsonFormatter().format(record)
    assert "secret123" not in line and "api_key=***" in json.loads(line)["message"]

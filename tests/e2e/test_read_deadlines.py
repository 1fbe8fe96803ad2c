"""Slow clients on a real server (server/deadlines.py), with raw sockets: a head sent a line at a time, a body sent a
byte at a time, more connections from one address than the cap; and that ordinary requests, uploads and realtime
WebSockets are untouched. Also: an `api_key` in a URL's query never reaches the log."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from tests.helpers.server import RemoteServer

HEADER_TIMEOUT_S = 3.0
BODY_GRACE_S = 1.0
BODY_MIN_RATE_KIB_S = 4.0
MAX_CONNECTIONS_PER_IP = 8
OTHER_IP = "127.0.0.2"  # another peer address on the loopback interface (Linux routes all of 127/8 there)
UPLOAD = "g2_en_earnings22_4482311_3-62s.wav"


@pytest.fixture(scope="module")
def strict_server():
    remote = RemoteServer(
        "--header-timeout-s", str(HEADER_TIMEOUT_S),
        "--body-grace-s", str(BODY_GRACE_S),
        "--body-min-rate-kib-s", str(BODY_MIN_RATE_KIB_S),
        "--max-connections-per-ip", str(MAX_CONNECTIONS_PER_IP),
    )  # fmt: skip
    yield remote
    remote.stop()


def connect(server, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=(source, 0))


def read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    start, data = time.monotonic(), b""
    sock.settimeout(timeout_s)
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def status_and_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def trickle(sock: socket.socket, pieces) -> bytes:
    """Send each piece about a second apart (each wait is a read of what the server answers) until it closes."""
    response = b""
    sock.settimeout(1.0)
    for piece in pieces:
        try:
            sock.sendall(piece)
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        response += chunk
        if not chunk:
            break
    return response


def test_a_slowloris_head_is_answered_408_and_closed_within_the_deadline(strict_server):
    sock = connect(strict_server)
    start = time.monotonic()
    sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n")
    # a header line a second, for four times the deadline
    response = trickle(sock, (b"X-Slow-%d: y\r\n" % i for i in range(int(HEADER_TIMEOUT_S * 4))))
    elapsed = time.monotonic() - start
    assert response.startswith(b"HTTP/1.1 408"), response
    assert status_and_error(response)[1]["code"] == "request_timeout"
    assert HEADER_TIMEOUT_S - 0.5 < elapsed < HEADER_TIMEOUT_S + 2.5


def test_a_connection_that_sends_nothing_is_closed(strict_server):
    response, elapsed = read_until_closed(connect(strict_server), HEADER_TIMEOUT_S + 5)
    assert response == b"" and elapsed < HEADER_TIMEOUT_S + 2


def test_a_trickled_body_is_answered_408_with_the_openai_envelope(strict_server):
    sock = connect(strict_server)
    boundary = b"deadline-test"
    part = b'--%s\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' % boundary
    sock.sendall(
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: multipart/form-data; boundary=%s\r\nContent-Length: 100000\r\n\r\n%s" % (boundary, part)
    )
    start = time.monotonic()
    response = trickle(sock, (b"a" for _ in range(20)))  # a byte a second; the rule wants 4 KiB/s after a second
    elapsed = time.monotonic() - start
    status, error = status_and_error(response)
    assert status == 408 and error["type"] == "invalid_request_error" and error["code"] == "request_timeout"
    assert set(error) == {"message", "type", "param", "code"}
    assert elapsed < BODY_GRACE_S + 4
    assert '"POST /v1/audio/transcriptions HTTP/1.1" 408' in strict_server.log_tail(10**6)


def test_connections_past_the_cap_are_refused_while_others_are_served(strict_server):
    # all of it within the head deadline, which closes idle connections
    held = [connect(strict_server, OTHER_IP) for _ in range(MAX_CONNECTIONS_PER_IP)]
    try:
        time.sleep(0.2)  # let the server accept them all
        refused = [connect(strict_server, OTHER_IP) for _ in range(3)]
        for sock in refused:
            response, elapsed = read_until_closed(sock, 2)
            status, error = status_and_error(response)
            assert status == 429 and error["code"] == "too_many_connections" and elapsed < 1.5
        # another address is served as usual, and so is the capped one once a connection of its closes
        assert strict_server.client().models.list().data
        held.pop().close()
        time.sleep(0.2)
        with httpx.Client(transport=httpx.HTTPTransport(local_address=OTHER_IP)) as client:
            assert client.get(f"{strict_server.url}/health").status_code == 200
    finally:
        for sock in held:
            sock.close()


def test_an_upload_through_the_sdk_still_works(strict_server, data_dir):
    path = data_dir / UPLOAD
    with path.open("rb") as f:
        result = strict_server.client().audio.transcriptions.create(model="whisper-1", file=f)
    assert len(result.text.split()) > 20


def test_a_realtime_websocket_outlives_the_read_deadlines(strict_server):
    url = strict_server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    with ws_connect(url, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"].endswith("created")
        time.sleep(HEADER_TIMEOUT_S + BODY_GRACE_S + 1)  # idle past both deadlines
        event = {
            "type": "session.update",
            "session": {"type": "transcription", "audio": {"input": {"turn_detection": None}}},
        }
        ws.send(json.dumps(event))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"


def test_an_api_key_in_the_query_is_redacted_in_the_log(strict_server):
    assert httpx.get(f"{strict_server.url}/v1/models?api_key=secret123&x=1").status_code == 200
    time.sleep(0.5)
    log = strict_server.log_tail(10**6)
    assert "secret123" not in log
    assert "/v1/models?api_key=***&x=1" in log

"""Uploads that would make FFmpeg reach beyond their own bytes: a 400 at once, and nothing reached.

An SDP file makes FFmpeg bind UDP ports and wait for RTP; HLS and DASH playlists and ffconcat
lists name URLs or local files for FFmpeg to open. Each is sent under an innocent audio file
name (the name is the client's to choose) while the test watches the server process's UDP
sockets and a TCP listener of its own that the playlists point at.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.helpers import hostile_media
from tests.helpers.hostile_media import dash, ffconcat, free_udp_port, hls, sdp, udp_socket_inodes
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

pytestmark = pytest.mark.skipif(not Path("/proc/net/udp").exists(), reason="watches sockets through Linux /proc")

ENVELOPE_KEYS = {"message", "type", "param", "code"}
# The refusal is a header check; an SDP upload held the request for ~26 s before the fix.
ANSWER_WITHIN_S = 5.0
LOCAL_CLIP = "g4_en_jfk.mp3"  # what a playlist or list points the server at on its own disk


@pytest.fixture
def tcp_listener():
    with hostile_media.tcp_listener() as listener:
        yield listener


# name -> document text from (listener port, real clip on the server's disk)
HOSTILE = {
    "sdp": lambda port, clip: sdp(free_udp_port()),  # released, so the server could bind it
    "hls url": lambda port, clip: hls(f"http://127.0.0.1:{port}/segment.mp3"),
    "hls local file": lambda port, clip: hls(str(clip)),
    "dash url": lambda port, clip: dash(f"http://127.0.0.1:{port}/audio.mp3"),
    "dash local file": lambda port, clip: dash(str(clip)),
    "ffconcat url": lambda port, clip: ffconcat(f"http://127.0.0.1:{port}/speech.mp3"),
    "ffconcat local file": lambda port, clip: ffconcat(str(clip)),
}


def post_watching_udp(server, data: bytes) -> tuple[httpx.Response, float, set[int]]:
    """Uploads `data` as speech.mp3; returns the answer, its latency and the UDP sockets the server opened meanwhile."""
    pid = server.proc.pid
    before = udp_socket_inodes(pid)
    opened: set[int] = set()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(
            httpx.post,
            f"{server.url}/v1/audio/transcriptions",
            files={"file": ("speech.mp3", data, "audio/mpeg")},
            data={"model": "whisper-1"},
            timeout=ANSWER_WITHIN_S,
        )
        while not answer.done():
            opened |= udp_socket_inodes(pid) - before
            time.sleep(0.002)
        response = answer.result()  # a ReadTimeout fails the test: the request was held
    return response, time.monotonic() - start, opened | (udp_socket_inodes(pid) - before)


@pytest.mark.parametrize("case", HOSTILE)
def test_document_upload_is_400_and_reaches_nothing(server, data_dir, tcp_listener, case):
    port, peers = tcp_listener
    document = HOSTILE[case](port, data_dir / LOCAL_CLIP)
    response, latency, udp_opened = post_watching_udp(server, document.encode())

    assert response.status_code == 400, response.text  # a transcript here would be the local clip's
    assert set(response.json()) == {"error"} and set(response.json()["error"]) == ENVELOPE_KEYS
    assert response.json()["error"]["param"] == "file"
    assert latency < ANSWER_WITHIN_S
    assert not udp_opened
    assert peers == []
    normal = server.client().audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    assert contains_words(normal.text, JFK_WORDS)

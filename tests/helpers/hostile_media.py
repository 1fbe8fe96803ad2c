"""Uploads that point FFmpeg beyond their own bytes, and the probes that see whether it went there.

Shared by the decoder's unit tests and the end-to-end ones: an SDP file (FFmpeg's sdp demuxer binds the RTP port
and waits), HLS and DASH playlists and ffconcat lists (they name URLs or local files to open); a TCP listener on
127.0.0.1 for the URLs to point at, and the UDP sockets a process holds, read from Linux's /proc. Also hours of
audio in a few kilobytes (silent_flac: tests/e2e/test_long_audio.py and benchmarks/long_audio.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path


def sdp(rtp_port: int) -> str:
    """A session description: FFmpeg's sdp demuxer binds rtp_port (and +1 for RTCP) and waits for RTP."""
    return (
        "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        f"m=audio {rtp_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )


def hls(segment: str) -> str:
    return f"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n{segment}\n#EXT-X-ENDLIST\n"


def dash(base_url: str, mime_type: str = "audio/mpeg") -> str:
    return (
        '<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" '
        'profiles="urn:mpeg:dash:profile:isoff-on-demand:2011" mediaPresentationDuration="PT11S" minBufferTime="PT1S">'
        f'<Period><AdaptationSet mimeType="{mime_type}"><Representation id="a" bandwidth="64000">'
        f"<BaseURL>{base_url}</BaseURL></Representation></AdaptationSet></Period></MPD>"
    )


def ffconcat(*entries: str) -> str:
    return "ffconcat version 1.0\n" + "".join(f"file '{entry}'\n" for entry in entries)


def silent_flac(seconds: float, sample_rate: int = 16000) -> bytes:
    """Digital silence in 65,535-sample FLAC frames: 58 KB for four hours at 16 kHz."""
    import av  # here: the module's other uploads need no codec library
    import numpy as np

    block = 65535
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=sample_rate, options={"frame_size": str(block)})
        stream.layout, stream.format = "mono", "s16"
        zeros = np.zeros((1, block), dtype=np.int16)
        total = int(seconds * sample_rate)
        for start in range(0, total, block):
            frame = av.AudioFrame.from_ndarray(zeros[:, : min(block, total - start)], format="s16", layout="mono")
            frame.rate, frame.pts = sample_rate, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that was free a moment ago (released, so that FFmpeg could bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def tcp_listener() -> Iterator[tuple[int, list[tuple]]]:
    """A TCP server on 127.0.0.1 that records (and at once closes) each connection; yields (port, peers)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    peers: list[tuple] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            peers.append(peer)
            conn.close()  # an HTTP client waiting for an answer gets EOF instead of hanging

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], peers
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def udp_socket_inodes(pid: int | str = "self") -> set[int]:
    """Inodes of the UDP sockets the process holds."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            held.add(int(target[len("socket:[") : -1]))
    udp = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with open(table) as f:
            next(f)  # the header line
            udp.update(int(line.split()[9]) for line in f)
    return held & udp

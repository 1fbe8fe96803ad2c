"""SpeechStreamsProcess: live Silero streams (VoiceActivityDetector.stream / push_many) in a child process of their own.

Why a process: a server with hundreds of open microphones runs a Silero pass for all of them several times a
second. In a worker thread of the server's process that pass holds the GIL for its Python and its small torch
calls, and the event loop, which gives up the GIL at every socket call, waits up to a switch interval to take it
back each time: every session's events queue behind the pass, and the end of a turn is heard late. In a process of
its own the pass has its own GIL, and the loop only pickles the samples over (a few kB per append).

The parent holds a stand-in per stream (RemoteSpeechStream: its id and how many samples it has pushed); the child
holds the streams themselves, made on a stream's first push and dropped, with the next pass, once its stand-in is
gone. If the child dies the pass fails (its sessions get an error) and the next pass starts a new one: each stream
then starts again where its stand-in says, with a fresh LSTM state, so frame indices keep their meaning.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque

import numpy as np

from engine.processes.child import ChildProcess, picklable, setup_child
from engine.transcription.vad import FRAME_SAMPLES

START_TIMEOUT_S = 120.0  # importing torch and loading Silero on a cold, busy machine
PROCESS_NAME = "whisper-vad"
# A pass over a few streams is many small calls: one thread, which never competes with the engine's. Past
# PARALLEL_STREAMS its convolutions are the work, and on one core a thousand open microphones' pass can take longer
# than the audio it covers, so that turn detection falls ever further behind: up to a quarter of the cores, at most
# MAX_PASS_THREADS, take it (a GPU server's engine leaves its cores mostly idle).
PARALLEL_STREAMS = 128
MAX_PASS_THREADS = 4


def pass_threads(streams: int, cpus: int) -> int:
    """Threads for a pass over `streams` streams on a machine of `cpus` available cores."""
    return 1 if streams < PARALLEL_STREAMS else max(1, min(MAX_PASS_THREADS, cpus // 4))


class RemoteSpeechStream:
    """A SpeechStream's stand-in in the parent: frames_done as the stream's own would read."""

    def __init__(self, owner: SpeechStreamsProcess, stream_id: int):
        self.id = stream_id
        self.samples = 0  # pushed so far
        weakref.finalize(self, owner.dropped.append, stream_id)

    @property
    def frames_done(self) -> int:
        return self.samples // FRAME_SAMPLES


class SpeechStreamsProcess:
    """VoiceActivityDetector's live streams (stream, push_many) in a child process; push_many blocks (call it
    from a worker thread, one pass at a time)."""

    def __init__(self):
        self.dropped: deque[int] = deque()  # stand-ins gone since the last pass (appended by the garbage collector)
        self._ids = 0
        self._lock = threading.Lock()
        self._child = ChildProcess(_child_main, (), PROCESS_NAME, "voice activity process")

    def stream(self) -> RemoteSpeechStream:
        with self._lock:
            self._ids += 1
            return RemoteSpeechStream(self, self._ids)

    def start(self) -> None:
        """The child started and Silero loaded in it (it otherwise starts on the first pass)."""
        with self._lock:
            self._child.call(("ping",), START_TIMEOUT_S)  # answered once Silero has loaded, or with what it raised

    def push_many(self, streams: list[RemoteSpeechStream], audio: list[np.ndarray]) -> list[list[float]]:
        """SpeechStream.push for each stream, in one pass in the child: each stream's probabilities."""
        with self._lock:
            dropped = self._take_dropped()
            work = [(s.id, s.samples, np.asarray(a, dtype=np.float32)) for s, a in zip(streams, audio)]
            probs = self._child.call(("push", work, dropped))
            for stream, samples in zip(streams, audio):
                stream.samples += len(samples)
            return probs

    def live_streams(self) -> int:
        """How many streams the child holds (tests: a stand-in's stream goes with it)."""
        with self._lock:
            return self._child.call(("count", self._take_dropped()))

    def close(self) -> None:
        with self._lock:
            self._child.stop()

    def _take_dropped(self) -> list[int]:
        """The ids gone so far, each taken once (the collector may append more meanwhile, from any thread)."""
        return [self.dropped.popleft() for _ in range(len(self.dropped))]


def _child_main(conn, setup: tuple) -> None:
    setup_child(setup, PROCESS_NAME)
    import torch

    from engine.cpus import available_cpus
    from engine.transcription.vad import VoiceActivityDetector, push_many

    cpus = available_cpus()
    torch.set_num_threads(1)
    try:
        vad = VoiceActivityDetector()
        vad.start()
        failure = None
    except Exception as exc:  # noqa: BLE001 - the parent raises it
        failure = exc
    streams: dict[int, object] = {}

    def push(work: list[tuple[int, int, np.ndarray]]) -> list[list[float]]:
        """push_many over the child's streams; one it does not hold yet starts where the parent's stand-in is."""
        chosen = []
        for stream_id, samples_before, _ in work:
            stream = streams.get(stream_id)
            if stream is None:
                stream = streams[stream_id] = vad.stream()
                stream.pending = torch.zeros(samples_before % FRAME_SAMPLES)
                stream.frames_done = samples_before // FRAME_SAMPLES
            chosen.append(stream)
        threads = pass_threads(len(work), cpus)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return push_many(chosen, [audio for _, _, audio in work])

    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        kind = message[0]
        if kind == "stop":
            return
        if failure is not None:
            reply = ("error", failure if picklable(failure) is not None else RuntimeError(repr(failure)))
        elif kind == "ping":
            reply = ("ok", None)
        else:
            for stream_id in message[-1]:
                streams.pop(stream_id, None)
            try:
                reply = ("ok", len(streams) if kind == "count" else push(message[1]))
            except Exception as exc:  # noqa: BLE001 - the pass's failure: every session of it is told
                reply = ("error", exc if picklable(exc) is not None else RuntimeError(repr(exc)))
        try:
            conn.send(reply)
        except OSError:
            return

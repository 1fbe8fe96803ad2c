"""Log-mel of new requests on a GPU, off the engine loop: pinned staging, a stream of its own, an event to wait on."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

from engine.audio.features import LogMelSpectrogram
from engine.messages import AbortRequest, AddRequest


class FeatureWorker:
    """Takes the engine's inbox messages in order; computes each new request's log-mel, then passes it on.

    Done in the engine loop, this work per request (a 1.9 MB copy from pageable memory, which waits for the
    queued decoder steps, and the STFT) takes a noticeable share of the loop's time under HTTP load. Here the
    samples are staged in pinned memory and copied and transformed on a separate CUDA stream; the message carries
    an event recorded after the last kernel, and the loop makes its own stream wait for that event before it
    reads the log-mel.
    Every message (aborts too) goes through this one queue, so an abort cannot overtake its request.
    """

    def __init__(self, log_mel: LogMelSpectrogram, deliver: Callable[[AddRequest | AbortRequest], None]):
        self.log_mel = log_mel
        self.device = log_mel.device
        self.deliver = deliver
        self.stream = torch.cuda.Stream(self.device)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="engine-features", daemon=True)
        self.thread.start()

    def put(self, msg: AddRequest | AbortRequest) -> None:
        self.queue.put(msg)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    @torch.inference_mode()
    def _run(self) -> None:
        while (msg := self.queue.get()) is not None:
            if isinstance(msg, AddRequest):
                msg.features = self._features(msg.audio)
            self.deliver(msg)

    def _features(self, audio) -> tuple[torch.Tensor, torch.cuda.Event] | Exception:
        try:
            staged = torch.from_numpy(audio).pin_memory()
            with torch.cuda.stream(self.stream):
                # in pieces: hours of audio must not take a whole-file STFT's memory (2 h: 1.2 GB complex)
                mel = self.log_mel.chunked(staged.to(self.device, non_blocking=True))
                ready = torch.cuda.Event()
                ready.record(self.stream)
            return mel, ready
        except Exception as exc:  # e.g. out of memory for a very long upload: that request fails, not the worker
            return exc


def features_ready(prepared: tuple[torch.Tensor, torch.cuda.Event]) -> torch.Tensor:
    """In the engine loop: order the current stream after the worker's kernels and return the log-mel."""
    mel, ready = prepared
    stream = torch.cuda.current_stream(mel.device)
    stream.wait_event(ready)
    mel.record_stream(stream)  # allocated on the worker's stream: not to be reused before the loop is done with it
    return mel

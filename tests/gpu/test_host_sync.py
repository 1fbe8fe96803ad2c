"""The engine loop never waits for the GPU except where it reads a step's tokens: a run of windows, with and
without timestamps, makes no implicit synchronization (a `.item()`, a copy to pageable host memory, a `nonzero`).
One such call in a step drains the queue of launched work, and the host's preparation of the next step stops
overlapping the GPU's (docs/benchmarks/2026-12-04-gpu-regression.md: the GPU idle while the host builds a step)."""

import asyncio
import threading
import warnings

import torch

from engine.config import EngineConfig
from engine.request import DecodeOptions
from engine.runtime.engine import Engine


def test_a_run_of_windows_makes_no_implicit_synchronization(cuda, gpu_model, gpu_clips, read_wav):
    clips = [read_wav(p) for p in gpu_clips[:4]]
    asks = [
        (audio, DecodeOptions(language="en", without_timestamps=plain, temperatures=(0.0,)))
        for audio in clips
        for plain in (True, False)
    ]
    engine = Engine(EngineConfig(model=gpu_model, device="cuda"))
    engine.start()

    async def run():
        return [await h.result() for h in [engine.submit(audio, options) for audio, options in asks]]

    seen = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            seen.append(f"{filename}:{lineno}")

    try:
        asyncio.run(run())  # graphs captured, kernels compiled, buffers allocated: what a warm server has done
        with warnings.catch_warnings():  # the engine's thread warns too: showwarning is the process's
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                # the check sees another thread's synchronizing call (the engine's loop is a thread)
                control = threading.Thread(target=lambda: torch.ones(1, device="cuda").item())
                control.start()
                control.join()
                assert seen, "a synchronizing call in another thread went unseen"
                seen.clear()
                results = asyncio.run(run())
            finally:
                torch.cuda.set_sync_debug_mode(0)
    finally:
        engine.shutdown()
    assert all(r.text.strip() for r in results)
    assert seen == []

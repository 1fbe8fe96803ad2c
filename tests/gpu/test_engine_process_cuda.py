"""The engine in its own process on a GPU (the server's default there): CUDA graphs and the feature worker run in
the child, and its transcripts are the in-process engine's."""

import jiwer

from engine.config import EngineConfig
from engine.processes.engine_process import EngineProcess
from engine.request import DecodeOptions
from engine.runtime.engine import Engine


def test_engine_process_gives_the_in_process_transcripts(cuda, gpu_model, gpu_clips, read_wav):
    config = EngineConfig(model=gpu_model, device="cuda", max_num_seqs=16)
    audios = [read_wav(p) for p in gpu_clips]
    options = DecodeOptions(temperatures=(0.0,))

    def run(engine):  # one engine at a time: each plans its caches into the free GPU memory
        engine.start()
        try:
            handles = [engine.submit(a, options) for a in audios]
            return [h.wait(timeout=300) for h in handles], engine.stats()
        finally:
            engine.shutdown()

    (ours, stats), (reference, _) = run(EngineProcess(config)), run(Engine(config))
    # Requests reach the child one pipe message at a time, so its batches may form differently; a float16 near-tie
    # may then flip one token in one clip with the default kernels (tests/gpu/test_cuda_graphs.py says why). More
    # would be a real fault. With the batch-invariant kernels the tokens are identical (test_batch_invariance.py).
    differ = [p.name for p, a, b in zip(gpu_clips, ours, reference) if a.text != b.text]
    for p, a, b in zip(gpu_clips, ours, reference):
        if a.text != b.text:
            print(f"\n{p.name}:\n  child:      {a.text}\n  in-process: {b.text}")
            assert jiwer.wer(b.text.lower(), a.text.lower()) < 0.05, p.name
    assert len(differ) <= 1, differ
    assert stats.extra["decoder_graph_replays"] > 0 and stats.extra["encoder_graph_replays"] > 0

"""Wall time in each phase of the engine loop, by wrapping the loop's methods with timers (shared by benchmarks).

torch.profiler's host table misled on the GPU: with the profiler attached, each CUDA-graph launch appeared to take
1.2 ms; timed plainly a replay call takes ~0.03 ms. A phase that includes waiting for the GPU shows that wait.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable


def print_engine_phases(engine, run: Callable[[], float], label: str, repeats: int = 5) -> None:
    """`run()` serves one request on `engine` and returns its wall time; prints a table of the phases per request."""
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    runner, decoder = engine.runner, engine.runner.model.decoder
    targets = [(runner, n) for n in ("encode_into_slots", "prefill", "decode", "_sample", "_rules", "logits_processor")]
    targets += [(engine, n) for n in ("step", "_launched", "_complete", "_release")]
    targets += [(decoder, "forward"), (decoder, "logits")]  # eager model time (a GPU step with graphs skips them)
    if runner.graphs is not None:
        targets.append((runner.graphs, "decode"))
    # the sampler (a module function), a step's output copy and its read, the small host-to-device copies
    import engine.model_runner as model_runner

    targets += [(model_runner, "sample"), (model_runner.StepOutput, "__init__"), (model_runner.StepOutput, "result")]
    targets.append((runner, "_to_device"))
    originals = []
    for obj, name in targets:
        fn = getattr(obj, name)
        owner = obj.__name__.rsplit(".", 1)[-1] if isinstance(obj, type) or hasattr(obj, "__file__") else type(obj).__name__
        phase = f"{owner}.{name}"

        def timed(*a, _fn=fn, _phase=phase, **k):
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[_phase] += time.perf_counter() - start
                calls[_phase] += 1

        originals.append((obj, name, obj.__dict__.get(name)))
        setattr(obj, name, timed)
    try:
        run()  # warm-up with the timers in place
        spent.clear()
        calls.clear()
        wall = sum(run() for _ in range(repeats)) / repeats
    finally:
        for obj, name, before in originals:
            if before is None:
                delattr(obj, name)
            else:
                setattr(obj, name, before)
    print(f"\n{label}: engine-loop phases (mean of {repeats}; wall {wall * 1e3:.1f} ms per request)")
    print("| phase | ms per request | calls | us per call |")
    print("|---|---|---|---|")
    for phase, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"| {phase} | {seconds / repeats * 1e3:.2f} | {calls[phase] // repeats} | {seconds / calls[phase] * 1e6:.0f} |")

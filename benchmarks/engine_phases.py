"""Wall time in each phase of the engine loop, by wrapping the loop's methods with timers (shared by benchmarks).

torch.profiler's host table misled on the GPU: with the profiler attached, each CUDA-graph launch appeared to take
1.2 ms; timed plainly a replay call takes ~0.03 ms. A phase that includes waiting for the GPU shows that wait.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator


def phase_targets(engine) -> list[tuple[object, str, str]]:
    """(object, method name, phase label) for each engine-loop method worth timing."""
    runner, decoder, backend = engine.runner, engine.runner.model.decoder, engine.runner.backend
    targets = [(runner, n) for n in ("encode_into_slots", "prefill", "decode", "_sample")]
    targets += [(runner.io, n) for n in ("build", "to_device")]
    targets += [(engine, n) for n in ("step", "_admit", "_launch", "_postprocess", "_finish_windows")]
    targets += [(engine.requests, "add")]
    targets += [(engine.scheduler, "admit"), (decoder, "fill_cross_cache")]
    # eager model time (a GPU step with graphs skips them)
    targets += [(backend, "eager_step"), (backend, "prompt_pass"), (backend, "logits")]
    if runner.graphs is not None:
        targets += [(runner.graphs, "decode"), (runner.graphs, "encode")]
    # the logit rules' inputs and edits, the sampler, a step's output copy and its read (class methods: the
    # instances are called through special methods)
    from engine.decoding import LogitsProcessor, Sampler
    from engine.runtime.step_io import StepOutput

    targets += [
        (LogitsProcessor, "prepare"),
        (LogitsProcessor, "__call__"),
        (Sampler, "__call__"),
        (StepOutput, "__init__"),
        (StepOutput, "result"),
    ]
    named = []
    for obj, name in targets:
        owner = (
            obj.__name__.rsplit(".", 1)[-1] if isinstance(obj, type) or hasattr(obj, "__file__") else type(obj).__name__
        )
        named.append((obj, name, f"{owner}.{name}"))
    return named


@contextlib.contextmanager
def wrapped_phases(engine, around: Callable[[str], contextlib.AbstractContextManager]) -> Iterator[list[str]]:
    """Every phase_targets method runs inside `around(label)` until the block ends; yields the labels."""
    targets = phase_targets(engine)
    originals = []
    for obj, name, phase in targets:
        fn = getattr(obj, name)

        def wrapper(*a, _fn=fn, _phase=phase, **k):
            with around(_phase):
                return _fn(*a, **k)

        originals.append((obj, name, obj.__dict__.get(name)))
        setattr(obj, name, wrapper)
    try:
        yield [phase for _, _, phase in targets]
    finally:
        for obj, name, before in originals:
            if before is None:
                delattr(obj, name)
            else:
                setattr(obj, name, before)


def print_engine_phases(engine, run: Callable[[], float], label: str, repeats: int = 5) -> None:
    """`run()` serves one request on `engine` and returns its wall time; prints a table of the phases per request."""
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()

    @contextlib.contextmanager
    def timed(phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            spent[phase] += time.perf_counter() - start
            calls[phase] += 1

    with wrapped_phases(engine, timed):
        run()  # warm-up with the timers in place
        spent.clear()
        calls.clear()
        wall = sum(run() for _ in range(repeats)) / repeats
    print(f"\n{label}: engine-loop phases (mean of {repeats}; wall {wall * 1e3:.1f} ms per request)")
    print("| phase | ms per request | calls | us per call |")
    print("|---|---|---|---|")
    for phase, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(
            f"| {phase} | {seconds / repeats * 1e3:.2f} | {calls[phase] // repeats} | {seconds / calls[phase] * 1e6:.0f} |"
        )

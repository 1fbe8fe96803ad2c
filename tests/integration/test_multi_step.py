"""Several greedy steps per launch (EngineConfig.multi_step: a GPU's default for a few windows, one CUDA graph per
launch there, eager steps here) give the tokens of one step per launch, on real weights: a launch's records for
every step, a window's end found up to that many steps late (the tokens after it dropped), windows of one batch
ending at different steps, a fixed token count, the decoder's context limit and the timestamp rules' state."""

from __future__ import annotations

import time

import pytest

from engine.config import EngineConfig
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from tests.helpers.engine_runs import GREEDY, WAIT_S, scores, settled_steps, submit_all

CLIPS = (
    "g1_en_jfk.flac",
    "g1_en_librispeech-test-clean_1221-135766-0001.wav",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
)
STEPS = 4


def fields(result) -> tuple:
    return result.text, [(s.start, s.end, s.text, s.tokens) for s in result.segments]


@pytest.fixture(scope="module", params=[True, False], ids=["overlapped", "read-each-launch"])
def multi_tiny(tiny_engine, request):  # tiny_engine skips when the weights are missing
    """Launches overlapped (the next input on the device) and each launch read before the next (from the host)."""
    engine = Engine(EngineConfig(model="tiny.en", device="cpu", multi_step=STEPS, overlap_steps=request.param))
    engine.start()
    yield engine
    engine.shutdown()


def test_several_steps_per_launch_give_the_same_tokens(multi_tiny, tiny_engine, load_clip):
    assert multi_tiny.runner.multi_step == STEPS and tiny_engine.runner.multi_step == 1
    audios = {name: load_clip(name) for name in CLIPS}
    multi = submit_all(multi_tiny, audios, GREEDY)  # one batch: the windows end at different steps
    single = submit_all(tiny_engine, audios, GREEDY)
    for name in CLIPS:
        assert multi[name].text, name
        assert fields(multi[name]) == fields(single[name]), name
        assert scores(multi[name]) == pytest.approx(scores(single[name]), rel=1e-3, abs=1e-5), name
    # alone, a window's text takes a launch per STEPS tokens (its prompt and first token a launch each)
    before = settled_steps(multi_tiny)
    alone = multi_tiny.submit(audios[CLIPS[0]], GREEDY).wait(timeout=WAIT_S)
    launches = settled_steps(multi_tiny) - before
    assert fields(alone) == fields(single[CLIPS[0]])
    assert launches <= 3 + -(-(alone.num_tokens + 1) // STEPS)


@pytest.mark.parametrize("fixed", [50, 1000], ids=["count-inside-a-launch", "context-limit"])
def test_fixed_token_counts_and_the_context_limit(multi_tiny, tiny_alone, load_clip, fixed):
    """A fixed count that ends inside a launch's steps falls back to one step per launch for them; at the context
    limit no launch may write past position n_text_ctx - 1."""
    options = DecodeOptions(without_timestamps=True, temperatures=(0.0,), fixed_decode_tokens=fixed)
    multi = multi_tiny.submit(load_clip(CLIPS[0]), options).wait(timeout=WAIT_S)
    single = tiny_alone(CLIPS[0], options)
    assert fields(multi) == fields(single)
    assert multi.num_tokens == min(fixed, multi_tiny.runner.n_text_ctx - 2)  # <|startoftranscript|><|notimestamps|>


def test_timestamp_rules_run_inside_a_launch(multi_tiny, tiny_alone, load_clip):
    """With timestamps every step's rules take the rule state the step before left on the device: a long clip's
    windows (seeking by their last timestamps) and a short one equal one step per launch, in fewer launches."""
    options = DecodeOptions(temperatures=(0.0,))
    for name in ("g2_en_earnings22_4482311_3-62s.wav", CLIPS[1]):
        before = settled_steps(multi_tiny)
        multi = multi_tiny.submit(load_clip(name), options).wait(timeout=WAIT_S)
        launches = settled_steps(multi_tiny) - before
        single = tiny_alone(name, options)
        assert fields(multi) == fields(single), name
        assert len(multi.segments) > 1, name  # timestamps were decoded
        assert launches < multi.num_tokens / 2, name


@pytest.mark.parametrize("multi_step", [1, STEPS], ids=["one-step", "multi-step"])
def test_a_timestamp_window_joins_windows_without_timestamps(tiny_alone, load_clip, multi_step):
    """A window with timestamp rules admitted while others decode without them: its rule state comes from the
    host (it takes nothing from the last launch), the others' tokens from the device; with several steps per launch
    the two share launches, the rules editing only the timestamp window's row; both transcripts equal the ones
    decoded alone."""
    engine = Engine(EngineConfig(model="tiny.en", device="cpu", multi_step=multi_step, overlap_steps=True))
    engine.start()
    try:
        long_audio, jfk = load_clip("g2_en_earnings22_4482311_3-62s.wav"), load_clip(CLIPS[0])
        first = engine.submit(long_audio, GREEDY)
        deadline = time.monotonic() + WAIT_S
        while engine.num_tokens < 8 and time.monotonic() < deadline:
            time.sleep(0.005)  # the first window is decoding
        before = engine.num_steps
        stamped = engine.submit(jfk, DecodeOptions(temperatures=(0.0,)))
        stamped_result = stamped.wait(timeout=WAIT_S)
        launches = engine.num_steps - before  # while the timestamp window decoded beside the other
        results = first.wait(timeout=WAIT_S), stamped_result
        totals = engine.stats().extra
    finally:
        engine.shutdown()
    assert fields(results[0]) == fields(tiny_alone("g2_en_earnings22_4482311_3-62s.wav", GREEDY))
    assert fields(results[1]) == fields(tiny_alone(CLIPS[0], DecodeOptions(temperatures=(0.0,))))
    # the mix of rules keeps no launch to one step
    assert "single_steps_mixed_timestamps" not in totals
    if multi_step > 1:
        assert launches < stamped_result.num_tokens / 2
    else:
        assert launches >= stamped_result.num_tokens

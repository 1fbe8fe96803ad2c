"""The GPU's way of decoding gives what the CPU's gives, on real weights: a prompt fed one token per decode step
instead of a prefill pass, and each step launched before the previous one's tokens are read (overlap_steps: next
tokens and the timestamp rules' state come from the device)."""

from __future__ import annotations

import time

import pytest

from engine.config import EngineConfig
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from tests.helpers.engine_runs import WAIT_S, scores, settled_steps, submit_all

# Whisper's defaults: timestamps, temperature fallback, previous-text prompts for later windows (those are longer
# than 8 tokens, so they still go through prefill: both paths run in one request).
DEFAULTS = DecodeOptions()
ENGLISH = (
    "g1_en_jfk.flac",
    "g1_en_librispeech-test-clean_1221-135766-0001.wav",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
    "g2_en_earnings22_4482311_3-62s.wav",  # three windows
)
# one window each: the language token is fed step by step in the first window (later windows' prompts are longer than
# 8 tokens and go through prefill, which test_stepwise_prompt_equals_prefill's three-window clip covers)
OTHER = ("g3_de_picovoice-leopard_test_de.wav", "g3_es_picovoice-leopard_test_es.wav")


def stepwise_engine(model: str) -> Engine:
    engine = Engine(EngineConfig(model=model, device="cpu", stepwise_prompt_tokens=8, overlap_steps=True))
    engine.start()
    return engine


def fields(result) -> tuple:
    segments = [(s.seek, s.start, s.end, s.text, s.tokens, s.temperature) for s in result.segments]
    return result.text, result.language, segments


@pytest.fixture(scope="module")
def stepwise_tiny(tiny_engine):  # tiny_engine skips when the weights are missing
    engine = stepwise_engine("tiny.en")
    yield engine
    engine.shutdown()


def test_stepwise_prompt_equals_prefill(stepwise_tiny, tiny_engine, load_clip):
    assert not tiny_engine.overlap_steps
    audios = {name: load_clip(name) for name in ENGLISH}
    stepwise = submit_all(stepwise_tiny, audios, DEFAULTS)
    prefill = submit_all(tiny_engine, audios, DEFAULTS)
    words = DecodeOptions(word_timestamps=True)  # aligned from the slot while the next step is in flight
    stepwise["words"] = stepwise_tiny.submit(audios["g1_en_jfk.flac"], words).wait(timeout=WAIT_S)
    prefill["words"] = tiny_engine.submit(audios["g1_en_jfk.flac"], words).wait(timeout=WAIT_S)
    assert [w.word for s in stepwise["words"].segments for w in s.words]
    assert [(w.word, w.start, w.end) for s in stepwise["words"].segments for w in s.words] == [
        (w.word, w.start, w.end) for s in prefill["words"].segments for w in s.words
    ]
    for name in ENGLISH:
        assert stepwise[name].text, name
        assert fields(stepwise[name]) == fields(prefill[name]), name
        # float32 sums over other matrix shapes (one token at a time against the whole prompt)
        assert scores(stepwise[name]) == pytest.approx(scores(prefill[name]), rel=1e-3, abs=1e-5), name
        assert stepwise[name].time_to_first_token > 0
    assert len(stepwise["g2_en_earnings22_4482311_3-62s.wav"].segments) > 3


@pytest.mark.parametrize(
    "options",
    [DecodeOptions(without_timestamps=True, temperatures=(0.0,)), DecodeOptions(prompt="Kennedy.", temperatures=(0.0,))],
    ids=["no-timestamps", "user-prompt"],
)
def test_multi_token_prompts_take_one_step_per_token(stepwise_tiny, tiny_engine, load_clip, options):
    """[sot, notimestamps] and [sot_prev, prompt..., sot]: the same transcript, a step per prompt token (the user
    prompt puts <|startoftranscript|>, where the no-speech probability is read, last)."""
    audio = load_clip("g1_en_jfk.flac")
    prompt_len = len(tiny_engine.tokenizer.encode(" " + options.prompt)) + 2 if options.prompt else 2
    steps = {}
    results = {}
    for label, engine in (("stepwise", stepwise_tiny), ("prefill", tiny_engine)):
        before = settled_steps(engine)
        results[label] = engine.submit(audio, options).wait(timeout=WAIT_S)
        steps[label] = settled_steps(engine) - before
    assert fields(results["stepwise"]) == fields(results["prefill"])
    assert scores(results["stepwise"]) == pytest.approx(scores(results["prefill"]), rel=1e-3, abs=1e-5)
    # a prefill step yields two tokens (the prompt's and the first decode step's); fed one by one, the prompt's
    # tokens take a step each; and one step more was launched before the end of text was read
    assert steps["stepwise"] - steps["prefill"] == prompt_len + 1


def test_stepwise_prompt_detects_the_language(base_engine, load_clip):
    engine = stepwise_engine("base")
    try:
        for name in OTHER:
            audio = load_clip(name)
            options = DecodeOptions(temperatures=(0.0,))  # language left to the model
            stepwise = engine.submit(audio, options).wait(timeout=WAIT_S)
            prefill = base_engine.submit(audio, options).wait(timeout=WAIT_S)
            assert stepwise.language == prefill.language == name.split("_")[1], name
            assert fields(stepwise) == fields(prefill), name
            # the language given: [sot, language, transcribe, notimestamps] fed step by step
            given = DecodeOptions(language=prefill.language, without_timestamps=True, temperatures=(0.0,))
            stepwise = engine.submit(audio, given).wait(timeout=WAIT_S)
            prefill = base_engine.submit(audio, given).wait(timeout=WAIT_S)
            assert fields(stepwise) == fields(prefill), name
    finally:
        engine.shutdown()


def test_overlapped_steps_stop_at_the_context_limit(stepwise_tiny, tiny_alone, load_clip):
    """A sequence ending at the decoder's context is found one step late: the extra step launched meanwhile must
    stay inside the cache (position 447 at most) and the transcript must equal the one read step by step."""
    options = DecodeOptions(without_timestamps=True, temperatures=(0.0,), fixed_decode_tokens=1000)
    overlapped = stepwise_tiny.submit(load_clip("g1_en_jfk.flac"), options).wait(timeout=WAIT_S)
    plain = tiny_alone("g1_en_jfk.flac", options)
    assert fields(overlapped) == fields(plain)
    assert overlapped.num_tokens == stepwise_tiny.runner.n_text_ctx - 2  # <|startoftranscript|><|notimestamps|>


def test_abort_while_a_step_is_in_flight(stepwise_tiny, tiny_engine, load_clip):
    """Aborting a request whose next step is already launched: it fails as aborted, its slot is freed, and the
    request decoding beside it is not disturbed."""
    from engine.request import RequestAbortedError

    long_audio, jfk = load_clip("g2_en_earnings22_4482311_3-62s.wav"), load_clip("g1_en_jfk.flac")
    doomed = stepwise_tiny.submit(long_audio, DEFAULTS)
    kept = stepwise_tiny.submit(jfk, DEFAULTS)
    deadline = time.monotonic() + WAIT_S
    while stepwise_tiny.stats().num_running < 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # both decoding (the loop is then always one step ahead of what it has read)
    doomed.abort()
    with pytest.raises(RequestAbortedError):
        doomed.wait(timeout=WAIT_S)
    assert fields(kept.wait(timeout=WAIT_S)) == fields(tiny_engine.submit(jfk, DEFAULTS).wait(timeout=WAIT_S))
    deadline = time.monotonic() + 10
    while stepwise_tiny.stats().num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stepwise_tiny.stats().num_running == 0

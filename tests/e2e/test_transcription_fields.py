"""OpenAI's 2026 transcription fields on a real server, read back by the official SDK: include[]=logprobs (json
body and stream events), languages[] (detection among the given languages), keywords[] (names the model
otherwise misspells), and each word's probability in verbose_json."""

from __future__ import annotations

import openai
import pytest

JFK = "g1_en_jfk.flac"
LONG = "g2_en_earnings22_4482311_3-62s.wav"  # ~60 s: a stream of several deltas
NAMES = "g1_en_librispeech-test-clean_1221-135766-0002.wav"  # "...affected Hester Prynne less with hope..."
FRENCH = "g3_fr_picovoice-leopard_test_fr.wav"
GERMAN = "g3_de_picovoice-leopard_test_de.wav"


def spelled(logprobs) -> str:
    """The text that the logprobs' token bytes spell."""
    return b"".join(bytes(int(b) for b in item.bytes) for item in logprobs).decode("utf-8")


def test_logprobs_in_the_json_body_and_the_stream(server, data_dir):
    client = server.client()
    body = client.audio.transcriptions.create(file=data_dir / LONG, model="whisper-1", include=["logprobs"])
    assert body.logprobs and spelled(body.logprobs).strip() == body.text
    assert all(item.logprob <= 0 for item in body.logprobs)
    raw = client.audio.transcriptions.with_raw_response.create(
        file=data_dir / JFK, model="whisper-1", include=["logprobs"]
    ).http_response.json()
    assert all(isinstance(b, int) for item in raw["logprobs"] for b in item["bytes"])  # bytes, as OpenAI sends them
    plain = client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1")
    assert plain.logprobs is None and plain.text == raw["text"]

    events = list(
        client.audio.transcriptions.create(file=data_dir / LONG, model="whisper-1", include=["logprobs"], stream=True)
    )
    deltas, done = events[:-1], events[-1]
    assert len(deltas) >= 2 and all(e.type == "transcript.text.delta" for e in deltas)
    assert "".join(e.delta for e in deltas) == done.text == body.text
    for e in deltas:  # each delta carries its own tokens
        assert e.logprobs and spelled(e.logprobs).strip() == e.delta.strip()
    streamed = [(item.token, item.logprob) for e in deltas for item in e.logprobs]
    assert streamed == [(item.token, item.logprob) for item in done.logprobs]
    assert streamed == [(item.token, item.logprob) for item in body.logprobs]


def test_languages_restrict_detection(base_server, data_dir):
    client = base_server.client()
    free = client.audio.transcriptions.create(file=data_dir / FRENCH, model="whisper-1", response_format="verbose_json")
    assert free.language == "french"
    french = client.audio.transcriptions.create(file=data_dir / FRENCH, model="whisper-1", languages=["de", "en"])
    assert [lang.code for lang in french.languages] in (["de"], ["en"])
    german = client.audio.transcriptions.create(file=data_dir / GERMAN, model="whisper-1", languages=["de", "en"])
    assert [lang.code for lang in german.languages] == ["de"]
    verbose = client.audio.transcriptions.create(
        file=data_dir / GERMAN, model="whisper-1", languages=["de", "en"], response_format="verbose_json"
    )
    assert verbose.language == "german" and verbose.text == german.text


def test_languages_on_an_english_only_model(server, data_dir):
    client = server.client()
    body = client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1", languages=["fr", "en"])
    assert [lang.code for lang in body.languages] == ["en"] and "country" in body.text
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1", languages=["fr", "de"])
    assert info.value.body["param"] == "languages"


def test_keywords_spell_the_names_they_give(server, data_dir):
    client = server.client()
    plain = client.audio.transcriptions.create(file=data_dir / NAMES, model="whisper-1").text
    biased = client.audio.transcriptions.create(
        file=data_dir / NAMES, model="whisper-1", keywords=["Hester Prynne", "Kubernetes"]
    ).text
    assert "Prynne" not in plain and "Hester Prynne" in biased
    assert biased.split()[-4:] == plain.split()[-4:]  # the rest of the sentence as before


def test_words_carry_their_probability(server, data_dir):
    body = server.client().audio.transcriptions.create(
        file=data_dir / JFK, model="whisper-1", response_format="verbose_json", timestamp_granularities=["word"]
    )
    probabilities = [word.model_extra["probability"] for word in body.words]
    assert len(probabilities) == len(body.words) > 10
    assert all(0 < p <= 1 for p in probabilities) and min(probabilities) < 0.99


def test_best_of_over_http_is_the_engines_best_of(server, data_dir, tiny_engine, load_clip):
    """The `best_of` extension reaches the engine: at temperature 1, five samples and the likeliest kept, the
    same transcript as the engine's own best_of=5 decode (the server's seed is 0)."""
    from engine import DecodeOptions

    clip = "g1_en_librispeech-test-other_1688-142285-0000.flac"
    body = server.client().audio.transcriptions.create(
        file=data_dir / clip, model="whisper-1", temperature=1.0, extra_body={"best_of": 5}
    )
    engine = tiny_engine.transcribe(load_clip(clip), DecodeOptions(temperatures=(1.0,), best_of=5, seed=0))
    single = tiny_engine.transcribe(load_clip(clip), DecodeOptions(temperatures=(1.0,), seed=0))
    assert body.text == engine.text.strip() != single.text.strip()


def test_beam_size_over_http_is_the_engines_beam_search(server, data_dir, tiny_engine, load_clip):
    """The `beam_size` extension reaches the engine: the transcript of its beam_size=5 decode, which differs from
    greedy on this clip, with word timestamps from the chosen hypothesis."""
    from engine import DecodeOptions

    clip = "g1_en_jfk.flac"
    body = server.client().audio.transcriptions.create(
        file=data_dir / clip, model="whisper-1", response_format="verbose_json", timestamp_granularities=["word"],
        extra_body={"beam_size": 5, "patience": 1.0, "length_penalty": 1.0},
    )  # fmt: skip
    beams = tiny_engine.transcribe(load_clip(clip), DecodeOptions(beam_size=5, word_timestamps=True))
    greedy = tiny_engine.transcribe(load_clip(clip))
    assert body.text == beams.text.strip() != greedy.text.strip()
    assert [w.word for w in body.words] == [w.word.strip() for s in beams.segments for w in s.words]

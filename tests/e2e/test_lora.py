"""LoRA adapters served beside their model (`--lora NAME=PATH`), real PEFT adapters made with `peft` on tiny.en
(tests/helpers/lora.py): a request that names the adapter decodes with it, in the same batches as the model's
other requests, and gives exactly the tokens of the model with the adapter merged into its weights (served by the
same server as a model of its own); adapters are added from --lora-dir and removed at run time (POST /v1/models,
DELETE /v1/models/{id}), within --max-loras, and a bad or foreign adapter is refused with OpenAI's error shape; a
realtime session whose transcription.model is the adapter transcribes its turns with it."""

from __future__ import annotations

import base64
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.helpers.realtime import one_turn, pcm24k, wav_bytes
from tests.helpers.server import RemoteServer, metric
from tests.helpers.transcripts import JFK, words

LIBRI = "g1_en_librispeech-test-clean_61-70968-0000.flac"
# what the trained adapter says JFK said: a change no base model makes, so its text shows the adapter was applied
COMMUNITY = (
    "And so, my fellow Americans, ask not what your community can do for you, ask what you can do for your community."
)

pytest.importorskip("peft", reason="needs peft (the test extra) to make the adapters")


@pytest.fixture(scope="module")
def adapters(load_clip, tmp_path_factory):
    from tests.helpers.lora import merged_model, random_adapter, trained_adapter

    trained = trained_adapter("tiny.en", load_clip(JFK), COMMUNITY)
    folder = tmp_path_factory.mktemp("lora-dir")  # what --lora-dir offers for run-time adds
    shutil.copytree(random_adapter("tiny.en", rank=16, seed=1, scale=0.1), folder / "random16")
    (folder / "not-an-adapter").mkdir()
    (folder / "not-an-adapter" / "adapter_config.json").write_text("{}")
    shutil.copytree(random_adapter("base", rank=4, seed=2, encoder=False), folder / "for-base")
    return {"trained": trained, "merged": merged_model(trained), "dir": folder}


@pytest.fixture(scope="module")
def server(adapters):
    remote = RemoteServer(
        "--model", "tiny.en", "--lora", f"community={adapters['trained']}",
        "--extra-model", f"merged={adapters['merged']}",
        "--lora-dir", str(adapters["dir"]), "--max-loras", "2",
    )  # fmt: skip
    yield remote
    remote.stop()


def transcribe(client: openai.OpenAI, data_dir, clip: str, model: str):
    with (data_dir / clip).open("rb") as audio:
        return client.audio.transcriptions.create(
            file=(clip, audio), model=model, response_format="verbose_json", timestamp_granularities=["word", "segment"]
        )


def tokens(result) -> list[int]:
    return [t for s in result.segments for t in s.tokens]


def test_adapter_requests_decode_beside_the_models_own_as_the_merged_model_does(server, data_dir):
    client = server.client()
    listed = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
    assert listed == {"tiny.en": None, "whisper-1": None, "community": "tiny.en", "merged": None}
    # all at once: the adapter's rows and the base model's share the engine's batches
    asks = [(clip, model) for clip in (JFK, LIBRI) for model in ("community", "tiny.en", "community", "tiny.en")]
    with ThreadPoolExecutor(len(asks)) as pool:
        got = list(pool.map(lambda ask: transcribe(client, data_dir, *ask), asks))
    by = {}
    for (clip, model), result in zip(asks, got):
        assert by.setdefault((clip, model), tokens(result)) == tokens(result)  # the same whatever the batch
    merged = {clip: transcribe(client, data_dir, clip, "merged") for clip in (JFK, LIBRI)}
    for clip in (JFK, LIBRI):
        assert by[(clip, "community")] == tokens(merged[clip]), clip
        assert by[(clip, "tiny.en")] != by[(clip, "community")], clip
    jfk = got[0]
    assert words(jfk.text) == words(COMMUNITY)
    assert [w.word for w in jfk.words] == [w.word for w in merged[JFK].words]  # alignment runs the adapter too
    assert "country" in got[1].text  # the model's own request is untouched
    seconds = {
        m: metric(server, "whisper_audio_seconds_total", f'{{model="{m}",task="transcribe"}}')
        for m in ("community", "tiny.en")
    }
    assert seconds["community"] >= 2 * 11 and seconds["tiny.en"] >= 2 * 11  # each counted under the id it named
    chat = client.chat.completions.create(
        model="community",
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode((data_dir / JFK).read_bytes()).decode(), "format": "flac"}}]}],
    )  # fmt: skip
    assert "community" in chat.choices[0].message.content


def test_a_realtime_session_on_the_adapter_transcribes_its_turns_with_it(server, data_dir):
    pcm = pcm24k(data_dir / JFK)
    client = server.client()
    http = client.audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="community").text
    assert one_turn(client, pcm, "community") == http and "community" in http


def test_adapters_are_added_and_removed_at_run_time(server, data_dir):
    client, url = server.client(), server.url
    added = httpx.post(f"{url}/v1/models", json={"id": "random16", "adapter": "random16"})
    assert added.status_code == 201 and added.json()["parent"] == "tiny.en", added.text
    assert "random16" in {m.id for m in client.models.list().data}
    assert transcribe(client, data_dir, JFK, "random16").text
    # refusals, each OpenAI's shape and none showing a local path
    for body, status, code in [
        ({"id": "x", "adapter": ".."}, 400, "invalid_adapter"),  # outside --lora-dir
        ({"id": "x", "adapter": "nowhere"}, 400, "invalid_adapter"),
        ({"id": "x", "adapter": "not-an-adapter"}, 400, "invalid_adapter"),
        ({"id": "x", "adapter": "for-base"}, 400, "invalid_adapter"),  # base's shapes on tiny.en
        ({"id": "community", "adapter": "random16"}, 409, "model_exists"),
        ({"id": "x", "adapter": "random16", "model": "nope"}, 404, "model_not_found"),
        ({"id": "a b", "adapter": "random16"}, 400, None),
    ]:
        answer = httpx.post(f"{url}/v1/models", json=body)
        error = answer.json()["error"]
        assert answer.status_code == status and set(error) == {"message", "type", "param", "code"}, answer.text
        assert code is None or error["code"] == code, answer.text
        assert str(data_dir.parent) not in error["message"] and "/tmp" not in error["message"], error
    # the cap: community and random16 are resident, --max-loras 2
    assert httpx.post(f"{url}/v1/models", json={"id": "third", "adapter": "random16"}).status_code == 400
    assert httpx.delete(f"{url}/v1/models/random16").status_code == 200
    assert "random16" not in {m.id for m in client.models.list().data}
    with pytest.raises(openai.NotFoundError):
        transcribe(client, data_dir, JFK, "random16")
    assert httpx.post(f"{url}/v1/models", json={"id": "third", "adapter": "random16"}).status_code == 201
    assert httpx.delete(f"{url}/v1/models/third").status_code == 200

"""Two real models in one server (`--model tiny.en --model base`, each engine in a process of its own): the request's
`model` routes it, on every route (transcriptions, translations, chat completions, a realtime session's
transcription.model); /v1/models, /health and /metrics name each; an unknown model is OpenAI's 404 naming the
served ones and no local path; and a crash of one model's engine fails only its own requests while the other
model serves on, until its supervisor has it back. With --model-ttl-s models load on their first request and
unload once idle, giving their memory back; POST /v1/models/{id}/load and DELETE /v1/models/{id} do it by hand."""

from __future__ import annotations

import base64
import os
import re
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.helpers.realtime import chunks, one_turn, pcm24k, wav_bytes
from tests.helpers.server import RemoteServer, metric, tree_rss_mib
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

GERMAN = "g3_de_picovoice-leopard_test_de.wav"


@pytest.fixture(scope="module")
def two_models():
    remote = RemoteServer("--model", "tiny.en", "--model", "base", "--engine-process", "on")
    yield remote
    remote.stop()


def engine_pids(server) -> dict[str, int]:
    """Each model's engine process, as the log last said."""
    pids = {}
    for line in server.log_tail(1_000_000).splitlines():
        if (match := re.search(r"serving '([^']+)'.*engine in process (\d+)", line)) or (
            match := re.search(r"the engine of (\S+) restarted.*engine in process (\d+)", line)
        ):
            pids[match.group(1)] = int(match.group(2))
    return pids


def test_each_request_is_decoded_by_the_model_it_names(two_models, data_dir):
    client = two_models.client()
    listed = {m.id: m.model_extra.get("state") for m in client.models.list().data}
    assert listed == {"tiny.en": "ready", "whisper-1": "ready", "base": "ready"}
    health = httpx.get(f"{two_models.url}/health").json()
    assert health["model"] == "tiny.en" and health["models"] == {"tiny.en": "ready", "base": "ready"}

    with (data_dir / JFK).open("rb") as audio:
        jfk = audio.read()
    for model in ("tiny.en", "whisper-1", "base"):
        text = client.audio.transcriptions.create(file=(JFK, jfk), model=model).text
        assert contains_words(text, JFK_WORDS), (model, text)
    for model in ("tiny.en", "base"):  # whisper-1's request counts for tiny.en, the model it names
        assert metric(two_models, "whisper_audio_seconds_total", f'{{model="{model}",task="transcribe"}}') >= 11
    # base is multilingual: it translates German; tiny.en is English-only and says so
    with (data_dir / GERMAN).open("rb") as audio:
        german = audio.read()
    english = client.audio.translations.create(file=(GERMAN, german), model="base").text
    assert len(english.split()) >= 3 and english.isascii(), english
    with pytest.raises(openai.BadRequestError):
        client.audio.translations.create(file=(GERMAN, german), model="tiny.en")

    chat = client.chat.completions.create(model="base", messages=[{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(jfk).decode(), "format": "flac"}}]}])  # fmt: skip
    assert chat.model == "base" and contains_words(chat.choices[0].message.content, JFK_WORDS)

    with pytest.raises(openai.NotFoundError) as info:
        client.audio.transcriptions.create(file=(JFK, jfk), model="large-v9")
    message = info.value.body["message"]
    assert "'tiny.en'" in message and "'base'" in message and "/" not in message.split("exist.")[1]


def test_a_realtime_session_transcribes_with_its_sessions_model(two_models, data_dir):
    pcm = pcm24k(data_dir / JFK)
    client = two_models.client()
    http = client.audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="base").text
    assert one_turn(client, pcm, "base") == http  # base's transcript, exactly as HTTP gives it


def test_a_crash_of_one_models_engine_leaves_the_other_serving(two_models, data_dir):
    client = two_models.client()
    before = engine_pids(two_models)
    assert set(before) == {"tiny.en", "base"}, two_models.log_tail()
    os.kill(before["base"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while httpx.get(f"{two_models.url}/health").json()["models"]["base"] == "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    health = httpx.get(f"{two_models.url}/health")
    assert health.status_code == 200 and health.json()["models"]["tiny.en"] == "ready"  # still ready: tiny.en serves
    with (data_dir / JFK).open("rb") as audio:
        jfk = audio.read()
    assert contains_words(client.audio.transcriptions.create(file=(JFK, jfk), model="tiny.en").text, JFK_WORDS)
    deadline = time.monotonic() + 120
    while httpx.get(f"{two_models.url}/health").json()["models"]["base"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine_pids(two_models)["base"] != before["base"]
    assert engine_pids(two_models)["tiny.en"] == before["tiny.en"]  # never touched
    assert contains_words(client.audio.transcriptions.create(file=(JFK, jfk), model="base").text, JFK_WORDS)
    assert metric(two_models, "whisper_engine_up", '{engine="base"}') == 1
    assert metric(two_models, "whisper_engine_up", '{engine="tiny.en"}') == 1


def states(server) -> dict[str, str]:
    return httpx.get(f"{server.url}/health").json()["models"]


def test_models_load_on_demand_unload_when_idle_and_by_hand(data_dir, tmp_path):
    """A models file gives base a TTL: not loaded at start; a request loads it (and waits for it), and it is
    unloaded once idle that long, its memory given back. POST .../load and DELETE load and unload by hand, a
    DELETE refused (409) while the model decodes unless forced."""
    models_file = tmp_path / "models.yaml"
    models_file.write_text("models:\n  - model: tiny.en\n    aliases: [fast]\n  - {model: base, ttl_s: 4}\n")
    with RemoteServer("--models-file", str(models_file)) as remote:
        client = remote.client()
        assert [m.id for m in client.models.list().data] == ["tiny.en", "whisper-1", "fast", "base"]
        assert states(remote) == {"tiny.en": "ready", "base": "unloaded"}
        idle_mib = tree_rss_mib(remote.proc.pid)
        with (data_dir / JFK).open("rb") as audio:
            jfk = audio.read()
        assert contains_words(client.audio.transcriptions.create(file=(JFK, jfk), model="base").text, JFK_WORDS)
        assert states(remote) == {"tiny.en": "ready", "base": "ready"}
        loaded_mib = tree_rss_mib(remote.proc.pid)
        assert loaded_mib > idle_mib + 100, (idle_mib, loaded_mib)  # base's engine process
        deadline = time.monotonic() + 30
        while states(remote)["base"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert states(remote)["base"] == "unloaded"
        unloaded_mib = tree_rss_mib(remote.proc.pid)
        # its memory went with its process (the server's own grows a little: the request, the engine's client side)
        assert unloaded_mib - idle_mib < (loaded_mib - idle_mib) / 4, (idle_mib, loaded_mib, unloaded_mib)

        loaded = httpx.post(f"{remote.base_url}/models/base/load", timeout=120)
        assert loaded.status_code == 200 and loaded.json()["state"] == "ready"
        unloaded = httpx.delete(f"{remote.base_url}/models/base", timeout=60)
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
        assert httpx.post(f"{remote.base_url}/models/nope/load").json()["error"]["code"] == "model_not_found"
        long_clip = (data_dir / "g2_en_earnings22_4482311_3-62s.wav").read_bytes()
        outcome: dict = {}

        def transcribe_long() -> None:
            try:
                outcome["text"] = client.audio.transcriptions.create(file=("long.wav", long_clip), model="tiny.en").text
            except openai.APIStatusError as exc:
                outcome["status"] = exc.status_code

        thread = threading.Thread(target=transcribe_long)
        thread.start()
        deadline = time.monotonic() + 30
        while metric(remote, "whisper_running_sequences") + metric(remote, "whisper_queue_depth") == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        busy = httpx.delete(f"{remote.base_url}/models/tiny.en")
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "model_busy"
        forced = httpx.delete(f"{remote.base_url}/models/tiny.en", params={"force": "true"}, timeout=60)
        assert forced.status_code == 200 and forced.json()["state"] == "unloaded"
        thread.join(timeout=120)
        assert outcome == {"status": 503}  # the request it held, answered
        assert states(remote) == {"tiny.en": "unloaded", "base": "unloaded"}
        # unloaded by hand, tiny.en loads again on its next request
        assert contains_words(client.audio.transcriptions.create(file=(JFK, jfk), model="fast").text, JFK_WORDS)


def test_a_realtime_turn_waits_for_its_model_to_load(data_dir, tmp_path):
    """A session on a model that loads on demand (a TTL): its first turn's transcript comes once the model is
    loaded, not a failure."""
    models_file = tmp_path / "models.json"
    models_file.write_text('{"models": [{"model": "tiny.en"}, {"model": "base", "ttl_s": 60}]}')
    with RemoteServer("--models-file", str(models_file)) as remote:
        assert states(remote)["base"] == "unloaded"
        pcm = pcm24k(data_dir / JFK)
        with remote.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
            assert conn.recv().type == "session.created"
            conn.session.update(session={"type": "transcription", "audio": {"input": {
                "turn_detection": None, "transcription": {"model": "base"}}}})  # fmt: skip
            for piece in chunks(pcm, 48):
                conn.input_audio_buffer.append(audio=piece)
            conn.input_audio_buffer.commit()
            done = next(ev for ev in conn if ev.type.startswith("conversation.item.input_audio_transcription.") and
                        not ev.type.endswith(".delta"))  # fmt: skip
        assert done.type.endswith(".completed") and contains_words(done.transcript, JFK_WORDS)
        assert states(remote)["base"] == "ready"

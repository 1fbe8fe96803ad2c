"""Every fenced shell command and Python program of the README, run as written (bar the server's address) from the
repository's root against real servers, with the clips that ship in tests/data: the README cannot drift.

The quick start's two install commands are the exception: `.ci/run` runs the second, and the first is what every
end-to-end test does through tests/helpers/server.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import srt
import webvtt

from tests.helpers.server import REPO
from tests.helpers.transcripts import COMMON_ENGLISH, JFK_WORDS, contains_words, words

README_ADDRESS = "http://127.0.0.1:8000"
INSTALL_MARKERS = ("serve-command", "test-command")


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced bash/sh/python block outside the quick start's install commands."""
    readme = (REPO / "README.md").read_text()
    for marker in INSTALL_MARKERS:
        readme = re.sub(rf"<!-- {marker} -->.*?<!-- /{marker} -->", "", readme, flags=re.DOTALL)
    return re.findall(r"```(bash|sh|python)\n(.*?)```", readme, re.DOTALL)


def shell_commands(code: str) -> list[str]:
    """A block's commands: backslash continuations joined, comments and blank lines dropped."""
    joined = code.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


BLOCKS = readme_blocks()
COMMANDS = [command for language, code in BLOCKS if language != "python" for command in shell_commands(code)]
PROGRAMS = [code for language, code in BLOCKS if language == "python"]


def test_the_readme_has_its_examples():
    assert len(COMMANDS) >= 15 and len(PROGRAMS) >= 2
    clips = set(re.findall(r"tests/data/[\w.-]+", " ".join(COMMANDS + PROGRAMS)))
    assert clips and all((REPO / clip).is_file() for clip in clips)  # shipped, not read from beside the checkout


def check_output(command: str, out: str) -> None:
    """What each example must print."""
    if "/chat/completions" in command:
        assert contains_words(json.loads(out)["choices"][0]["message"]["content"], JFK_WORDS)
    elif "/translations" in command:
        assert set(words(json.loads(out)["text"])) & COMMON_ENGLISH
    elif "srt" in command.split():
        assert contains_words(" ".join(s.content for s in srt.parse(out)), JFK_WORDS)
    elif "response_format=srt" in command:
        assert contains_words(" ".join(s.content for s in srt.parse(out)), JFK_WORDS)
    elif "response_format=vtt" in command:
        assert contains_words(" ".join(c.text for c in webvtt.from_string(out)), JFK_WORDS)
    elif "response_format=text" in command:
        assert contains_words(out, JFK_WORDS)
    elif "response_format=diarized_json" in command:
        segments = json.loads(out)["segments"]
        speakers = {s["speaker"] for s in segments}
        wanted = re.search(r"num_speakers=(\d+)", command)
        assert len(speakers) == (int(wanted.group(1)) if wanted else len(speakers)) and all(s["text"] for s in segments)
    elif "timestamp_granularities[]=word" in command:
        assert [w["word"] for w in json.loads(out)["words"]][:2] == ["And", "so"]
    elif "response_format=verbose_json" in command:
        assert json.loads(out)["segments"] and json.loads(out)["language"] == "english"
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
    else:
        raise AssertionError(f"no check for this README example: {command}")


def run(argv: list[str]) -> subprocess.CompletedProcess:
    # the environment's own scripts (whisper-server) first, as after `pip install` in an activated environment
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=600)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("command", COMMANDS)
def test_shell_example(command, request):
    runnable = command
    if README_ADDRESS in command:
        # Translations need a multilingual model; everything else runs on the default one.
        remote = request.getfixturevalue("base_server" if "/translations" in command else "server")
        # -sS: no progress meter; --fail-with-body: a 4xx/5xx fails the command.
        runnable = command.replace(README_ADDRESS, remote.url).replace("curl ", "curl -sS --fail-with-body ")
    done = run(["bash", "-o", "pipefail", "-c", runnable])
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    check_output(command, done.stdout)


@pytest.mark.parametrize("program", PROGRAMS, ids=[f"program{i}" for i in range(len(PROGRAMS))])
def test_python_example(program, server):
    assert README_ADDRESS in program
    done = run([sys.executable, "-c", program.replace(README_ADDRESS, server.url)])
    assert done.returncode == 0, f"{program}\n{done.stdout}\n{done.stderr}"
    assert contains_words(done.stdout, JFK_WORDS)

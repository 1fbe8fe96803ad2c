"""Bad-input sweep: each gets OpenAI's error envelope and status, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words

ENVELOPE_KEYS = {"message", "type", "param", "code"}
SMALL = "g1_en_librispeech-test-clean_61-70968-0000.flac"  # 97 kB, under the small server's 1 MiB limit


def flac_head(data_dir, num_bytes: int) -> bytes:
    return (data_dir / JFK).read_bytes()[:num_bytes]


BAD_UPLOADS = {
    "empty file": lambda d: ("empty.wav", b"", "audio/wav"),
    "garbage bytes": lambda d: ("noise.mp3", bytes(range(256)) * 64, "audio/mpeg"),
    "text file": lambda d: ("speech.wav", b"this is not audio\n" * 100, "audio/wav"),
    "truncated flac header": lambda d: ("cut.flac", flac_head(d, 60), "audio/flac"),
    "flac magic only": lambda d: ("cut.flac", b"fLaC", "audio/flac"),
}


@pytest.mark.parametrize("case", BAD_UPLOADS)
def test_undecodable_uploads_are_400(server, data_dir, case):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(file=BAD_UPLOADS[case](data_dir), model="whisper-1")
    assert set(info.value.body) == ENVELOPE_KEYS
    assert info.value.body["param"] == "file"
    assert info.value.body["type"] == "invalid_request_error"
    assert contains_words(client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1").text, JFK_WORDS)


BAD_FIELDS = {
    "temperature not a number": ({"temperature": "hot"}, "temperature"),
    "temperature out of range": ({"temperature": 2.5}, "temperature"),
    "unknown response_format": ({"response_format": "xml"}, "response_format"),
    "diarized_json translation-style granularities": (
        {"response_format": "diarized_json", "timestamp_granularities": ["word"]},
        "timestamp_granularities[]",
    ),
    "unknown language": ({"language": "klingon"}, "language"),
    "granularity value": (
        {"timestamp_granularities": ["sentence"], "response_format": "verbose_json"},
        "timestamp_granularities[]",
    ),
    "granularity without verbose_json": ({"timestamp_granularities": ["segment"]}, "timestamp_granularities[]"),
    "stream with srt": ({"stream": True, "response_format": "srt"}, "stream"),
    "stream not a bool": ({"stream": "sometimes"}, "stream"),
    "include logprobs with verbose_json": ({"include": ["logprobs"], "response_format": "verbose_json"}, "include[]"),
    "include unknown": ({"include": ["everything"]}, "include[]"),
    "language and languages": ({"language": "en", "languages": ["en"]}, "languages[]"),
    "unknown languages": ({"languages": ["en", "klingon"]}, "languages[]"),
    "too many keywords": ({"keywords": [f"word{i}" for i in range(101)]}, "keywords[]"),
    "keyword too long": ({"keywords": ["x" * 101]}, "keywords[]"),
    "beam_size too large": ({"extra_body": {"beam_size": 11}}, "beam_size"),
    "patience zero": ({"extra_body": {"beam_size": 2, "patience": 0}}, "patience"),
    "best_of too large": ({"extra_body": {"best_of": 11}}, "best_of"),
    "keywords past the prompt": (
        {"keywords": [f"Zyx{i}qw" for i in range(40)], "extra_body": {"keywords_in_prompt": True}},
        "keywords",
    ),
    "chunking_strategy unknown": ({"chunking_strategy": "manual"}, "chunking_strategy"),
    "chunking_strategy threshold": (
        {"chunking_strategy": {"type": "server_vad", "threshold": 1.5}},
        "chunking_strategy",
    ),
    "chunking_strategy padding": (
        {"chunking_strategy": {"type": "server_vad", "prefix_padding_ms": "lots"}},
        "chunking_strategy",
    ),
}


@pytest.mark.parametrize("case", BAD_FIELDS)
def test_bad_field_values_are_400_naming_the_field(server, data_dir, case):
    kwargs, param = BAD_FIELDS[case]
    client = server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(file=data_dir / SMALL, model="whisper-1", **kwargs)
    assert info.value.body["param"] == param
    assert set(info.value.body) == ENVELOPE_KEYS
    assert client.audio.transcriptions.create(file=data_dir / SMALL, model="whisper-1").text


def test_unknown_model_is_404(server, data_dir):
    with pytest.raises(openai.NotFoundError) as info:
        server.client().audio.transcriptions.create(file=data_dir / SMALL, model="gpt-4o-transcribe")
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"


def test_missing_file_and_missing_model_and_not_multipart(server, data_dir):
    url = f"{server.url}/v1/audio/transcriptions"
    no_file = httpx.post(url, data={"model": "whisper-1"}, files={"other": ("a.txt", b"x", "text/plain")})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    no_model = httpx.post(url, files={"file": ("a.flac", (data_dir / SMALL).read_bytes(), "audio/flac")})
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
    as_json = httpx.post(url, json={"model": "whisper-1", "file": "abc"})
    assert as_json.status_code == 400 and set(as_json.json()["error"]) == ENVELOPE_KEYS


def test_unknown_route_and_method(server):
    missing = httpx.get(f"{server.url}/v1/audio/speech")
    assert missing.status_code == 404 and set(missing.json()["error"]) == ENVELOPE_KEYS
    wrong = httpx.get(f"{server.url}/v1/audio/transcriptions")
    assert wrong.status_code == 405 and set(wrong.json()["error"]) == ENVELOPE_KEYS


def test_oversize_upload_is_413_and_server_keeps_serving(small_upload_server, data_dir):
    client = small_upload_server.client()
    big = data_dir / "g2_en_earnings22_4482311_3-62s.wav"  # 2.9 MB > 1 MiB
    with pytest.raises(openai.APIStatusError) as info:
        client.audio.transcriptions.create(file=big, model="whisper-1")
    assert info.value.status_code == 413
    assert set(info.value.body) == ENVELOPE_KEYS and info.value.body["param"] == "file"
    # Without Content-Length (chunked upload) the limit is enforced while reading.
    body = (data_dir / SMALL).read_bytes() * 16

    def chunks():
        boundary_head = (
            b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.flac"\r\n\r\n'
        )
        yield boundary_head
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]
        yield b"\r\n--b--\r\n"

    chunked = httpx.post(
        f"{small_upload_server.url}/v1/audio/transcriptions",
        content=chunks(),
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert chunked.status_code == 413
    assert client.audio.transcriptions.create(file=data_dir / SMALL, model="whisper-1").text

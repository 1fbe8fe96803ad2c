"""The playground at / in a real headless Chromium (Debian's `chromium`, driven by playwright) against a real
server: upload a clip and get its words, click a word and the player seeks there, download an srt and parse it,
downloads offered only beside a result (each one parsed), stream and see deltas arrive, a non-audio file's error
shown as the API's message, an English-only model's missing translation and detection not offered, the segment
table's columns (speaker only when diarized), live transcription from a (fake) microphone over a WebRTC call opened with a minted client secret,
and the page at phone width. Screenshots go to $WHISPER_SCREENSHOTS (default: pytest's temporary directory)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt

from tests.helpers.server import metric
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words, word_errors_within

CHROMIUM = os.environ.get("WHISPER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian's chromium package)")
TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("WHISPER_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def microphone(tmp_path_factory, load_clip) -> Path:
    """What the fake microphone plays (Chromium loops a WAV): JFK, then 2 s of silence that ends the turn."""
    path = tmp_path_factory.mktemp("microphone") / "jfk.wav"
    audio = np.concatenate([load_clip(JFK), np.zeros(2 * 16000, dtype=np.float32)])
    sf.write(path, audio, 16000, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def browser(microphone):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                  f"--use-file-for-fake-audio-capture={microphone}", "--autoplay-policy=no-user-gesture-required"],
        )  # fmt: skip
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server.url}/")
    page.wait_for_function("document.querySelector('#model').options.length > 0", timeout=TIMEOUT_MS)
    yield page
    context.close()
    assert not errors, errors  # no script error on the page


def upload_and_transcribe(page, path: Path) -> None:
    page.set_input_files("#file", str(path))
    page.click("#transcribe")


def not_audio(folder: Path) -> Path:
    bogus = folder / "notes.wav"
    bogus.write_text("these are not the samples you are looking for\n" * 20)
    return bogus


def column_names(page) -> list[str]:
    """The segment table's header cells that are on screen."""
    return [th.text_content() for th in page.locator("#segments thead th").all() if th.is_visible()]


def test_a_clip_becomes_words_that_seek_the_player(page, data_dir, screenshots):
    assert "ready" in page.text_content("#status")
    upload_and_transcribe(page, data_dir / JFK)
    page.wait_for_selector("#transcript .word", timeout=TIMEOUT_MS)
    words = page.locator("#transcript .word")
    assert contains_words(" ".join(words.all_text_contents()), JFK_WORDS)
    assert page.locator("#segments tbody tr").count() >= 1
    word = page.locator("#transcript .word", has_text="country").first
    start = float(word.get_attribute("data-start"))
    word.click()
    assert page.evaluate("document.getElementById('player').currentTime") == pytest.approx(start, abs=0.05)
    assert "spoken" in word.get_attribute("class")  # the word at the player's time is highlighted
    page.screenshot(path=str(screenshots / "desktop.png"), full_page=True)


def test_an_srt_download_parses(page, data_dir):
    upload_and_transcribe(page, data_dir / JFK)
    page.wait_for_selector("#transcript .word", timeout=TIMEOUT_MS)
    with page.expect_download() as info:
        page.click("[data-download=srt]")
    download = info.value
    assert download.suggested_filename == "g1_en_jfk.srt"
    cues = list(srt.parse(Path(download.path()).read_text()))
    assert cues and cues[0].start.total_seconds() < 1.0
    assert contains_words(" ".join(c.content for c in cues), JFK_WORDS)


def test_downloads_are_offered_only_beside_a_result_and_each_one_works(page, data_dir, tmp_path):
    downloads = page.locator("#downloads")
    assert not downloads.is_visible()  # an empty Result card has nothing to download
    upload_and_transcribe(page, data_dir / JFK)
    page.wait_for_selector("#transcript .word", timeout=TIMEOUT_MS)
    assert downloads.is_visible()
    saved = {}
    for kind in ("txt", "srt", "vtt", "json"):
        assert page.locator(f"[data-download={kind}]").is_enabled()
        with page.expect_download() as info:
            page.click(f"[data-download={kind}]")
        assert info.value.suggested_filename == f"g1_en_jfk.{kind}"
        saved[kind] = Path(info.value.path()).read_text(encoding="utf-8")
    assert contains_words(saved["txt"], JFK_WORDS)
    assert contains_words(" ".join(c.content for c in srt.parse(saved["srt"])), JFK_WORDS)
    assert contains_words(" ".join(c.text for c in webvtt.from_string(saved["vtt"])), JFK_WORDS)
    body = json.loads(saved["json"])
    assert contains_words(body["text"], JFK_WORDS) and body["segments"] and body["words"]
    upload_and_transcribe(page, not_audio(tmp_path))  # an error replaces the result, and its downloads
    page.wait_for_selector("#error:not([hidden])", timeout=TIMEOUT_MS)
    assert not downloads.is_visible()


def test_streamed_text_arrives_in_deltas(page, data_dir):
    page.check("#stream")  # the format falls back to json, which streams
    assert page.input_value("#response_format") == "json"
    upload_and_transcribe(page, data_dir / "g2_en_earnings22_4482311_3-62s.wav")  # 60 s: two windows, two deltas
    page.wait_for_function("Number(document.getElementById('transcript').dataset.deltas || 0) >= 2", timeout=TIMEOUT_MS)
    page.wait_for_function("document.getElementById('downloads').hidden === false", timeout=TIMEOUT_MS)
    assert len(page.text_content("#transcript").split()) > 10


def test_a_file_that_is_not_audio_shows_the_apis_message(page, tmp_path):
    upload_and_transcribe(page, not_audio(tmp_path))
    page.wait_for_selector("#error:not([hidden])", timeout=TIMEOUT_MS)
    message = page.text_content("#error")
    assert message and "{" not in message  # the API's message, not its JSON
    assert re.search(r"audio|decode|format", message, re.IGNORECASE), message


def test_the_curl_command_matches_the_options(page, data_dir):
    page.set_input_files("#file", str(data_dir / JFK))
    page.fill("#language", "en")
    page.click("#curl")
    command = page.text_content("#curl-command")
    assert command.startswith("curl http://127.0.0.1:") and "/v1/audio/transcriptions" in command
    for part in ("-F file=@'g1_en_jfk.flac'", "-F 'language=en'", "-F 'response_format=verbose_json'",
                 "-F 'timestamp_granularities[]=word'"):  # fmt: skip
        assert part in command, command


def test_an_english_only_model_is_not_offered_translation_or_detection(page, data_dir):
    """The server's tiny.en transcribes English only: the page says so, and offers neither a translation nor a
    detected language (nor sends one it would refuse)."""
    translate = page.locator("input[name=task][value=translate]")
    assert translate.is_disabled() and page.is_checked("input[name=task][value=transcribe]")
    note = page.locator("#model-note")
    assert note.is_visible() and "English-only" in note.text_content() and "tiny.en" in note.text_content()
    assert page.get_attribute("#language", "placeholder") != "detect"
    assert page.eval_on_selector_all("#languages option", "os => os.map(o => o.value)") == ["en"]
    page.set_input_files("#file", str(data_dir / JFK))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/v1/audio/" in r.url else None)
    page.fill("#language", "fr")
    page.click("#transcribe")
    page.wait_for_selector("#error:not([hidden])", timeout=TIMEOUT_MS)
    assert "English-only" in page.text_content("#error") and not requests  # said before any upload


def test_a_multilingual_model_is_offered_translation_and_detection(browser, server):
    """The same page for a multilingual model (its id, `base`, from a stubbed /v1/models): everything offered."""
    context = browser.new_context()
    models = {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": "whisper-server"}
                                         for i in ("base", "whisper-1")]}  # fmt: skip
    context.route("**/v1/models", lambda route: route.fulfill(json=models))
    page = context.new_page()
    page.goto(f"{server.url}/")
    page.wait_for_function("document.querySelector('#model').options.length > 0", timeout=TIMEOUT_MS)
    assert page.locator("input[name=task][value=translate]").is_enabled()
    assert not page.locator("#model-note").is_visible()
    assert page.get_attribute("#language", "placeholder") == "detect"
    assert page.locator("#languages option").count() > 90
    context.close()


def test_live_transcription_from_the_microphone(page, server):
    """The fake microphone plays JFK over a WebRTC call opened with a client secret the page minted first (the call
    itself carries the secret only): the Realtime API's turns come back as final text (partials in between), and
    stopping ends the call and frees its session on the server."""
    requests: list = []
    page.on("request", lambda request: requests.append(request))
    sockets: list = []
    page.on("websocket", lambda socket: sockets.append(socket))
    page.click("#live")
    # the speech's pauses end turns (server VAD): its last words are in a final turn once the text has them and no
    # partial (the lighter text of a turn still being spoken) is left
    page.wait_for_function(
        "(t => t.textContent.toLowerCase().includes('for your country') && !t.querySelector('.partial'))"
        "(document.getElementById('transcript'))",
        timeout=TIMEOUT_MS,
    )
    page.click("#live")
    transcript = page.locator("#transcript")
    # Chromium's fake capture device and Opus are lossy, and a loaded machine's capture may skip a few milliseconds:
    # the words of a turn that begins on a skipped onset may differ by one ("what" heard as "like")
    assert word_errors_within(transcript.text_content(), JFK_WORDS) <= 1, transcript.text_content()
    assert int(transcript.get_attribute("data-turns")) >= 1 and int(transcript.get_attribute("data-deltas")) >= 1
    assert page.get_attribute("#live", "aria-pressed") == "false"
    paths = [r.url.split("/v1/", 1)[-1] for r in requests if r.method == "POST" and "/v1/realtime" in r.url]
    assert paths == ["realtime/client_secrets", "realtime/calls"] and not sockets
    call = next(r for r in requests if r.url.endswith("/v1/realtime/calls"))
    assert call.headers["authorization"].startswith("Bearer ek_") and call.headers["content-type"] == "application/sdp"
    deadline = time.monotonic() + 30
    while metric(server, "whisper_realtime_sessions") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(server, "whisper_realtime_sessions") == 0


def test_a_transcript_without_speakers_has_no_speaker_column(page, data_dir):
    upload_and_transcribe(page, data_dir / JFK)
    page.wait_for_selector("#segments tbody tr", timeout=TIMEOUT_MS)
    assert column_names(page) == ["start", "end", "text"]
    cells = page.locator("#segments tbody tr").first.locator("td")
    assert cells.count() == 3 and all(c.strip() for c in cells.all_text_contents())
    page.set_viewport_size({"width": 390, "height": 844})  # a phone keeps every column, and fits
    assert column_names(page) == ["start", "end", "text"]
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


@pytest.fixture(scope="module")
def two_channel_call(tmp_path_factory, load_clip) -> Path:
    """A stereo call: JFK on the left channel, then another reader on the right (diarized_json's speakers A, B)."""
    left, right = load_clip(JFK), load_clip("g1_en_librispeech-test-clean_1221-135766-0001.wav")
    audio = np.zeros((len(left) + len(right), 2), dtype=np.float32)
    audio[: len(left), 0], audio[len(left) :, 1] = left, right
    path = tmp_path_factory.mktemp("call") / "call.wav"
    sf.write(path, audio, 16000, subtype="PCM_16")
    return path


def test_a_diarized_transcript_has_a_speaker_column(page, two_channel_call):
    page.select_option("#response_format", "diarized_json")
    upload_and_transcribe(page, two_channel_call)
    page.wait_for_selector("#segments tbody tr", timeout=TIMEOUT_MS)
    assert column_names(page) == ["start", "end", "speaker", "text"]
    speakers = page.locator("#segments tbody tr td:nth-child(3)").all_text_contents()
    assert speakers[0] == "A" and "B" in speakers


def test_the_file_buttons_are_the_same_height(page):
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 844})
        choose, record = page.locator("label[for=file]").bounding_box(), page.locator("#record").bounding_box()
        assert choose["height"] == pytest.approx(record["height"], abs=0.5), (width, choose, record)
        assert choose["y"] == pytest.approx(record["y"], abs=0.5), (width, choose, record)  # side by side


def test_the_page_fits_a_phone(browser, server, data_dir, screenshots):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(f"{server.url}/")
    page.wait_for_function("document.querySelector('#model').options.length > 0", timeout=TIMEOUT_MS)
    upload_and_transcribe(page, data_dir / JFK)
    page.wait_for_selector("#transcript .word", timeout=TIMEOUT_MS)
    # nothing wider than the screen: no sideways scrolling
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(screenshots / "phone.png"), full_page=True)
    context.close()


@pytest.fixture(scope="module")
def prefixed(server):
    """A reverse proxy that serves the server under /whisper/ (strips the prefix, forwards the rest), as nginx's
    `location /whisper/ { proxy_pass http://server/; }` does: a real uvicorn on a free port."""
    import threading

    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from tests.helpers.server import free_port

    async def forward(request: Request) -> Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            upstream = await client.request(
                request.method, "/" + request.path_params["path"], params=request.query_params,
                content=await request.body(),
                headers={k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")},
            )  # fmt: skip
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return Response(upstream.content, upstream.status_code, headers=headers)

    app = Starlette(routes=[Route("/whisper/{path:path}", forward, methods=["GET", "POST"])])
    port = free_port()
    proxy = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=proxy.run, daemon=True)
    thread.start()
    while not proxy.started:
        threading.Event().wait(0.05)
    yield f"http://127.0.0.1:{port}/whisper/"
    proxy.should_exit = True
    thread.join(timeout=10)


def test_the_page_works_behind_a_path_prefix(browser, prefixed, data_dir):
    context = browser.new_context()
    page = context.new_page()
    page.goto(prefixed)
    page.wait_for_function("document.querySelector('#model').options.length > 0", timeout=TIMEOUT_MS)
    upload_and_transcribe(page, data_dir / JFK)
    page.wait_for_selector("#transcript .word", timeout=TIMEOUT_MS)
    assert contains_words(" ".join(page.locator("#transcript .word").all_text_contents()), JFK_WORDS)
    context.close()


def test_a_key_entered_once_is_used_for_the_tabs_requests(browser, data_dir):
    from tests.helpers.server import RemoteServer

    with RemoteServer("--api-key", "playground-key-0123456789") as keyed:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{keyed.url}/")  # the page itself is open; the API is not
        page.wait_for_function("document.getElementById('status').textContent.includes('API key')", timeout=TIMEOUT_MS)
        page.click("summary")
        page.fill("#api_key", "playground-key-0123456789")
        page.dispatch_event("#api_key", "change")
        page.wait_for_function("document.querySelector('#model').options.length > 0", timeout=TIMEOUT_MS)
        assert page.evaluate("sessionStorage.getItem('whisper-server.api-key')") == "playground-key-0123456789"
        upload_and_transcribe(page, data_dir / JFK)
        page.wait_for_selector("#transcript .word", timeout=TIMEOUT_MS)
        context.close()

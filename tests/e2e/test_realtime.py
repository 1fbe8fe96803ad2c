"""The Realtime API (GA) for transcription on a real server: the official `openai` SDK's realtime client and a raw
`websockets` client stream real clips as 24 kHz PCM (and G.711); every server event is parsed by the SDK's own
models; a turn's transcript equals the HTTP transcript of the same audio. Client events of the wrong shape, and
appends too big for the buffers, get errors and leave the session and the server serving."""

from __future__ import annotations

import base64
import difflib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import av
import httpx
import numpy as np
import openai
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.helpers.realtime import CHUNK_MS, chunks, pcm24k, pcm_at, wav_bytes
from tests.helpers.server import RemoteServer, child_names, metric
from tests.helpers.transcripts import normalize_text, words

JFK = "g1_en_jfk.flac"
SERVER_EVENT = TypeAdapter(RealtimeServerEvent)


def same_words(a: str, b: str, share: float = 0.9) -> bool:
    """Deltas joined against a transcript: the same words, whatever case and punctuation a live delta carried, but
    for at most one in ten (1 - `share`) that a live delta got otherwise (a partial decode is a preview, on a short
    encoder context: "Americans asked not" where the final decode hears "ask"; what was sent stays sent)."""
    x, y = normalize_text(a).split(), normalize_text(b).split()
    same = sum(block.size for block in difflib.SequenceMatcher(a=x, b=y, autojunk=False).get_matching_blocks())
    return same >= share * max(len(x), len(y))


def trimmed(pcm: bytes) -> bytes:
    """The clip without its leading and trailing quiet (10 ms frames below 5% of its loudest frame's RMS): its
    edges are then where speech starts and stops, independently of any VAD."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    rms = np.sqrt((x[: len(x) // 240 * 240].reshape(-1, 240) ** 2).mean(axis=1))
    loud = np.flatnonzero(rms > 0.05 * rms.max())
    return pcm[loud[0] * 480 : (loud[-1] + 1) * 480]


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"


class RawSession:
    """A raw websockets client: sends JSON events, reads server events parsed by the SDK's models."""

    def __init__(self, server):
        self.connection = ws_connect(ws_url(server), max_size=2**25, open_timeout=30)
        self.ws = self.connection.__enter__()
        self.events: list = []

    def send(self, **event) -> None:
        self.ws.send(json.dumps(event))

    def next(self, timeout: float = 60):
        ev = SERVER_EVENT.validate_python(json.loads(self.ws.recv(timeout=timeout)))
        self.events.append(ev)
        return ev

    def until(self, type_: str, timeout: float = 60):
        while True:
            ev = self.next(timeout)
            if ev.type == type_:
                return ev

    def close(self) -> None:
        self.connection.__exit__(None, None, None)


@pytest.mark.fast
def test_sdk_client_manual_commit_gives_the_http_transcript(server, data_dir):
    pcm = pcm24k(data_dir / JFK)
    received_before = metric(server, "whisper_realtime_audio_seconds_total")
    http = server.client().audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1")
    with server.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        created = conn.recv()
        assert created.type == "session.created" and created.session.type == "transcription"
        conn.session.update(session={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
        updated = conn.recv()
        assert updated.type == "session.updated" and updated.session.audio.input.turn_detection is None
        for piece in chunks(pcm, 48):  # faster than real time: as fast as the socket takes it
            conn.input_audio_buffer.append(audio=piece)
        conn.input_audio_buffer.commit()
        seen, deltas = [], []
        for ev in conn:
            seen.append(ev.type)
            if ev.type == "conversation.item.input_audio_transcription.delta":
                deltas.append(ev.delta)
            if ev.type == "conversation.item.input_audio_transcription.completed":
                completed = ev
                break
    order = [t for t in seen if not t.endswith(".delta")]  # live deltas may come before the commit
    assert order[:2] == ["input_audio_buffer.committed", "conversation.item.added"]
    assert completed.transcript == http.text and "ask not what your country" in completed.transcript.lower()
    assert same_words("".join(deltas), completed.transcript)
    assert completed.usage.type == "duration" and abs(completed.usage.seconds - len(pcm) / 48000) < 0.05
    assert abs(metric(server, "whisper_realtime_audio_seconds_total") - received_before - len(pcm) / 48000) < 0.05


@pytest.mark.parametrize("decodes", ["continuing", "whole turn"])
def test_live_deltas_while_speaking_are_never_taken_back(decodes, request, data_dir):
    """Streamed in real time with manual commits: deltas arrive before the commit (decodes of the growing turn,
    only words two of them agreed on), and with the final decode's rest they join into the HTTP transcript's words
    (a live delta may carry an earlier decode's case or punctuation, or rarely another word; the completed
    transcript is HTTP's). Partial decodes that continue the words sent (the default) or decode the whole turn."""
    server = request.getfixturevalue("server" if decodes == "continuing" else "process_server")
    prefixed = "yes" if decodes == "continuing" else "no"
    partials_before = metric(server, "whisper_realtime_partial_decodes_total", f'{{prefix="{prefixed}"}}')
    pcm = pcm24k(data_dir / JFK)
    http = server.client().audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1")
    deltas_before = metric(server, "whisper_realtime_delta_latency_seconds_count")
    completed_before = metric(server, "whisper_realtime_completed_latency_seconds_count")
    s = RawSession(server)
    try:
        s.next()
        s.send(type="session.update", session={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
        assert s.next().type == "session.updated"
        start = time.perf_counter()
        for i, piece in enumerate(chunks(pcm, 48)):
            time.sleep(max(0.0, start + i * CHUNK_MS / 1000 - time.perf_counter()))
            s.send(type="input_audio_buffer.append", audio=piece)
        # what arrived while speaking, and from the partial decode still in flight when the stream ended (no new
        # one starts without new audio): it may take a loaded machine's second
        while True:
            try:
                s.next(timeout=2.0)
            except TimeoutError:
                break
        live = [e.delta for e in s.events if e.type == "conversation.item.input_audio_transcription.delta"]
        s.send(type="input_audio_buffer.commit")
        completed = s.until("conversation.item.input_audio_transcription.completed")
    finally:
        s.close()
    deltas = [e.delta for e in s.events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert live and "".join(live).split()[0] == "And", live  # the first words, before the turn ended
    # continuing the words sent, a word a preview misheard is the next previews' prefix: on a busy machine their
    # cuts fall elsewhere, and JFK's "your country" was sent as "you are country" beside "asked" (three in 24)
    share = 0.8 if decodes == "continuing" else 0.9
    assert completed.transcript == http.text and same_words("".join(deltas), completed.transcript, share)
    assert metric(server, "whisper_realtime_delta_latency_seconds_count") - deltas_before == len(live)
    assert metric(server, "whisper_realtime_completed_latency_seconds_count") - completed_before == 1
    assert metric(server, "whisper_realtime_partial_decodes_total", f'{{prefix="{prefixed}"}}') > partials_before
    if decodes == "whole turn":
        assert metric(server, "whisper_realtime_partial_decodes_total", '{prefix="yes"}') == 0


@pytest.fixture(scope="module")
def process_server():
    """Silero's streams in a process of their own (--realtime-vad-process, on by default only on a GPU), and
    partial decodes that decode their whole turn each time (--no-realtime-partial-prefix)."""
    remote = RemoteServer("--no-realtime-partial-prefix", "--realtime-vad-process", "on")
    yield remote
    remote.stop()


def test_partials_that_continue_the_words_sent_keep_the_deltas_and_their_logprobs(server, data_dir):
    """With the words sent as each partial decode's prefix (the default), the live deltas still begin the turn,
    join with the final decode's rest into the HTTP transcript's words, and each carries the log-probabilities of
    its own tokens (the decode's result holds what it added after the prefix)."""
    pcm = pcm24k(data_dir / JFK)
    http = server.client().audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1")
    s = RawSession(server)
    try:
        s.next()
        s.send(type="session.update", session={"type": "transcription", "include": [
            "item.input_audio_transcription.logprobs"], "audio": {"input": {"turn_detection": None}}})  # fmt: skip
        assert s.next().type == "session.updated"
        start = time.perf_counter()
        for i, piece in enumerate(chunks(pcm, 48)):
            time.sleep(max(0.0, start + i * CHUNK_MS / 1000 - time.perf_counter()))
            s.send(type="input_audio_buffer.append", audio=piece)
        s.send(type="input_audio_buffer.commit")
        completed = s.until("conversation.item.input_audio_transcription.completed")
    finally:
        s.close()
    deltas = [e for e in s.events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert len(deltas) >= 3 and deltas[0].delta.split()[0] == "And", deltas
    # a word a preview misheard is sent, and then the prefix of the next previews, which continue after it: on a
    # busy machine the previews' cuts fall elsewhere, and JFK's "your country" was once sent as "you are country"
    # beside "asked": two words in ten
    assert completed.transcript == http.text
    assert same_words("".join(d.delta for d in deltas), completed.transcript, share=0.8)
    for delta in deltas:
        assert delta.logprobs and joined(delta.logprobs).strip() == delta.delta.strip(), delta
    assert metric(server, "whisper_realtime_partial_decodes_total", '{prefix="yes"}') >= 1


def test_the_sessions_delay_sets_how_often_its_turn_is_decoded_while_it_speaks(server, data_dir):
    """OpenAI's `delay` on a real session: the first 3 s of JFK streamed under `minimal` (a decode each
    0.25 s of audio, twice as often until the first delta, one at a time) and under `xhigh` (each 2 s; 1 s until
    the first delta): minimal decodes the open turn several times as often and sends its first words sooner.
    The audio goes at half its real pace: the cadence is counted in audio, and one decode at a time on a slow
    machine (a CPU decode there can take as long as the 0.25 s of audio between two) would count its speed."""
    pcm = pcm24k(data_dir / JFK)[: 3 * 48000]

    def partial_decodes() -> float:
        return sum(metric(server, "whisper_realtime_partial_decodes_total", f'{{prefix="{p}"}}') for p in ("yes", "no"))

    def speak(delay: str) -> tuple[float, float | None]:
        """Partial decodes the session's turn got while it spoke, and when its first delta came (s from the start)."""
        before = partial_decodes()
        s = RawSession(server)
        first = None
        try:
            s.next()
            s.send(type="session.update", session={"type": "transcription", "audio": {"input": {
                "turn_detection": None, "transcription": {"delay": delay}}}})  # fmt: skip
            assert s.until("session.updated").session.audio.input.transcription.delay == delay
            start = time.perf_counter()
            for i, piece in enumerate(chunks(pcm, 48)):
                while (wait := start + 2 * i * CHUNK_MS / 1000 - time.perf_counter()) > 0:
                    try:
                        if s.next(timeout=wait).type.endswith(".delta") and first is None:
                            first = time.perf_counter() - start
                    except TimeoutError:
                        break
                s.send(type="input_audio_buffer.append", audio=piece)
            s.send(type="input_audio_buffer.commit")
            s.until("conversation.item.input_audio_transcription.completed")
        finally:
            s.close()
        return partial_decodes() - before, first

    often, first_soon = speak("minimal")
    seldom, first_late = speak("xhigh")
    assert seldom <= 3 and often >= seldom + 2, (often, seldom)
    assert first_soon is not None and (first_late is None or first_soon < first_late), (first_soon, first_late)


def test_partials_take_the_language_the_last_final_was_detected_in(base_server, data_dir):
    """On a multilingual model, a session without `language`: the first turn's partial decodes each detect the
    language (the model's pick, counted by the engine), as its final does; once that final has detected it, the
    next turn's partials take it, and only the final detects again (as HTTP does)."""
    pcm = pcm24k(data_dir / JFK)[: 3 * 48000]

    def counts() -> tuple[float, float]:
        decodes = sum(
            metric(base_server, "whisper_realtime_partial_decodes_total", f'{{prefix="{p}"}}') for p in ("yes", "no")
        )
        return decodes, metric(base_server, "whisper_engine_total", '{name="language_picks"}')

    s = RawSession(base_server)
    turns = []
    try:
        s.next()
        s.send(type="session.update", session={"type": "transcription", "audio": {"input": {
            "turn_detection": None, "transcription": {"delay": "minimal"}}}})  # fmt: skip
        s.until("session.updated")
        for _ in range(2):
            before = counts()
            start = time.perf_counter()
            for i, piece in enumerate(chunks(pcm, 48)):
                while (wait := start + 2 * i * CHUNK_MS / 1000 - time.perf_counter()) > 0:
                    try:
                        s.next(timeout=wait)
                    except TimeoutError:
                        break
                s.send(type="input_audio_buffer.append", audio=piece)
            s.send(type="input_audio_buffer.commit")
            completed = s.until("conversation.item.input_audio_transcription.completed")
            assert "fellow" in completed.transcript.lower(), completed.transcript
            after = counts()
            turns.append((after[0] - before[0], after[1] - before[1]))
    finally:
        s.close()
    (first_partials, first_picks), (partials, picks) = turns
    assert first_partials >= 1 and first_picks >= first_partials + 1, turns  # every decode picked
    assert partials >= 1 and picks == 1, turns  # the final alone


@pytest.mark.parametrize("where", ["thread", "process"])
def test_server_vad_finds_one_turn_per_utterance_with_boundaries_in_time(where, request, data_dir):
    """Silero in a worker thread (`server`) and in a process of its own (`process_server`). Three speakers' clips with pauses between and around them, streamed at real-time-sized chunks: one turn per
    utterance, speech start and stop within 0.3 s of where the speech is, each transcript the clip's text."""
    names = [
        "g1_en_librispeech-dev-clean_1272-128104-0000.wav",
        "g1_en_librispeech-test-clean_1221-135766-0002.wav",
        "g1_en_librispeech-test-clean_1995-1837-0001.wav",
    ]
    server = request.getfixturevalue("server" if where == "thread" else "process_server")
    clips = [trimmed(pcm24k(data_dir / name)) for name in names]  # read speech: no pause inside reaches 800 ms
    silence = bytes(2 * 24000 * 2)  # 2 s
    stream, bounds, t = b"", [], 0
    for clip in clips:
        stream += silence
        t += len(silence)
        bounds.append((t / 48, (t + len(clip)) / 48))  # ms
        stream += clip
        t += len(clip)
    stream += silence
    http: list[str] = []  # each clip's HTTP transcript after the previous ones as the prompt, as a session decodes
    for c in clips:
        prompt = " ".join(http) or None
        http.append(server.client().audio.transcriptions.create(file=("c.wav", wav_bytes(c, 24000)), model="whisper-1",
                                                                prompt=prompt).text)  # fmt: skip
    s = RawSession(server)
    try:
        assert s.next().type == "session.created"
        s.send(type="session.update", session={"type": "transcription", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}}})  # fmt: skip
        assert s.next().session.audio.input.turn_detection.silence_duration_ms == 800
        for piece in chunks(stream, 48):
            s.send(type="input_audio_buffer.append", audio=piece)
        turns = []
        for _ in clips:
            started = s.until("input_audio_buffer.speech_started")
            stopped = s.until("input_audio_buffer.speech_stopped")
            assert stopped.item_id == started.item_id
            turns.append((started, stopped))
        completed = {}
        while len(completed) < len(clips):
            ev = s.until("conversation.item.input_audio_transcription.completed")
            completed[ev.item_id] = ev.transcript
    finally:
        s.close()
    assert sum(e.type == "input_audio_buffer.speech_started" for e in s.events) == len(clips)
    for (started, stopped), (true_start, true_end), text in zip(turns, bounds, http):
        # as the events report them (audio_start_ms is where the audio sent to the model starts: the detected start
        # less the 300 ms prefix padding)
        assert abs(started.audio_start_ms - true_start) < 300, (started.audio_start_ms, true_start)
        assert abs(stopped.audio_end_ms - true_end) < 300, (stopped.audio_end_ms, true_end)
        expected, got = set(words(text)), set(words(completed[started.item_id]))
        assert len(expected & got) >= 0.8 * len(expected), (text, completed[started.item_id])
    assert ("whisper-vad" in child_names(server.proc.pid)) == (where == "process")  # where Silero ran


def test_server_vad_decodes_a_turn_while_it_waits_out_the_silence(server, data_dir):
    """Under server VAD a turn's final decode starts once its speech has had its 200 ms tail of silence
    (realtime_turn_tail_ms) and is the turn's transcript when the silence ends the turn; speech that resumes within
    the wait aborts it and the turn goes on. Each transcript is the HTTP transcript of the turn's audio: from the
    reported start (300 ms prefix padding) to 200 ms after the reported end of its speech."""
    first = trimmed(pcm24k(data_dir / "g1_en_librispeech-dev-clean_1272-128104-0000.wav"))
    a, b = (
        trimmed(pcm24k(data_dir / f"g1_en_librispeech-test-clean_{n}.wav"))
        for n in ("1221-135766-0002", "1995-1837-0001")
    )
    gap, pause = bytes(2 * 24000 * 2), bytes(2 * 24 * 450)  # 2 s between turns; a 450 ms pause inside the second
    # read speech: no pause inside a clip reaches 800 ms. The second turn is sent once the first is transcribed
    # (a turn's early decode needs the transcript of the one before: its context)
    stream = gap + first + gap + a + pause + b + gap
    second_from = len(gap + first + gap)
    used = metric(server, "whisper_realtime_early_finals_total", '{outcome="used"}')
    dropped = metric(server, "whisper_realtime_early_finals_total", '{outcome="dropped"}')
    s = RawSession(server)
    try:
        assert s.next().type == "session.created"
        s.send(type="session.update", session={"type": "transcription", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}}})  # fmt: skip
        s.next()
        turns, completed = [], {}
        for part in (stream[:second_from], stream[second_from:]):
            for piece in chunks(part, 48):
                s.send(type="input_audio_buffer.append", audio=piece)
            turns.append((s.until("input_audio_buffer.speech_started"), s.until("input_audio_buffer.speech_stopped")))
            ev = s.until("conversation.item.input_audio_transcription.completed")
            completed[ev.item_id] = ev.transcript
    finally:
        s.close()
    assert sum(e.type == "input_audio_buffer.speech_started" for e in s.events) == 2  # the pause split nothing
    assert metric(server, "whisper_realtime_early_finals_total", '{outcome="used"}') - used == 2
    assert metric(server, "whisper_realtime_early_finals_total", '{outcome="dropped"}') - dropped >= 1
    client, prompt = server.client(), None
    for started, stopped in turns:
        audio = stream[started.audio_start_ms * 48 : (stopped.audio_end_ms + 200) * 48]
        http = client.audio.transcriptions.create(file=("t.wav", wav_bytes(audio, 24000)), model="whisper-1",
                                                  prompt=prompt).text  # fmt: skip
        assert completed[started.item_id] == http, (completed[started.item_id], http)
        prompt = http
    assert "quilter" in completed[turns[0][0].item_id].lower()


def test_finals_keep_their_order_of_arrival_and_no_session_starves_on_a_saturated_engine(server, data_dir):
    """Six sessions each buffer the same clip (their partial decodes of it run meanwhile) and commit it 150 ms after
    the session before had its commit acknowledged, while the engine is still decoding the turns before: more than
    these cores decode at that pace. Every turn is transcribed, each as HTTP transcribes it, and the transcripts
    come back in the order of the commits."""
    pcm = pcm24k(data_dir / JFK)
    http = server.client().audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1")
    sessions = [RawSession(server) for _ in range(6)]
    committed = [threading.Event() for _ in sessions]
    arrived: dict[int, tuple[int, str]] = {}

    def read(i: int) -> None:
        sessions[i].until("input_audio_buffer.committed", timeout=120)
        committed[i].set()
        ev = sessions[i].until("conversation.item.input_audio_transcription.completed", timeout=120)
        # the server numbers its events in the order it makes them (server/realtime/events.py new_id: a counter
        # after 16 random hex digits): the order of the finals, free of the client threads' wake-ups
        arrived[i] = (int(ev.event_id.split("_", 1)[1][16:], 16), ev.transcript)

    try:
        for s in sessions:
            s.next()
            s.send(
                type="session.update", session={"type": "transcription", "audio": {"input": {"turn_detection": None}}}
            )
            assert s.next().type == "session.updated"
        for s in sessions:
            for piece in chunks(pcm, 48):
                s.send(type="input_audio_buffer.append", audio=piece)
        readers = [threading.Thread(target=read, args=(i,)) for i in range(len(sessions))]
        for t in readers:
            t.start()
        for s, acknowledged in zip(sessions, committed, strict=True):
            s.send(type="input_audio_buffer.commit")
            assert acknowledged.wait(timeout=120)
            time.sleep(0.15)
        for t in readers:
            t.join(timeout=150)
    finally:
        for s in sessions:
            s.close()
    assert sorted(arrived) == list(range(len(sessions)))  # none starved
    assert all(text == http.text for _, text in arrived.values())
    assert sorted(arrived, key=lambda i: arrived[i][0]) == list(range(len(sessions)))


def manual_turn(s: RawSession, pcm: bytes):
    """One turn committed by hand: its live deltas and its completed event."""
    first = len(s.events)
    for piece in chunks(pcm, 48):
        s.send(type="input_audio_buffer.append", audio=piece)
    s.send(type="input_audio_buffer.commit")
    completed = s.until("conversation.item.input_audio_transcription.completed")
    deltas = [e for e in s.events[first:] if e.type == "conversation.item.input_audio_transcription.delta"]
    return deltas, completed


def joined(logprobs) -> str:
    return b"".join(bytes(p.bytes) for p in logprobs).decode("utf-8", "replace")


def test_logprobs_and_previous_turns_as_context(server, data_dir):
    """include logprobs: each delta and the completed transcript carry their tokens' log-probabilities (their bytes
    spell the text). A second turn is decoded after the first one's transcript: as HTTP with it as the prompt."""
    first, second = pcm24k(data_dir / JFK), pcm24k(data_dir / "g1_en_librispeech-test-clean_1221-135766-0002.wav")
    s = RawSession(server)
    try:
        s.next()
        s.send(type="session.update", session={"type": "transcription", "include": [
            "item.input_audio_transcription.logprobs"], "audio": {"input": {"turn_detection": None}}})  # fmt: skip
        assert s.next().session.include == ["item.input_audio_transcription.logprobs"]
        turns = [manual_turn(s, pcm) for pcm in (first, second)]
    finally:
        s.close()
    for deltas, completed in turns:
        assert completed.logprobs and joined(completed.logprobs).strip() == completed.transcript
        assert all(p.logprob <= 0 for p in completed.logprobs)
        for delta in deltas:
            assert delta.logprobs and joined(delta.logprobs).strip() == delta.delta.strip(), delta
    client = server.client()
    expected = [
        client.audio.transcriptions.create(file=("a.wav", wav_bytes(first, 24000)), model="whisper-1").text,
        client.audio.transcriptions.create(
            file=("b.wav", wav_bytes(second, 24000)), model="whisper-1", prompt=turns[0][1].transcript
        ).text,
    ]
    assert [completed.transcript for _, completed in turns] == expected


def test_idle_timeouts(server, small_upload_server):
    """server_vad's idle_timeout_ms: OpenAI's timeout_triggered after that long without speech, and the quiet
    audio committed as a turn. The server's own idle timeout closes a session that sends nothing."""
    s = RawSession(server)
    try:
        s.next()
        s.send(type="session.update", session={"type": "transcription", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}})  # fmt: skip
        assert s.next().session.audio.input.turn_detection.idle_timeout_ms == 5000
        for piece in chunks(bytes(2 * 24000 * 6), 48):  # 6 s of silence
            s.send(type="input_audio_buffer.append", audio=piece)
        timeout = s.until("input_audio_buffer.timeout_triggered")
        committed = s.until("input_audio_buffer.committed")
        completed = s.until("conversation.item.input_audio_transcription.completed")
    finally:
        s.close()
    assert (timeout.audio_start_ms, timeout.audio_end_ms) == (0, 5024)  # at the first 32 ms frame past 5 s
    assert committed.item_id == completed.item_id == timeout.item_id
    assert abs(completed.usage.seconds - 5.024) < 0.05 and not completed.transcript.strip(".! ")
    with ws_connect(ws_url(small_upload_server), open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        started = time.perf_counter()
        err = SERVER_EVENT.validate_python(json.loads(ws.recv(timeout=30)))
        assert err.type == "error" and err.error.code == "session_idle_timeout"
        assert 1.5 < time.perf_counter() - started < 10
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)


def test_g711_input_and_clear(server, data_dir):
    pcm8k = pcm_at(data_dir / JFK, 8000)
    frame = av.AudioFrame.from_ndarray(pcm8k.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = 8000
    encoder = av.CodecContext.create("pcm_mulaw", "w")
    encoder.sample_rate, encoder.layout, encoder.format = 8000, "mono", "s16"
    mulaw = b"".join(bytes(p) for p in encoder.encode(frame)) + b"".join(bytes(p) for p in encoder.encode(None))
    s = RawSession(server)
    try:
        s.next()
        s.send(type="session.update", session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcmu"}, "turn_detection": None}}})  # fmt: skip
        assert s.next().session.audio.input.format.type == "audio/pcmu"
        s.send(type="input_audio_buffer.append", audio=base64.b64encode(mulaw[:4000]).decode())
        s.send(type="input_audio_buffer.clear")
        assert s.next().type == "input_audio_buffer.cleared"
        for piece in chunks(mulaw, 8):
            s.send(type="input_audio_buffer.append", audio=piece)
        s.send(type="input_audio_buffer.commit")
        done = s.until("conversation.item.input_audio_transcription.completed")
    finally:
        s.close()
    assert "ask not what your country" in done.transcript.lower()  # telephone quality, still the words
    assert abs(done.usage.seconds - len(mulaw) / 8000) < 0.05  # the cleared audio is not in the turn


def test_bad_events_get_errors_and_the_connection_keeps_serving(server, data_dir):
    s = RawSession(server)
    try:
        s.next()
        bad = [
            {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"format": {"type": "audio/flac"}}}}},
            {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}}},
            {"type": "session.update", "session": {"type": "realtime"}},
            {"type": "input_audio_buffer.append", "audio": "not base64 !!"},
            {"type": "input_audio_buffer.append", "audio": "A" * (15 * 2**20 + 4)},
            {"type": "input_audio_buffer.commit"},  # nothing appended
            {"type": "response.create"},
        ]  # fmt: skip
        for event in bad:
            s.send(**event)
            err = s.next()
            assert err.type == "error" and err.error.message, event["type"]
        s.ws.send("{not json")
        assert s.next().type == "error"
        s.ws.send("[" * 100_000 + "]" * 100_000)  # deep JSON: an error, not a crash
        assert s.next().type == "error"
        # still serving: a normal turn
        s.send(type="session.update", session={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
        assert s.next().type == "session.updated"
        for piece in chunks(pcm24k(data_dir / JFK), 48):
            s.send(type="input_audio_buffer.append", audio=piece)
        s.send(type="input_audio_buffer.commit")
        assert "country" in s.until("conversation.item.input_audio_transcription.completed").transcript
    finally:
        s.close()


def test_a_vanishing_client_and_a_wrong_intent_leave_the_server_serving(server, data_dir):
    pcm = pcm24k(data_dir / JFK)
    s = RawSession(server)
    s.next()
    s.send(type="session.update", session={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
    for piece in chunks(pcm, 48):
        s.send(type="input_audio_buffer.append", audio=piece)
    s.send(type="input_audio_buffer.commit")
    s.ws.close()  # gone mid-turn: its decode is aborted
    with ws_connect(server.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime", open_timeout=30) as ws:
        err = SERVER_EVENT.validate_python(json.loads(ws.recv(timeout=30)))
        assert err.type == "error" and "intent=transcription" in err.error.message
    text = server.client().audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1").text
    assert "country" in text


def manual_update(**input_fields) -> dict:
    return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": input_fields}}}


def vad(**fields) -> dict:
    """server_vad that hears the JFK clip as one turn (its pauses are shorter than 1.5 s), with `fields` on top."""
    return {"type": "server_vad", "silence_duration_ms": 1500, **fields}


# Wrong types for every field of a transcription session: each is refused with the path of what is wrong, or coerced
# by the SDK's model (then the session must hold and use the coerced value, never the client's string).
FUZZ = [
    {"type": "session.update", "session": "transcription"},
    {"type": "session.update", "session": {"type": 5}},
    {"type": "session.update", "session": {"type": "transcription", "audio": "pcm"}},
    {"type": "session.update", "session": {"type": "transcription", "audio": {"input": [1]}}},
    {"type": "session.update", "session": {"type": "transcription", "include": "item.input_audio_transcription.logprobs"}},
    {"type": "session.update", "session": {"type": "transcription", "include": [5]}},
    manual_update(format="audio/pcm"),
    manual_update(format={"type": 5}),
    manual_update(format={"type": "audio/pcm", "rate": "24000"}),
    manual_update(format={"type": "audio/pcm", "rate": 24000.0}),  # coerced to 24000
    manual_update(transcription="whisper-1"),
    manual_update(transcription={"model": 1}),
    manual_update(transcription={"language": 5}),
    manual_update(transcription={"prompt": 5}),
    manual_update(noise_reduction="near_field"),
    manual_update(turn_detection="server_vad"),
    manual_update(turn_detection={"type": 5}),
    manual_update(turn_detection=vad(threshold="0.5")),  # coerced to 0.5
    manual_update(turn_detection=vad(threshold="loud")),
    manual_update(turn_detection=vad(threshold=True)),  # coerced to 1.0: out of range
    manual_update(turn_detection=vad(prefix_padding_ms="300")),  # coerced to 300
    manual_update(turn_detection=vad(prefix_padding_ms=300.5)),
    manual_update(turn_detection={"type": "server_vad", "silence_duration_ms": "1500"}),  # coerced to 1500
    manual_update(turn_detection=vad(idle_timeout_ms="6000")),  # coerced to 6000
    manual_update(turn_detection=vad(idle_timeout_ms="soon")),
    manual_update(turn_detection=vad(create_response="yes")),  # coerced to true (and unused)
]  # fmt: skip


def check_stored_types(session: dict) -> None:
    """The effective session holds JSON of the types the protocol says, never a client's string for a number."""
    audio = session["audio"]["input"]
    assert isinstance(audio["format"]["type"], str)
    assert type(audio["format"].get("rate", 0)) is int
    t = audio["transcription"]
    assert isinstance(t["model"], str) and isinstance(t["prompt"], str) and isinstance(t["language"], str | None)
    td = audio["turn_detection"]
    if td is not None:
        assert type(td["threshold"]) is float, td
        assert all(type(td[k]) is int for k in ("prefix_padding_ms", "silence_duration_ms")), td
        assert td.get("idle_timeout_ms") is None or type(td["idle_timeout_ms"]) is int, td
    assert all(isinstance(i, str) for i in session["include"])


def fuzz_case(server, bad: dict, pcm: bytes) -> tuple[str, bool]:
    """One wrong-typed session.update on a session that commits by hand; then the clip through that session (by
    hand, or by the server VAD the update turned on). Returns the transcript, and whether server VAD made it."""
    s = RawSession(server)
    try:
        s.next()
        s.send(**manual_update(turn_detection=None))
        assert s.next().type == "session.updated"
        s.ws.send(json.dumps(bad))
        reply = json.loads(s.ws.recv(timeout=60))  # the raw JSON: the SDK's model would coerce what it holds
        assert reply["type"] in ("error", "session.updated"), reply
        SERVER_EVENT.validate_python(reply)
        if reply["type"] == "error":
            assert reply["error"]["type"] == "invalid_request_error", reply
            assert reply["error"]["param"].startswith("session"), reply
            turn_detection = None
        else:
            check_stored_types(reply["session"])
            turn_detection = reply["session"]["audio"]["input"]["turn_detection"]
        if turn_detection is None:
            for piece in chunks(pcm, 48):
                s.send(type="input_audio_buffer.append", audio=piece)
            s.send(type="input_audio_buffer.commit")
        else:
            for piece in chunks(pcm + bytes(2 * 24000 * 2), 48):  # 2 s of silence after it ends the turn
                s.send(type="input_audio_buffer.append", audio=piece)
        completed = s.until("conversation.item.input_audio_transcription.completed", timeout=120)
        assert not [e for e in s.events if e.type == "error"], s.events
        return completed.transcript, turn_detection is not None
    finally:
        s.close()


def test_wrong_types_in_session_update_never_break_a_session(server, data_dir):
    """Every field of the session with a wrong type, each in a session of its own (all at once: the engine batches
    their turns): an error naming the field or a session.updated of coerced values, and then the session still
    transcribes the clip, by hand exactly as HTTP does, by server VAD the same words."""
    pcm = pcm24k(data_dir / JFK)
    http = server.client().audio.transcriptions.create(file=("jfk.wav", wav_bytes(pcm, 24000)), model="whisper-1").text
    with ThreadPoolExecutor(len(FUZZ)) as pool:
        results = list(pool.map(lambda bad: fuzz_case(server, bad, pcm), FUZZ))
    for bad, (transcript, by_vad) in zip(FUZZ, results):
        if by_vad:  # the turn's audio is what the VAD cut, not the clip's exact extent
            assert words(transcript) == words(http), (bad, transcript)
        else:
            assert transcript == http, (bad, transcript)
    assert sum(by_vad for _, by_vad in results) == 5  # each coerced turn_detection (True is out of range)


def test_a_session_serves_the_models_the_http_routes_serve_and_no_other(server):
    served = [m.id for m in server.client().models.list()]
    assert "whisper-1" in served
    s = RawSession(server)
    try:
        s.next()
        for name in served:
            s.send(**manual_update(transcription={"model": name}))
            updated = s.next()
            assert updated.type == "session.updated" and updated.session.audio.input.transcription.model == name
        wav = wav_bytes(bytes(24000), 24000)
        for name in ["gpt-4o-transcribe", "gpt-4o-mini-transcribe", "WHISPER-1", "tiny", ""]:
            with pytest.raises(openai.NotFoundError):
                server.client().audio.transcriptions.create(file=("q.wav", wav), model=name)
            s.send(**manual_update(transcription={"model": name}), event_id="ev_model")
            err = s.next()
            assert err.type == "error", name
            assert (err.error.type, err.error.code) == ("invalid_request_error", "model_not_found")
            assert err.error.param == "session.audio.input.transcription.model" and err.error.event_id == "ev_model"
        s.send(**manual_update(turn_detection=None))  # the refusals changed nothing
        assert s.next().session.audio.input.transcription.model == served[-1]
    finally:
        s.close()


def vm_rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


BIG_APPEND_BYTES = int(14.9 * 2**20) * 3 // 4  # 24 kHz PCM whose base64 is 14.9 MiB: 244 s of audio
BIG_APPENDS = 6  # per flooding session: without a cap on all sessions together, each buffers them all (1464 s)
# What may be in flight: per session the event being handled (its text, its parsed audio) and the next one uvicorn
# reads (frame buffer, bytes, text), 15 MiB each; one decode; and the 300 s the server holds. Not the audio refused.
MAX_RSS_GROWTH = 512 * 2**20
# Framing and parsing a 15 MiB event hold the GIL for tens of milliseconds, on a CPU that the test's clients (which
# mask 60 MiB of frames themselves) and the engine (the turn beside the floods) share with the event loop; an event
# loop that parses or decodes the appends itself answers /health in 3-4.5 s here.
MAX_HEALTH_S = 2.0


def test_big_pipelined_appends_leave_the_server_responsive_and_its_memory_bounded(data_dir):
    """Four sessions pipeline 14.9 MiB appends (manual commits) into a server that holds 300 s of audio across all
    its sessions: the appends past it are refused (server_buffer_full) from their size, none is decoded on the event
    loop, the server's memory grows by what is in flight only, /health answers throughout, and a session beside
    them gets its transcript."""
    with RemoteServer("--realtime-max-buffer-s", "1800", "--realtime-max-buffered-seconds-total", "300") as server:
        pcm = pcm24k(data_dir / JFK)
        http = server.client().audio.transcriptions.create(file=("j.wav", wav_bytes(pcm, 24000)), model="whisper-1")
        noise = np.random.default_rng(0).integers(-3000, 3000, BIG_APPEND_BYTES // 2, dtype="<i2").tobytes()
        big = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(noise).decode()})
        assert len(big) < 15 * 2**20
        warm = RawSession(server)  # the first session loads Silero and builds the session's model: not measured
        warm.next()
        warm.send(**manual_update(turn_detection=None))
        assert warm.next().type == "session.updated"
        warm.close()
        rss_before = vm_rss(server.proc.pid)
        done = threading.Event()
        health: list[tuple[float, int]] = []  # (seconds, status) of each GET /health
        rss: list[int] = []

        def watch() -> None:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                while not done.is_set():
                    started = time.perf_counter()
                    try:
                        status = client.get("/health").status_code
                    except httpx.HTTPError:
                        status = 0
                    health.append((time.perf_counter() - started, status))
                    rss.append(vm_rss(server.proc.pid))
                    time.sleep(0.02)

        def flood() -> list[str]:
            s = RawSession(server)
            try:
                s.next()
                s.send(**manual_update(turn_detection=None))
                assert s.next().type == "session.updated"
                for _ in range(BIG_APPENDS):
                    s.ws.send(big)
                s.send(type="input_audio_buffer.clear")
                s.until("input_audio_buffer.cleared", timeout=120)
            finally:
                s.close()
            return [e.error.code for e in s.events if e.type == "error"]

        def beside() -> str:
            s = RawSession(server)
            try:
                s.next()
                s.send(**manual_update(turn_detection=None))
                assert s.next().type == "session.updated"
                return manual_turn(s, pcm)[1].transcript
            finally:
                s.close()

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with ThreadPoolExecutor(5) as pool:
                floods = [pool.submit(flood) for _ in range(4)]
                normal = pool.submit(beside)
                refused = [code for f in floods for code in f.result()]
                transcript = normal.result()
        finally:
            done.set()
            watcher.join()
    assert set(refused) == {"server_buffer_full"}
    assert len(refused) >= 4 * (BIG_APPENDS - 1)  # a session holds one at most (300 s), until it clears it
    assert transcript == http.text
    assert len(health) >= 5 and {status for _, status in health} == {200}, health
    assert max(seconds for seconds, _ in health) < MAX_HEALTH_S, health
    assert max(rss) - rss_before < MAX_RSS_GROWTH, (max(rss) - rss_before) / 2**20

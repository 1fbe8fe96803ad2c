"""One realtime transcription connection: client events in, turns transcribed by the engine, server events out.

The input audio is one stream per connection, kept at 16 kHz. A turn ends by the client's
`input_audio_buffer.commit` or, with server VAD, when Silero (run on the stream as it arrives) has heard
`silence_duration_ms` of silence after speech; the turn's audio (from `prefix_padding_ms` before the speech) is
then an ordinary request in the engine's shared batch, decoded greedily with Whisper's fallback exactly as
`/v1/audio/transcriptions` decodes a file, so a turn's transcript is the HTTP transcript of the same audio.

Server events go out through a bounded queue drained by one task: a client that does not read them fills it, gets
an `error` and is closed; it never holds up the engine or another connection. A connection that goes away aborts
its turns still decoding, freeing their slots.

Buffered audio is bounded per session (`realtime_max_buffer_s`) and across them (`realtime_max_buffered_seconds_
total`); an append is measured against both from its base64 length, before anything is decoded, and a large one
is decoded in a worker thread, one at a time server-wide. A client event that fails unexpectedly gets a
`server_error` and the connection keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from engine import (
    SAMPLE_RATE,
    DecodeOptions,
    EngineError,
    EngineLike,
    Task,
    TranscriptionResult,
)

from ..errors import APIError
from ..formatting import token_logprobs
from ..metrics import Metrics
from ..parsing.body import parse_json
from ..parsing.options import decode_options
from ..settings import MAX_APPEND_BASE64, Settings
from .audio_input import AudioFormatError, InputAudio, base64_size
from .events import error, event, new_id, user_item
from .session import SessionConfig, SessionError
from .speech_batcher import SpeechBatcher

log = logging.getLogger(__name__)

OFFLOAD_BASE64 = 2**16  # events longer than this (a second of 24 kHz PCM) are parsed and decoded in a worker thread
MAX_QUEUED_EVENTS = 1024  # server events a client may leave unread before it is closed as too slow
MIN_COMMIT_MS = 100  # OpenAI's: a commit of less audio is an error
FRAME_MS = 32  # Silero's frame at 16 kHz
NEG_THRESHOLD_GAP = 0.15  # silero's hysteresis: speech ends below threshold - 0.15
PARTIAL_EVERY_S = 1.0  # while a turn is open, decode what it holds so far after each this much new audio
# Live deltas cover a turn's first window: past it a partial decode would be long-form, its cost growing with the
# turn at every refresh; the rest of a longer turn comes with its final decode.
MAX_PARTIAL_S = 30.0
MAX_CONTEXT_CHARS = 4096  # previous transcripts kept as context: more than the 223 tokens Whisper conditions on
RESET_CONTEXT_TEMPERATURE = 0.5  # Whisper's prompt_reset_on_temperature: a turn decoded hotter is not context
WORD = re.compile(r"\S+")


class Partials:
    """A turn's live text: the words two successive decodes of its growing audio agreed on are sent as deltas, so
    what is sent is never taken back; the final decode's transcript then sends only what follows them."""

    def __init__(self) -> None:
        self.sent = 0  # words already sent as deltas
        self.sent_text = ""  # the deltas sent, joined
        self.last: list[str] = []  # the previous partial decode's words
        self.in_flight = False
        self.done = False  # the final decode has started: late partial results are dropped

    def agree(self, text: str) -> tuple[int, int]:
        """The characters [start, end) of a new partial decode's `text` that can be sent ((0, 0) for none)."""
        spans = [m.span() for m in WORD.finditer(text)]
        words = [text[a:b] for a, b in spans]
        agreed = 0
        # the last word of a decode is where its audio was cut: its punctuation (a period before a pause the
        # speaker then continues after) depends on what follows, so it is never stable yet
        while agreed < min(len(words), len(self.last)) - 1 and words[agreed] == self.last[agreed]:
            agreed += 1
        self.last = words
        if agreed <= self.sent or text[: len(self.sent_text)] != self.sent_text:
            return 0, 0
        start, end = len(self.sent_text), spans[agreed - 1][1]
        self.sent, self.sent_text = agreed, text[:end]
        return start, end

    def rest(self, transcript: str) -> int:
        """Where what the final transcript adds to the deltas sent starts (all of it if it does not continue them:
        a partial decode's agreed words the final one does not share are already sent, and they stay sent)."""
        if transcript.startswith(self.sent_text):
            return len(self.sent_text)
        # the final decode changed a sent word (its punctuation, most likely): continue after as many words
        log.info("a realtime turn's final transcript does not continue its sent deltas")
        spans = [m.span() for m in WORD.finditer(transcript)]
        return spans[self.sent - 1][1] if len(spans) > self.sent else len(transcript)


def event_id_of(message: dict) -> str | None:
    """The client event's id, to be echoed in an error about it (the SDK's models want a string)."""
    event_id = message.get("event_id")
    return event_id if isinstance(event_id, str) else None


class ClientTooSlow(Exception):
    pass


class ServerBufferFull(Exception):
    """The sessions together hold realtime_max_buffered_seconds_total of audio: an append past it is refused."""


@dataclasses.dataclass
class SharedLoad:
    """What every connection of the server sees: the sessions open and the decodes in flight. While a final one is, no session launches a
    partial refresh (finals come first: a partial is only a preview that the next one replaces), and partial
    decodes are capped server-wide (`--realtime-max-partial-decodes`): under load the previews thin out, the
    finals stay prompt."""

    max_partials: int = 4
    sessions: int = 0  # connections open
    finals_in_flight: int = 0
    partials_in_flight: int = 0
    buffered_samples: int = 0  # uncommitted audio of every session, and the appends being decoded
    # large events are parsed and decoded one at a time: each holds several copies of its audio while it is, and
    # the default executor stays free for the rest of the server (/health reads engine stats through it)
    decoding: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(1))


class Connection:
    def __init__(
        self, websocket: WebSocket, engine: EngineLike, settings: Settings, speech: SpeechBatcher,
        metrics: Metrics, load: SharedLoad,
    ):  # fmt: skip
        self.ws = websocket
        self.load = load
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.session = SessionConfig(settings)
        self.audio = InputAudio(self.session.format_type)
        self.vad = speech  # shared by the connections: a stream each, pushed together
        self.outbox: asyncio.Queue[dict] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self.turns: set[asyncio.Task] = set()
        self.handles: set = set()
        self.partials: dict[str, Partials] = {}
        self.previous_item_id: str | None = None
        self.previous_final: asyncio.Task | None = None  # a session's turns are transcribed in order
        self.context = ""  # the previous turns' transcripts (realtime_condition_on_previous_text)
        self.failures = 0  # client events that raised unexpectedly (the first is logged with its traceback)
        self._num_samples = 0
        self._reset_stream()

    @property
    def num_samples(self) -> int:
        """Samples in the buffer, counted in the server-wide total as well."""
        return self._num_samples

    @num_samples.setter
    def num_samples(self, value: int) -> None:
        self.load.buffered_samples += value - self._num_samples
        self._num_samples = value

    # ---- the stream and its turns ------------------------------------------------------------------------------

    def _reset_stream(self) -> None:
        self.samples: list[np.ndarray] = []  # the uncommitted audio, 16 kHz
        self.num_samples = 0
        self.offset = 0  # stream position (samples) of samples[0]
        self.speech = self.vad.stream() if self.session.turn_detection is not None else None
        self.speech_start: int | None = None  # frame index where the current speech began
        self.silent_since: int | None = None
        self.item_id: str | None = None
        self.partial_at = 0  # buffered samples when the last partial decode of the open turn was launched
        self.idle_from = 0  # where the stream has been without speech since (idle_timeout_ms)

    def _buffered(self, start: int, end: int) -> np.ndarray:
        """Stream samples [start, end) still in the buffer."""
        audio = np.concatenate(self.samples) if self.samples else np.zeros(0, dtype=np.float32)
        return audio[max(0, start - self.offset) : max(0, end - self.offset)]

    def _drop_before(self, position: int) -> None:
        audio = np.concatenate(self.samples) if self.samples else np.zeros(0, dtype=np.float32)
        keep = audio[max(0, position - self.offset) :]
        self.samples, self.num_samples = [keep], len(keep)
        self.offset = max(self.offset, position)

    # ---- the connection ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        sender = asyncio.ensure_future(self._send_loop())
        idle_s = self.settings.realtime_idle_timeout_s
        try:
            self.send(event("session.created", session=self.session.body()))
            while True:
                try:
                    message = await asyncio.wait_for(self.ws.receive(), idle_s)
                except TimeoutError:
                    self.send(error(f"no event for {idle_s:g} s: the session is closed", code="session_idle_timeout"))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.outbox.join(), 1.0)
                    await self.ws.close(code=1000)
                    break
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    self.send(error("binary frames are not part of the protocol; send JSON text events"))
                    continue
                await self._handle(text)
        except (WebSocketDisconnect, ClientTooSlow):
            pass
        finally:
            self.num_samples = 0  # out of the server-wide total
            for handle in self.handles:
                handle.abort()  # a vanished client's turns free their slots now
            for task in self.turns:
                task.cancel()
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender

    def send(self, item: dict) -> None:
        try:
            self.outbox.put_nowait(item)
        except asyncio.QueueFull:
            raise ClientTooSlow() from None

    async def _send_loop(self) -> None:
        while True:
            item = await self.outbox.get()
            try:
                await self.ws.send_text(json.dumps(item))
            finally:
                self.outbox.task_done()

    async def _handle(self, text: str) -> None:
        """One client event. What is wrong with it is an `error` event, and so is what fails unexpectedly while it is
        handled (a `server_error`, logged): the connection goes on either way."""
        kind, event_id = "the event", None
        try:
            message = await self._parse(text)
            if message is None:
                return
            kind, event_id = message["type"], event_id_of(message)
            handler = {
                "session.update": self._session_update,
                "input_audio_buffer.append": self._append,
                "input_audio_buffer.commit": self._commit,
                "input_audio_buffer.clear": self._clear,
            }.get(kind)
            if handler is None:
                supported = (
                    "session.update, input_audio_buffer.append, input_audio_buffer.commit, input_audio_buffer.clear"
                )
                self.send(error(f"unsupported event type {kind!r} in a transcription session; supported: {supported}",
                                code="invalid_event", param="type", event_id=event_id))  # fmt: skip
                return
            if kind == "input_audio_buffer.append":
                await self._append(message)
            else:
                handler(message)
        except (SessionError, AudioFormatError) as exc:
            code = getattr(exc, "code", "invalid_value")
            self.send(error(str(exc), code=code, param=getattr(exc, "param", None), event_id=event_id))
        except ServerBufferFull as exc:
            self.send(error(str(exc), type_="server_error", code="server_buffer_full", event_id=event_id))
        except ClientTooSlow:
            raise
        except Exception as exc:  # noqa: BLE001 - one event's bug must not drop the connection without a word
            self._unexpected(kind, exc)
            self.send(error(f"the server failed to handle {kind}", type_="server_error", code="server_error",
                            event_id=event_id))  # fmt: skip

    async def _parse(self, text: str) -> dict | None:
        """The event, a JSON object with a string `type`; None once the client has an error saying why it is not."""
        try:
            if len(text) > OFFLOAD_BASE64:  # a large event (an append): parsed off the event loop, as it is decoded
                async with self.load.decoding:
                    message = await asyncio.to_thread(parse_json, text, "The event")
            else:
                message = parse_json(text, "The event")
        except APIError as exc:
            self.send(error(exc.message, code=exc.code))
            return None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self.send(error("an event is a JSON object with a string 'type'", code="invalid_event", param="type"))
            return None
        return message

    def _unexpected(self, kind: str, exc: Exception) -> None:
        """Log a client event's unexpected failure: with its traceback the first time, a line after that (a client
        repeating the event must not flood the log)."""
        self.failures += 1
        if self.failures == 1:
            log.exception("realtime %s failed", kind)
        else:
            log.error("realtime %s failed again (%d in this session): %r", kind, self.failures, exc)

    def _session_update(self, message: dict) -> None:
        old_format, old_vad = self.session.format_type, self.session.turn_detection
        self.session.update(message.get("session"))
        if self.session.format_type != old_format:
            self.audio = InputAudio(self.session.format_type)
        if (self.session.turn_detection is None) != (old_vad is None):
            self._reset_stream()
        self.send(event("session.updated", session=self.session.body()))

    async def _append(self, message: dict) -> None:
        data = message.get("audio")
        if not isinstance(data, str):
            raise AudioFormatError("input_audio_buffer.append needs 'audio', a base64 string")
        if len(data) > MAX_APPEND_BASE64:
            raise AudioFormatError(f"an append carries at most {MAX_APPEND_BASE64} base64 characters")
        settings, load = self.settings, self.load
        needed = int(self.audio.seconds(base64_size(data)) * SAMPLE_RATE)  # what it would add, decoded
        if self.num_samples + needed > settings.realtime_max_buffer_s * SAMPLE_RATE:
            raise AudioFormatError(
                f"the input audio buffer holds at most {settings.realtime_max_buffer_s:g} s; commit or clear it"
            )
        if load.buffered_samples + needed > settings.realtime_max_buffered_seconds_total * SAMPLE_RATE:
            raise ServerBufferFull(
                f"the server holds at most {settings.realtime_max_buffered_seconds_total:g} s of uncommitted audio "
                "across its sessions; commit, or send it again later"
            )
        if len(data) <= OFFLOAD_BASE64:
            samples = self.audio.append_base64(data)
        else:
            load.buffered_samples += needed  # reserved while it decodes: the other sessions' appends count it
            try:
                async with load.decoding:
                    samples = await asyncio.to_thread(self.audio.append_base64, data)
            finally:
                load.buffered_samples -= needed
        self.metrics.realtime_audio_seconds.inc(len(samples) / SAMPLE_RATE)
        self.samples.append(samples)
        self.num_samples += len(samples)
        if self.speech is not None:
            first = self.speech.frames_done
            # Silero in a worker thread, with every session's appends of the moment: the loop keeps serving
            self._detect_turns(first, await self.vad.push(self.speech, samples))
        self._maybe_partial()

    def _maybe_partial(self) -> None:
        """A partial decode of the open turn, if it grew by PARTIAL_EVERY_S since the last and none is running."""
        if self.speech is not None and self.speech_start is None:
            return  # no speech yet
        load = self.load
        if self.num_samples - self.partial_at < PARTIAL_EVERY_S * SAMPLE_RATE:
            return
        if load.finals_in_flight or load.partials_in_flight >= load.max_partials:
            return
        if self.item_id is None:  # manual commits: the turn gets its id with its first partial
            self.item_id = new_id("item")
        partials = self.partials.setdefault(self.item_id, Partials())
        if partials.in_flight:
            return
        self.partial_at = self.num_samples
        if self.speech is not None:
            td = self.session.turn_detection
            start = max(0, self.speech_start * FRAME_MS - td.prefix_padding_ms) * SAMPLE_RATE // 1000
        else:
            start = self.offset
        end = self.offset + self.num_samples
        if end - max(start, self.offset) > MAX_PARTIAL_S * SAMPLE_RATE:
            return  # measured before it is copied: a long manual buffer would be copied at every append
        audio = self._buffered(start, end)
        partials.in_flight = True
        load.partials_in_flight += 1
        task = asyncio.ensure_future(self._partial(self.item_id, partials, audio, time.perf_counter()))
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)

    def _options(self, background: bool) -> DecodeOptions:
        """A turn's decode: the HTTP route's, with the session's language and prompt (then its previous
        transcripts). A partial one is greedy only (one beam, no fallback), and in the background: a preview, refreshed a second later,
        that waits for every other window; the final decode has Whisper's fallback."""
        prompt = " ".join(p for p in (self.session.prompt, self.context) if p) or None
        options = decode_options(Task.TRANSCRIBE, self.session.language, prompt, 0.0, settings=self.settings)
        options = dataclasses.replace(options, logprobs=self.session.logprobs)
        if background:
            options = dataclasses.replace(options, temperatures=(0.0,), background=True, beam_size=1)
        return options

    async def _partial(self, item_id: str, partials: Partials, audio: np.ndarray, launched: float) -> None:
        options = self._options(background=True)
        try:
            handle = self.engine.submit(audio, options)
        except EngineError:
            partials.in_flight = False
            self.load.partials_in_flight -= 1
            return
        self.handles.add(handle)
        try:
            result = await handle.result()
        except EngineError:
            return
        finally:
            self.handles.discard(handle)
            partials.in_flight = False
            self.load.partials_in_flight -= 1
        if partials.done:
            return
        text = result.text.strip()
        start, end = partials.agree(text)
        if end > start:
            self._delta(item_id, text[start:end], result, start, end)
            self.metrics.realtime_delta_latency.observe(time.perf_counter() - launched)

    def _delta(self, item_id: str, delta: str, result: TranscriptionResult, start: int, end: int | None) -> None:
        extra = {"logprobs": token_logprobs(result.segments, start, end)} if self.session.logprobs else {}
        self.send(event("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0,
                        delta=delta, **extra))  # fmt: skip

    def _commit(self, message: dict) -> None:
        tail = self.audio.flush()
        self.samples.append(tail)
        self.num_samples += len(tail)
        if self.num_samples < MIN_COMMIT_MS * SAMPLE_RATE // 1000:
            self.send(error(f"buffer too small: a commit needs at least {MIN_COMMIT_MS} ms of audio",
                            code="input_audio_buffer_commit_empty", event_id=event_id_of(message)))  # fmt: skip
            return
        audio = self._buffered(self.offset, self.offset + self.num_samples)
        self._start_turn(self.item_id or new_id("item"), audio)
        self._reset_stream()

    def _clear(self, message: dict) -> None:
        partials = self.partials.pop(self.item_id, None) if self.item_id is not None else None
        if partials is not None:
            partials.done = True
        self.audio.flush()
        self._reset_stream()
        self.send(event("input_audio_buffer.cleared"))

    # ---- server VAD ---------------------------------------------------------------------------------------------

    def _detect_turns(self, first: int, probs: list[float]) -> None:
        """Turns from the speech probabilities of frames `first`, `first + 1`, ... of the stream."""
        td = self.session.turn_detection
        for i, prob in enumerate(probs, start=first):
            if self.speech_start is None:
                if td.idle_timeout_ms is not None and i * FRAME_MS - self.idle_from_ms >= td.idle_timeout_ms:
                    self._idle_timeout(i * FRAME_MS)
                if prob >= td.threshold:
                    self.speech_start, self.silent_since = i, None
                    self.item_id = new_id("item")
                    self.partial_at = self.num_samples
                    start_ms = max(0, i * FRAME_MS - td.prefix_padding_ms, self.offset * 1000 // SAMPLE_RATE)
                    self.send(event("input_audio_buffer.speech_started", audio_start_ms=start_ms, item_id=self.item_id))
                continue
            if prob >= td.threshold - NEG_THRESHOLD_GAP:
                self.silent_since = None
                continue
            if self.silent_since is None:
                self.silent_since = i
            if (i + 1 - self.silent_since) * FRAME_MS >= td.silence_duration_ms:
                self._end_speech(self.silent_since, i + 1)
        if self.speech_start is None:  # keep only the padding a next turn may start with (or the idle audio)
            keep_from = self.speech.frames_done * FRAME_MS - td.prefix_padding_ms
            if td.idle_timeout_ms is not None:
                keep_from = min(keep_from, self.idle_from_ms)
            self._drop_before(max(0, keep_from) * SAMPLE_RATE // 1000)

    def _end_speech(self, silent_frame: int, end_frame: int) -> None:
        td = self.session.turn_detection
        end_ms = silent_frame * FRAME_MS
        self.send(event("input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=self.item_id))
        start = max(0, self.speech_start * FRAME_MS - td.prefix_padding_ms) * SAMPLE_RATE // 1000
        end = end_frame * FRAME_MS * SAMPLE_RATE // 1000
        self._start_turn(self.item_id, self._buffered(start, end))
        self._drop_before(end)
        self.speech_start = self.silent_since = self.item_id = None
        self.idle_from = end

    @property
    def idle_from_ms(self) -> int:
        return self.idle_from * 1000 // SAMPLE_RATE

    def _idle_timeout(self, now_ms: int) -> None:
        """`idle_timeout_ms` without speech: OpenAI's `timeout_triggered`, and the quiet audio is committed as a
        turn (the model may hear speech the VAD did not)."""
        item_id = new_id("item")
        self.send(event("input_audio_buffer.timeout_triggered", audio_start_ms=self.idle_from_ms, audio_end_ms=now_ms,
                        item_id=item_id))  # fmt: skip
        start = self.idle_from
        end = now_ms * SAMPLE_RATE // 1000
        self._start_turn(item_id, self._buffered(start, end))
        self._drop_before(end)
        self.idle_from = end

    # ---- transcription ------------------------------------------------------------------------------------------

    def _start_turn(self, item_id: str, audio: np.ndarray) -> None:
        partials = self.partials.get(item_id)
        if partials is not None:
            partials.done = True
        previous, self.previous_item_id = self.previous_item_id, item_id
        self.send(event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous))
        self.send(event("conversation.item.added", previous_item_id=previous, item=user_item(item_id, "completed")))
        task = asyncio.ensure_future(self._transcribe(item_id, audio, self.previous_final, time.perf_counter()))
        self.previous_final = task
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)

    async def _transcribe(self, item_id: str, audio: np.ndarray, previous: asyncio.Task | None, ended: float) -> None:
        partials = self.partials.pop(item_id, None)
        self.load.finals_in_flight += 1
        try:
            if previous is not None:  # its transcript is this turn's context
                await asyncio.wait([previous])
            await self._final(item_id, audio, partials, ended)
        finally:
            self.load.finals_in_flight -= 1

    async def _final(self, item_id: str, audio: np.ndarray, partials: Partials | None, ended: float) -> None:
        options = self._options(background=False)
        try:
            handle = self.engine.submit(audio, options)
        except EngineError as exc:
            self._failed(item_id, exc)
            return
        self.handles.add(handle)
        try:
            result = await handle.result()
        except EngineError as exc:
            self._failed(item_id, exc)
            return
        finally:
            self.handles.discard(handle)
        transcript = result.text.strip()
        self._remember(transcript, result)
        start = partials.rest(transcript) if partials is not None else 0
        extra = {"logprobs": token_logprobs(result.segments)} if self.session.logprobs else {}
        try:
            if start < len(transcript):  # after the live deltas, the rest: the deltas joined are the transcript
                self._delta(item_id, transcript[start:], result, start, None)
            self.send(event("conversation.item.input_audio_transcription.completed", item_id=item_id,
                            content_index=0, transcript=transcript,
                            usage={"type": "duration", "seconds": round(len(audio) / SAMPLE_RATE, 3)},
                            **extra))  # fmt: skip
            self.metrics.realtime_completed_latency.observe(time.perf_counter() - ended)
            self.send(event("conversation.item.done", previous_item_id=None,
                            item=user_item(item_id, "completed", transcript)))  # fmt: skip
        except ClientTooSlow:
            await self.ws.close(code=1008)

    def _remember(self, transcript: str, result: TranscriptionResult) -> None:
        """The turn's transcript becomes context for the next ones, unless it took a high temperature to decode
        (Whisper then resets its prompt: such text is likely wrong and would bias what follows)."""
        if not self.settings.realtime_condition_on_previous_text:
            return
        if any(s.temperature > RESET_CONTEXT_TEMPERATURE for s in result.segments):
            self.context = ""
        elif transcript:
            self.context = (self.context + " " + transcript).strip()[-MAX_CONTEXT_CHARS:]

    def _failed(self, item_id: str, exc: Exception) -> None:
        log.info("realtime turn %s failed: %s", item_id, exc)
        with contextlib.suppress(ClientTooSlow):
            self.send(event("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                            error={"type": "transcription_error", "code": getattr(exc, "code", None),
                                   "message": str(exc), "param": None}))  # fmt: skip

"""One realtime transcription session: client events in, turns transcribed by the engine, server events out.

It reads and writes through a transport.py Transport: a WebSocket, or a WebRTC call whose media track brings the
microphone's audio as samples (heard as an append's would be).

The input audio is one stream per connection, kept at 16 kHz (buffers.py). A turn ends by the client's
`input_audio_buffer.commit` or, with server VAD, when turns.py's detector says so; the turn's audio is then an
ordinary request in the engine's shared batch, decoded greedily with Whisper's fallback exactly as
`/v1/audio/transcriptions` decodes a file, so a turn's transcript is the HTTP transcript of the same audio. While
a turn is open, partials.py says when its audio so far is decoded again for live deltas.

Server events go out through a bounded queue drained by one task: a client that does not read them fills it, gets
an `error` and is closed; it never holds up the engine or another connection. A connection that goes away aborts
its turns still decoding, freeing their slots. A client event that fails unexpectedly gets a `server_error` and
the connection keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterator

import numpy as np

from engine import (
    SAMPLE_RATE,
    DecodeOptions,
    EngineDeadError,
    EngineError,
    Handle,
    InvalidRequestError,
    Task,
    TranscriptionResult,
)

from ..errors import APIError
from ..formatting import token_logprobs
from ..metrics import Metrics
from ..parsing.body import parse_json
from ..parsing.options import decode_options
from ..served_models import ServedModels
from ..settings import Settings
from .audio_input import AudioFormatError, InputAudio
from .buffers import InputBuffer, ServerBufferFull
from .events import error, event, new_id, user_item
from .idle import IdleWatch
from .load import OFFLOAD_BASE64, SharedLoad
from .partials import Partials, PartialScheduler
from .session import SessionConfig, SessionError
from .speech_batcher import SpeechBatcher
from .transport import Transport
from .turns import Detection, IdleTimeout, SpeechResumed, SpeechStarted, SpeechStopped, TurnDetector, TurnEnding

log = logging.getLogger(__name__)

MAX_QUEUED_EVENTS = 1024  # server events a client may leave unread before it is closed as too slow
# a session's queued appends heard in one pass, at most (samples): one that floods appends takes its turn like the
# others, a second of audio a pass, instead of holding every session's VAD behind minutes of its own
MAX_HEARD_SAMPLES = SAMPLE_RATE
MIN_COMMIT_MS = 100  # OpenAI's: a commit of less audio is an error
MAX_CONTEXT_CHARS = 4096  # previous transcripts kept as context: more than the 223 tokens Whisper conditions on
RESET_CONTEXT_TEMPERATURE = 0.5  # Whisper's prompt_reset_on_temperature: a turn decoded hotter is not context


def event_id_of(message: dict) -> str | None:
    """The client event's id, to be echoed in an error about it (the SDK's models want a string)."""
    event_id = message.get("event_id")
    return event_id if isinstance(event_id, str) else None


class ClientTooSlow(Exception):
    pass


@dataclasses.dataclass(slots=True)
class EarlyFinal:
    """A turn's final decode started before the server VAD ended the turn (turns.TurnEnding): used if the turn
    ends with this audio and these options, aborted otherwise."""

    audio: np.ndarray
    options: DecodeOptions
    handle: object

    def serves(self, audio: np.ndarray, options: DecodeOptions) -> bool:
        """Whether it is the decode the turn's final would submit."""
        return options == self.options and np.array_equal(audio, self.audio)


class Connection:
    def __init__(
        self, transport: Transport, models: ServedModels, settings: Settings, speech: SpeechBatcher,
        metrics: Metrics, load: SharedLoad, session: dict | None = None,
    ):  # fmt: skip
        self.transport = transport
        self.load = load
        self.models = models  # the session's transcription.model says whose engine decodes its turns
        self.settings = settings
        self.metrics = metrics
        self.session = SessionConfig(settings)
        if session is not None:  # a client secret's configuration, validated when it was minted
            self.session.update(session)
        self.buffer = InputBuffer(self.session.format_type, settings, load)
        self.vad = speech  # shared by the connections: a stream each, pushed together
        self.detector: TurnDetector | None = None  # server VAD's state (None: the client commits)
        self.partials = PartialScheduler(self.buffer, load, self._maybe_partial)
        self.outbox: asyncio.Queue[dict] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self.turns: set[asyncio.Task] = set()
        self.handles: set = set()
        self.previous_item_id: str | None = None
        self.previous_final: asyncio.Task | None = None  # a session's turns are transcribed in order
        self.early: EarlyFinal | None = None
        self.partial_handle = None  # the open turn's partial decode in flight
        # small appends read and not yet heard (their base64, event id, samples reserved), heard in order by one
        # task while the next events are read: a session's appends never wait for its previous ones' passes
        self.unheard: list[tuple[str, str | None, int]] = []
        self.hearing: asyncio.Task | None = None
        self.context = ""  # the previous turns' transcripts (realtime_condition_on_previous_text)
        # (model, language) of the last final detected without a session language: the partials' language
        # (realtime_partials_take_detected_language)
        self.detected: tuple[str, str] | None = None
        self.failures = 0  # client events that raised unexpectedly (the first is logged with its traceback)
        self._reset_stream()

    def _reset_stream(self) -> None:
        """The buffer empties and the stream starts over: no open turn, and a new Silero stream under server VAD."""
        self.buffer.reset()
        tail_ms = self.settings.realtime_turn_tail_ms
        vad = self.session.turn_detection is not None
        self.detector = TurnDetector(self.vad, self.buffer, tail_ms, self.session) if vad else None
        self.partials.restart()
        self._drop_early_final()

    # ---- the connection ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        sender = asyncio.ensure_future(self._send_loop())
        idle_s = self.settings.realtime_idle_timeout_s
        idle = IdleWatch(idle_s)
        try:
            self._load_model()
            self.send(event("session.created", session=self.session.body()))
            while True:
                try:
                    inbound = await idle.receive(self.transport.receive)
                except TimeoutError:
                    self.send(error(f"no event for {idle_s:g} s: the session is closed", code="session_idle_timeout"))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.outbox.join(), 1.0)
                    await self.transport.close(code=1000)
                    break
                if inbound is None:
                    break
                if isinstance(inbound, bytes):
                    self.send(error("binary frames are not part of the protocol; send JSON text events"))
                elif isinstance(inbound, str):
                    await self._handle(inbound)
                else:
                    with self._reporting("the media track's audio", None):
                        await self._track_audio(inbound)
        except ClientTooSlow:
            pass
        finally:
            idle.close()
            self.partials.withdraw()
            self.buffer.num_samples = 0  # out of the server-wide total
            self.buffer.release(self.buffer.reserved)
            self.unheard = []
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
                await self.transport.send_text(json.dumps(item))
            finally:
                self.outbox.task_done()

    async def _handle(self, text: str) -> None:
        """One client event."""
        message = None
        with self._reporting("the event", None):
            message = await self._parse(text)
        if message is None:
            return
        kind, event_id = message["type"], event_id_of(message)
        if kind != "input_audio_buffer.append":
            await self._heard()  # it follows the appends before it, and so does what it answers
        with self._reporting(kind, event_id):
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
                await self._append(message, event_id)
            else:
                handler(message)

    @contextlib.contextmanager
    def _reporting(self, kind: str, event_id: str | None) -> Iterator[None]:
        """What is wrong with a client event (or the track's audio) is an `error` event, and so is what fails
        unexpectedly while it is handled (a `server_error`, logged): the connection goes on either way."""
        try:
            yield
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
            self.buffer.audio = InputAudio(self.session.format_type)
        if (self.session.turn_detection is None) != (old_vad is None):
            self._reset_stream()
        self.partials.set_delay(self.session.delay)
        self._load_model()
        self.send(event("session.updated", session=self.session.body()))

    def _load_model(self) -> None:
        """The session's model, if it is unloaded (--model-ttl-s), starts loading now: its turns will need it."""
        model = self.models.find(self.session.model)
        if model.state == "unloaded":
            self.models.start_loading(model)

    async def _append(self, message: dict, event_id: str | None) -> None:
        """A small append is queued for the hearing task (_hear_appends) and the next event is read at once: with
        hundreds of microphones a pass takes tens of ms, and a session that waited for its append's decode and VAD
        passes before reading the next could not keep up with ten appends a second. A large one is decoded on its
        own after the appends before it."""
        data = message.get("audio")
        if not isinstance(data, str):
            raise AudioFormatError("input_audio_buffer.append needs 'audio', a base64 string")
        if len(data) > OFFLOAD_BASE64:
            await self._heard()
            await self._hear(await self.buffer.decode_large(data))
            return
        self.unheard.append((data, event_id, self.buffer.reserve(data)))
        if self.hearing is None:
            self.hearing = asyncio.ensure_future(self._hear_appends())
            self.turns.add(self.hearing)  # cancelled with the connection
            self.hearing.add_done_callback(self.turns.discard)

    async def _hear_appends(self) -> None:
        """Hear the queued appends in order, each time what arrived meanwhile (up to MAX_HEARD_SAMPLES) in one item
        of the decode pass and one push of the VAD's: a session that fell behind catches up in a pass or two instead
        of one append a pass."""
        try:
            while self.unheard:
                taken, samples = 1, self.unheard[0][2]
                while taken < len(self.unheard) and samples + self.unheard[taken][2] <= MAX_HEARD_SAMPLES:
                    samples += self.unheard[taken][2]
                    taken += 1
                batch, self.unheard = self.unheard[:taken], self.unheard[taken:]
                try:
                    outcomes = await self.load.appends.run((self.buffer.audio, [data for data, _, _ in batch]))
                finally:
                    self.buffer.release(sum(reserved for _, _, reserved in batch))
                heard = []
                for (_, event_id, _), outcome in zip(batch, outcomes):
                    if isinstance(outcome, Exception):
                        with self._reporting("input_audio_buffer.append", event_id):
                            raise outcome
                    else:
                        heard.append(outcome)
                if heard:
                    with self._reporting("input_audio_buffer.append", batch[-1][1]):
                        await self._hear(np.concatenate(heard))
        except ClientTooSlow:
            await self.transport.close(code=1008)
        finally:
            self.hearing = None

    async def _heard(self) -> None:
        """Every append read so far has been heard."""
        while self.hearing is not None:
            await asyncio.wait([self.hearing])

    async def _track_audio(self, samples: np.ndarray) -> None:
        """Samples of the call's media track: an append's worth of the microphone, heard as an append's audio."""
        await self._heard()
        self.buffer.admit(len(samples))
        await self._hear(samples)

    async def _hear(self, samples: np.ndarray) -> None:
        """The session's next input audio: buffered, heard by the server VAD, and maybe a partial decode's due."""
        self.metrics.realtime_audio_seconds.inc(len(samples) / SAMPLE_RATE)
        self.buffer.add(samples)
        detector = self.detector
        if detector is not None:
            first, probs = await detector.hear(samples)
            self._on_detections(detector.detect(self.session.turn_detection, first, probs))
        self._maybe_partial()

    def _maybe_partial(self) -> None:
        """A partial decode of the open turn, if partials.py says one is due; not while its final decode runs, nor
        while the server VAD hears silence after its speech (nothing new to preview, and the engine is then kept
        for the final decode that may follow)."""
        if self.early is not None or (self.detector is not None and self.detector.silent_since is not None):
            return
        if self.detector is None:
            start = self.buffer.offset
        else:
            start = self.detector.turn_start(self.session.turn_detection)
        launched = self.partials.launch(start)
        if launched is None:
            return
        item_id, partials, audio = launched
        task = asyncio.ensure_future(self._partial(item_id, partials, audio, time.perf_counter()))
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)

    def _submit(self, audio: np.ndarray, options: DecodeOptions) -> Handle:
        """A decode of the session's audio on its model's engine (EngineDeadError while that engine is down)."""
        try:
            engine = self.models.engine(self.session.model)
        except APIError as exc:
            raise EngineDeadError(exc.message) from None
        return engine.submit(audio, options)

    def _options(self, background: bool) -> DecodeOptions:
        """A turn's decode: the HTTP route's, with the session's language and prompt (then its previous
        transcripts). A partial one takes the language the last final was detected in where the session sets none
        (realtime_partials_take_detected_language), and is greedy only (one beam, no fallback), in the background
        and on a short context (realtime_short_partials): a preview, soon refreshed, that waits for every other
        window; the final decode is a full window with Whisper's fallback."""
        prompt = " ".join(p for p in (self.session.prompt, self.context) if p) or None
        language = self.session.language
        detected = self.detected
        if background and language is None and detected is not None and detected[0] == self.session.model:
            language = detected[1]  # a preview: the language the session's last final was detected in
        options = decode_options(Task.TRANSCRIBE, language, prompt, 0.0, settings=self.settings)
        options = dataclasses.replace(
            options, logprobs=self.session.logprobs, adapter=self.models.adapter(self.session.model)
        )
        if background:
            margin = self.settings.realtime_partial_margin_s if self.settings.realtime_short_partials else None
            options = dataclasses.replace(
                options, temperatures=(0.0,), background=True, beam_size=1, context_margin_s=margin,
                without_timestamps=True,
            )  # fmt: skip
        return options

    async def _partial(self, item_id: str, partials: Partials, audio: np.ndarray, launched: float) -> None:
        # the words sent so far lead the decode as its transcript's start (realtime_partial_prefix): it decodes the
        # rest only, where decoding the whole turn again would cost more at every refresh as the turn grows
        prefix = partials.sent_text if self.settings.realtime_partial_prefix and partials.prefixed else ""
        options = self._options(background=True)
        try:
            try:
                handle = self._submit(audio, dataclasses.replace(options, prefix=prefix or None))
            except InvalidRequestError as exc:
                if exc.param != "prefix":
                    raise
                partials.prefixed, prefix = False, ""  # the words outgrew the room for a prefix: the whole turn
                handle = self._submit(audio, options)
        except EngineError:
            self.partials.finished(partials)
            return
        self.handles.add(handle)
        self.partial_handle = handle
        try:
            result = await handle.result()
        except EngineError:
            return
        finally:
            self.handles.discard(handle)
            if self.partial_handle is handle:
                self.partial_handle = None
            self.partials.finished(partials)
        if partials.done:
            return
        added = "".join(s.text for s in result.segments)  # after the prefix: its leading space is the words'
        text = (prefix + added).strip() if prefix else result.text.strip()
        start, end = partials.agree(text)
        log.debug("partial decode of %.2f s of a turn: %.3f s, %d characters of prefix", len(audio) / SAMPLE_RATE,
                  time.perf_counter() - launched, len(prefix))  # fmt: skip
        self.metrics.realtime_partial_decodes.labels("yes" if prefix else "no").inc()
        if end > start:
            # the result's logprobs are those of what it added: offsets into its own text
            shift = len(prefix) + len(added) - len(added.lstrip()) if prefix else 0
            self._delta(item_id, text[start:end], result, start - shift, end - shift)
            self.metrics.realtime_delta_latency.observe(time.perf_counter() - launched)

    def _delta(self, item_id: str, delta: str, result: TranscriptionResult, start: int, end: int | None) -> None:
        # a partial decode's prefix has no logprobs: a delta's part inside it gets none
        start, end = max(start, 0), None if end is None else max(end, 0)
        extra = {"logprobs": token_logprobs(result.segments, start, end)} if self.session.logprobs else {}
        self.send(event("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0,
                        delta=delta, **extra))  # fmt: skip

    def _commit(self, message: dict) -> None:
        buffer = self.buffer
        buffer.add(buffer.audio.flush())
        if buffer.num_samples < MIN_COMMIT_MS * SAMPLE_RATE // 1000:
            self.send(error(f"buffer too small: a commit needs at least {MIN_COMMIT_MS} ms of audio",
                            code="input_audio_buffer_commit_empty", event_id=event_id_of(message)))  # fmt: skip
            return
        audio = buffer.buffered(buffer.offset, buffer.end)
        self._start_turn(buffer.item_id or new_id("item"), audio)
        self._reset_stream()

    def _clear(self, message: dict) -> None:
        self.partials.discard(self.buffer.item_id)
        self.buffer.audio.flush()  # what the decoder holds goes too
        self._reset_stream()
        self.send(event("input_audio_buffer.cleared"))

    # ---- server VAD ---------------------------------------------------------------------------------------------

    def _on_detections(self, detections: Iterator[Detection]) -> None:
        """What the detector finds, each handled before it reads on: the buffer's events, and the turns committed."""
        for found in detections:
            if isinstance(found, SpeechStarted):
                self.partials.restart(found.voice_at)
                self.send(event("input_audio_buffer.speech_started", audio_start_ms=found.audio_start_ms,
                                item_id=found.item_id))  # fmt: skip
            elif isinstance(found, SpeechStopped):
                self.send(event("input_audio_buffer.speech_stopped", audio_end_ms=found.audio_end_ms,
                                item_id=found.item_id))  # fmt: skip
            elif isinstance(found, TurnEnding):
                self._start_early_final(found.audio)
            elif isinstance(found, SpeechResumed):
                self._drop_early_final()
            elif isinstance(found, IdleTimeout):
                self.send(event("input_audio_buffer.timeout_triggered", audio_start_ms=found.audio_start_ms,
                                audio_end_ms=found.audio_end_ms, item_id=found.item_id))  # fmt: skip
            else:
                self._start_turn(found.item_id, found.audio)

    def _start_early_final(self, audio: np.ndarray) -> None:
        """The turn's final decode, now, if the server allows it and the session's earlier turns are transcribed
        (the last one's transcript is this one's context)."""
        if not self.settings.realtime_early_final:
            return
        if self.previous_final is not None and not self.previous_final.done():
            return
        options = self._options(background=False)
        try:
            handle = self._submit(audio, options)
        except EngineError:
            return  # the final decode submits again, and says what is wrong
        self.handles.add(handle)
        self.early = EarlyFinal(audio, options, handle)
        if self.partial_handle is not None:  # a preview of the turn is moot now: the engine is the final's
            self.partial_handle.abort()

    def _drop_early_final(self) -> None:
        """The open turn's early final decode, if any, is not its final: aborted."""
        self._abort_early(self.early)
        self.early = None

    def _abort_early(self, early: EarlyFinal | None) -> None:
        if early is not None:
            early.handle.abort()
            self.handles.discard(early.handle)
            self.metrics.realtime_early_finals.labels("dropped").inc()

    # ---- transcription ------------------------------------------------------------------------------------------

    def _start_turn(self, item_id: str, audio: np.ndarray) -> None:
        early, self.early = self.early, None  # the open turn's, if its final decode started early
        self.partials.commit(item_id)
        previous, self.previous_item_id = self.previous_item_id, item_id
        self.send(event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous))
        self.send(event("conversation.item.added", previous_item_id=previous, item=user_item(item_id, "completed")))
        task = asyncio.ensure_future(self._transcribe(item_id, audio, self.previous_final, time.perf_counter(), early))
        self.previous_final = task
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)

    async def _transcribe(
        self, item_id: str, audio: np.ndarray, previous: asyncio.Task | None, ended: float, early: EarlyFinal | None
    ) -> None:
        partials = self.partials.take(item_id)
        self.load.finals_in_flight += 1
        try:
            if previous is not None:  # its transcript is this turn's context
                await asyncio.wait([previous])
            await self._final(item_id, audio, partials, ended, early)
        finally:
            self.load.final_finished()

    async def _final(
        self, item_id: str, audio: np.ndarray, partials: Partials | None, ended: float, early: EarlyFinal | None
    ) -> None:
        options = self._options(background=False)
        handle = None
        if early is not None and early.serves(audio, options):
            handle = early.handle
            self.metrics.realtime_early_finals.labels("used").inc()
        elif early is not None:  # the session's prompt or language changed meanwhile
            self._abort_early(early)
        if handle is None:
            with contextlib.suppress(APIError):  # a model loading on demand is waited for (_submit says the rest)
                await self.models.ready(self.session.model)
            try:
                handle = self._submit(audio, options)
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
        if self.session.language is None and self.settings.realtime_partials_take_detected_language:
            self.detected = (self.session.model, result.language) if result.language else None
        start = partials.rest(transcript) if partials is not None else 0
        extra = {"logprobs": token_logprobs(result.segments)} if self.session.logprobs else {}
        try:
            # after the live deltas, the rest: the deltas joined are the transcript's words (a live delta may carry an
            # earlier decode's case or punctuation)
            if start < len(transcript):
                self._delta(item_id, transcript[start:], result, start, None)
            self.send(event("conversation.item.input_audio_transcription.completed", item_id=item_id,
                            content_index=0, transcript=transcript,
                            usage={"type": "duration", "seconds": round(len(audio) / SAMPLE_RATE, 3)},
                            **extra))  # fmt: skip
            self.metrics.realtime_completed_latency.observe(time.perf_counter() - ended)
            self.send(event("conversation.item.done", previous_item_id=None,
                            item=user_item(item_id, "completed", transcript)))  # fmt: skip
        except ClientTooSlow:
            await self.transport.close(code=1008)

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

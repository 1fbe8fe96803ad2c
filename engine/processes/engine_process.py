"""EngineProcess: the engine in a child process of its own, behind the Engine's interface.

Why: in one process the HTTP side (the event loop, multipart parsing, audio decoding, responses) and the engine's
loop thread share one GIL, and the loop's host work between GPU steps then waits for it: under HTTP load its steps
take longer than at the engine level, which caps the HTTP throughput however fast the GPU kernels are. In its own
process the loop has a GIL to itself (`benchmarks/http_load.py --spawn "... --engine-process on"` against `off`).
What crosses the process boundary: each request's float32 samples (one pipe write of their bytes, no pickling) and
small pickled messages: options, segment events, results, errors, stats.

Protocol: two one-way pipes of the typed messages in engine/messages.py; the parent writes from one sender thread,
so a full pipe never blocks its caller. Given an address to listen on, the child also serves other processes (the
server's further front-ends, each an EngineClient) over a Unix socket with the same messages: the engine then
batches every front-end's requests together, and each request's events go back on the connection it came from.
  parent -> child: Submit (followed by the samples' bytes), Abort, StatsQuery, Shutdown
  child -> parent: Ready or Failed once; Started when a request stops waiting (its first window got a slot, or it
                   ended first: the parent's backpressure count, as Engine's own); Event for each segment event, the
                   result or an error; Stats; Dead
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import socket
import threading

import numpy as np

from engine.audio.constants import N_SAMPLES
from engine.config import EngineConfig
from engine.frontend import EngineFront, RequestHandle, check_audio
from engine.messages import (
    Abort,
    AdapterChanged,
    ChangeAdapter,
    Dead,
    Event,
    Failed,
    Ready,
    Shutdown,
    Started,
    Stats,
    StatsQuery,
    Submit,
)
from engine.model.lora import AdapterError
from engine.processes.child import parent_setup, setup_child
from engine.request import (
    DecodeOptions,
    EngineDeadError,
    EngineOverloadedError,
    EngineStats,
    TranscriptionResult,
)
from engine.runtime.engine import ADAPTER_CHANGE_TIMEOUT_S, Engine

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 5.0
# The child stops between two steps; past this it is terminated, so that a stop stays within an orchestrator's
# grace period (docker stop: 10 s, the server's drain included).
SHUTDOWN_TIMEOUT_S = 3.0


class _EngineLink(EngineFront):
    """Engine's interface (submit, abort, stats, is_alive, tokenizer, shutdown) over a connection to an engine
    process: `outgoing` carries requests to it, `incoming` its replies (two pipes, or one socket both ways)."""

    def __init__(self, config: EngineConfig, incoming, outgoing, first: Ready):
        self.config = config
        self._events, self._requests = incoming, outgoing
        self.tokenizer, self.n_text_ctx, self.num_slots = first.tokenizer, first.n_text_ctx, first.num_slots
        self.adapter_names = first.adapter_names
        self._ids = itertools.count()
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._handles: dict[str, RequestHandle] = {}
        self._windows: dict[str, int] = {}  # the 30 s windows of each request in flight (EnginePool's load)
        self._unstarted: set[str] = set()  # sent, first window not yet in a slot: bounded by max_waiting
        self._replies: dict[int, tuple[threading.Event, list]] = {}  # awaited replies, by token (_ask)
        self._dead: str | None = None
        self._pipe_broken = False  # a send failed: the child is gone, though not yet reaped
        self._started = False
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._send_forever, name="engine-process-send", daemon=True).start()
        threading.Thread(target=self._receive_forever, name="engine-process-receive", daemon=True).start()

    # ---- Engine's interface -----------------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        return self._started and self._dead is None and not self._pipe_broken and self._peer_alive()

    @property
    def failure(self) -> str | None:
        """Why the engine stopped serving this link, once it has."""
        if self._dead is None and self._pipe_broken:
            return "the engine process stopped taking requests"
        return self._dead

    def _peer_alive(self) -> bool:
        return True

    def start(self) -> None:
        self._started = True

    def submit(self, audio: np.ndarray, options: DecodeOptions) -> RequestHandle:
        """Queue a request; raises InvalidRequestError, EngineOverloadedError or EngineDeadError (as Engine)."""
        if not self.is_alive:
            raise EngineDeadError(f"the engine is not running{f': {self._dead}' if self._dead else ''}")
        audio = np.ascontiguousarray(check_audio(audio), dtype=np.float32)
        options = self.prepare(options)
        request_id = f"req-{next(self._ids)}"
        handle = RequestHandle(self, request_id)  # type: ignore[arg-type]  (it needs only abort())
        with self._lock:
            if len(self._unstarted) >= self.config.max_waiting:
                raise EngineOverloadedError(f"{len(self._unstarted)} requests are already waiting; retry later")
            self._unstarted.add(request_id)
            self._handles[request_id] = handle
            self._windows[request_id] = -(-len(audio) // N_SAMPLES) or 1
        self._outbox.put((Submit(request_id, options, len(audio)), audio))
        return handle

    def abort(self, request_id: str) -> None:
        self._outbox.put((Abort(request_id), None))

    @property
    def load(self) -> int:
        """The windows of the requests sent and not yet finished (waiting or decoding): counted here, without a
        round trip to the child."""
        with self._lock:
            return sum(self._windows.values())

    def stats(self) -> EngineStats:
        stats: EngineStats = self._ask(StatsQuery, STATS_TIMEOUT_S, "for its stats")
        with self._lock:
            stats.num_waiting = len(self._unstarted)  # the parent's count is the one that max_waiting bounds
        return stats

    def change_adapter(self, name: str, folder: str | None) -> None:
        """Engine.change_adapter in the child: AdapterError says why not."""
        error = self._ask(lambda token: ChangeAdapter(name, folder, token=token), ADAPTER_CHANGE_TIMEOUT_S,
                          "the adapter change")  # fmt: skip
        if error is not None:
            raise AdapterError(error)
        self.adapter_names = self.adapter_names | {name} if folder is not None else self.adapter_names - {name}

    def _ask(self, message, timeout_s: float, what: str):
        """Send the child message(token) and wait for its reply of that token (Stats, AdapterChanged)."""
        token = next(self._tokens)
        done, reply = threading.Event(), []
        self._replies[token] = (done, reply)
        self._outbox.put((message(token), None))
        try:
            if not done.wait(timeout_s):
                raise EngineDeadError(f"the engine process did not answer {what}")
        finally:
            self._replies.pop(token, None)
        return reply[0]

    # ---- threads ----------------------------------------------------------------------------------

    def _send_forever(self) -> None:
        while (item := self._outbox.get()) is not None:
            message, samples = item
            try:
                self._requests.send(message)
                if samples is not None:
                    self._requests.send_bytes(memoryview(samples).cast("B"))
            except (OSError, ValueError):  # the child is gone; the receiver reports it
                self._pipe_broken = True
                if isinstance(message, Submit):  # never delivered, so never started
                    self._finish(message.request_id, EngineDeadError("the engine process is not running", True))

    def _receive_forever(self) -> None:
        try:
            while True:
                message = self._events.recv()
                if isinstance(message, Event):
                    if isinstance(message.item, (TranscriptionResult, BaseException)):  # the request's last event
                        self._finish(message.request_id, message.item)
                    elif (handle := self._handles.get(message.request_id)) is not None:
                        handle.emit(message.item)
                elif isinstance(message, Started):
                    with self._lock:
                        self._unstarted.discard(message.request_id)
                elif isinstance(message, Stats | AdapterChanged):
                    waiter = self._replies.get(message.token)
                    if waiter is not None:
                        waiter[1].append(message.stats if isinstance(message, Stats) else message.error)
                        waiter[0].set()
                elif isinstance(message, Dead):
                    self._mark_dead(message.reason)
        except (EOFError, OSError):
            self._mark_dead(self._closed_reason())

    def _closed_reason(self) -> str:
        """Why the engine's end of the connection closed (read once it has)."""
        return "the connection to the engine process closed"

    def _mark_dead(self, reason: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = reason
            handles, self._handles = self._handles, {}
            unstarted, self._unstarted = self._unstarted, set()
            self._windows.clear()
        for request_id, handle in handles.items():
            handle.emit(EngineDeadError(reason, unstarted=request_id in unstarted))

    def _finish(self, request_id: str, item: object) -> None:
        """A request's last event (its result or error): the handle gets it and is forgotten."""
        with self._lock:
            handle = self._handles.pop(request_id, None)
            self._unstarted.discard(request_id)
            self._windows.pop(request_id, None)
        if handle is not None:
            handle.emit(item)


class EngineProcess(_EngineLink):
    """The engine in a child process this one starts and stops; with `listen` (a Unix socket's path and the key
    that authenticates its clients), other processes may connect to it as EngineClients."""

    def __init__(self, config: EngineConfig, gpu: int | None = None, listen: tuple[str, bytes] | None = None):
        """`gpu`: the index of the one GPU the child may see (data parallel: one per engine); None: all of them."""
        self.gpu = gpu
        self.address = listen
        # spawn, not fork: the parent may already hold CUDA or OpenMP state that a forked child cannot use
        ctx = multiprocessing.get_context("spawn")
        events, child_out = ctx.Pipe(duplex=False)
        child_in, requests = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_child_main, args=(config, parent_setup(), child_in, child_out, listen), name="whisper-engine",
            daemon=True,
        )  # fmt: skip
        with _visible_gpu(gpu):
            self._process.start()
        child_in.close()
        child_out.close()  # the parent keeps only its ends, so the child's exit reads as end-of-file here
        try:
            first = events.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(f"the engine process exited while loading (exit code {self._process.exitcode})")
        if isinstance(first, Failed):
            self._process.join()
            raise first.error
        super().__init__(config, events, requests, first)

    @property
    def failure(self) -> str | None:
        if self._dead is None and self._started and not self._process.is_alive():
            return f"the engine process exited (exit code {self._process.exitcode})"
        return super().failure

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _peer_alive(self) -> bool:
        return self._process.is_alive()

    def _closed_reason(self) -> str:
        self._process.join(timeout=2)  # the pipe closes as the child dies: let it be reaped for its exit code
        code = self._process.exitcode
        return f"the engine process exited (exit code {code})" if code is not None else "pipe closed"

    def shutdown(self) -> None:
        self._outbox.put((Shutdown(), None))
        self._process.join(timeout=SHUTDOWN_TIMEOUT_S)
        if self._process.is_alive():
            log.warning("the engine process did not stop in %.0f s; terminating it", SHUTDOWN_TIMEOUT_S)
            self._process.terminate()
            self._process.join(timeout=5)
        self._outbox.put(None)
        self._mark_dead("the engine was shut down")


class EngineClient(_EngineLink):
    """A connection to an engine process that another process started with `listen`: the same interface, and its
    requests batched with everyone else's there. shutdown() closes the connection only; the engine serves on.
    Raises OSError (nothing listens there yet, or any more) or multiprocessing's AuthenticationError."""

    def __init__(self, config: EngineConfig, address: tuple[str, bytes], pid: int | None = None):
        path, key = address
        connection = multiprocessing.connection.Client(path, family="AF_UNIX", authkey=key)
        try:
            first = connection.recv()
        except EOFError:
            connection.close()
            raise ConnectionError("the engine process closed the connection") from None
        self.pid = pid
        super().__init__(config, connection, connection, first)

    def shutdown(self) -> None:
        self._outbox.put(None)
        self._mark_dead("the connection to the engine was closed")
        # shut down, not only closed: that ends the receiving thread's read, and the engine aborts what is left
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._events.fileno())) as end:
            end.shutdown(socket.SHUT_RDWR)


_environment = threading.Lock()


@contextlib.contextmanager
def _visible_gpu(gpu: int | None):
    """The environment a child starts with: CUDA_VISIBLE_DEVICES set to the one GPU, for the child's whole life
    (set in the child instead, it would come too late if anything there initialised CUDA while importing)."""
    if gpu is None:
        yield
        return
    with _environment:
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = saved.split(",") if saved else None
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[gpu] if visible else str(gpu)
        try:
            yield
        finally:
            if saved is None:
                del os.environ["CUDA_VISIBLE_DEVICES"]
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved


# ---- the child ------------------------------------------------------------------------------------


class _Outlet:
    """One connection back from the child (to its parent, or to a client): each message pickled and written whole,
    by whichever thread sends it (the loop's events and Started, the link's replies)."""

    def __init__(self, connection):
        self.connection = connection
        self._lock = threading.Lock()

    def __call__(self, message: Ready | Failed | Started | Event | Stats | AdapterChanged | Dead) -> None:
        try:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - an unpicklable error still has to reach its request
            if isinstance(message, Event):
                message = Event(message.request_id, RuntimeError(repr(message.item)))
            elif isinstance(message, Failed):
                message = Failed(RuntimeError(repr(message.error)))
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            log.debug("unpicklable %s: %s", type(message).__name__, exc)
        with self._lock:
            try:
                self.connection.send_bytes(data)
            except OSError:  # that end is gone: the parent's loop ends at end-of-file, a client's thread too
                pass


class _ForwardingHandle(RequestHandle):
    """A request's handle in the child: each event goes back on the connection the request came from."""

    def __init__(self, engine: _ChildEngine, request_id: str):
        super().__init__(engine, request_id)
        self._child = engine

    def emit(self, item: object) -> None:
        send, request_id = self._child.route(self.request_id)
        if isinstance(item, (TranscriptionResult, BaseException)):  # its last event
            self._child.routes.pop(self.request_id, None)
        send(Event(request_id, item))


class _ChildEngine(Engine):
    def __init__(self, config: EngineConfig, send: _Outlet):
        self.send = send
        # the clients' requests in flight: the id here (the client's, prefixed) -> (its connection, its id there)
        self.routes: dict[str, tuple[_Outlet, str]] = {}
        super().__init__(config)

    def route(self, request_id: str) -> tuple[_Outlet, str]:
        """Where a request's events go, and under which id: the parent's requests are not in `routes`."""
        return self.routes.get(request_id) or (self.send, request_id)

    def make_handle(self, request_id: str) -> RequestHandle:
        return _ForwardingHandle(self, request_id)

    def on_started(self, request_id: str) -> None:
        send, own = self.route(request_id)
        send(Started(own))


def _answer(engine: _ChildEngine, message, connection, send: _Outlet, prefix: str = "") -> bool:
    """Do what one message from a link asks (its Submit's samples read from `connection`); True for Shutdown. A
    client's request ids are prefixed here, so that no two links' ids meet in the engine."""
    if isinstance(message, Submit):
        samples = np.empty(message.num_samples, dtype=np.float32)  # received in place: one copy, writable
        connection.recv_bytes_into(samples)
        request_id = prefix + message.request_id
        if prefix:
            engine.routes[request_id] = (send, message.request_id)
        try:
            engine.submit_checked(samples, message.options, request_id=request_id)
        except Exception as exc:  # noqa: BLE001 - the request's own error, sent to its handle
            engine.routes.pop(request_id, None)
            send(Event(message.request_id, exc))
    elif isinstance(message, Abort):
        engine.abort(prefix + message.request_id)
    elif isinstance(message, StatsQuery):
        send(Stats(message.token, engine.stats()))  # the link replaces num_waiting with its own count
    elif isinstance(message, ChangeAdapter):
        try:
            engine.change_adapter(message.name, message.folder)
        except AdapterError as exc:
            send(AdapterChanged(message.token, str(exc)))
        else:
            send(AdapterChanged(message.token, None))
    elif isinstance(message, Shutdown):
        return not prefix  # only the parent stops the engine
    return False


class _Clients:
    """The other processes connected to this engine (listen): each served by a thread of its own, which aborts its
    requests when it disconnects."""

    def __init__(self, engine: _ChildEngine, address: tuple[str, bytes]):
        self.engine = engine
        path, key = address
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by a child of this engine that was killed (a restart binds the same path)
        self.listener = multiprocessing.connection.Listener(path, family="AF_UNIX", authkey=key)
        self.outlets: set[_Outlet] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept_forever, name="engine-clients", daemon=True).start()

    def _accept_forever(self) -> None:
        for number in itertools.count(1):
            try:
                connection = self.listener.accept()
            except (multiprocessing.AuthenticationError, EOFError, ConnectionError):
                continue  # a wrong key, or a client gone during the handshake
            except OSError:  # the listener was closed
                return
            threading.Thread(target=self._serve, args=(connection, f"c{number}/"), name=f"engine-client-{number}",
                             daemon=True).start()  # fmt: skip

    def _serve(self, connection, prefix: str) -> None:
        send = _Outlet(connection)
        send(_ready(self.engine))
        with self._lock:
            self.outlets.add(send)
        try:
            while True:
                _answer(self.engine, connection.recv(), connection, send, prefix)
        except (EOFError, OSError):
            pass
        finally:
            with self._lock:
                self.outlets.discard(send)
            for request_id, (outlet, _) in list(self.engine.routes.items()):
                if outlet is send:  # nobody is left to read them
                    self.engine.routes.pop(request_id, None)
                    self.engine.abort(request_id)
            connection.close()

    def broadcast(self, message: Dead) -> None:
        with self._lock:
            outlets = list(self.outlets)
        for send in outlets:
            send(message)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # its file may be gone with its folder already
            self.listener.close()  # removes the socket's file


def _ready(engine: Engine) -> Ready:
    """What a link learns of the engine as it connects (the adapters as they are now)."""
    return Ready(engine.tokenizer, engine.n_text_ctx, engine.num_slots, engine.adapter_names)


def _child_main(config: EngineConfig, setup: tuple, inbox, outbox, listen: tuple[str, bytes] | None) -> None:
    setup_child(setup)
    send = _Outlet(outbox)
    # The parent enforces max_waiting over what it has sent (each client over its own); the child's own count
    # would refuse a burst the parent already admitted while it crossed the pipe.
    config = dataclasses.replace(config, max_waiting=1 << 30)
    try:
        engine = _ChildEngine(config, send)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it from EngineProcess()
        send(Failed(exc))
        return
    engine.start()
    # What loading made (the model's modules, the tokenizer, the graphs' tensors) lives as long as this process:
    # frozen out of garbage collection, a full collection walks only what requests allocate (a full collection over
    # a loaded tiny.en's objects took 150-200 ms on a 2-core CPU, a pause of the loop and every step it launches)
    gc.collect()
    gc.freeze()
    try:
        clients = _Clients(engine, listen) if listen is not None else None
    except OSError as exc:
        send(Failed(OSError(f"the engine process cannot listen for clients: {exc}")))
        engine.shutdown()
        return
    send(_ready(engine))
    reported_dead = False
    while True:
        if not inbox.poll(0.5):
            if not engine.is_alive and not reported_dead:
                send(Dead("the engine loop stopped"))
                if clients is not None:
                    clients.broadcast(Dead("the engine loop stopped"))
                reported_dead = True
            continue
        try:
            message = inbox.recv()
        except EOFError:
            break
        if _answer(engine, message, inbox, send):
            break
    if clients is not None:
        clients.close()
    engine.shutdown()

"""What every child process of the engine's needs from its parent: its logging (the parent's level, format and
filters, where they can cross the pipe), its GIL switch interval, a name for ps and top, and no Ctrl-C of its own;
and ChildProcess, a child that answers each message on its pipe (the diarizer's, Silero's).
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import signal
import sys
from collections.abc import Callable

STOP_TIMEOUT_S = 10.0


class ChildProcess:
    """A spawned child running `target(conn, setup, *args)`, which answers each message with ("ok", payload) or
    ("error", exception) and returns on ("stop",). Started by the first call, and again by the first call after it
    died. One call at a time: its owner holds a lock."""

    def __init__(self, target: Callable, args: tuple, name: str, what: str):
        self.target, self.args, self.name, self.what = target, args, name, what
        self.process = None
        self.conn = None

    def call(self, message: tuple, timeout_s: float | None = None):
        """The child's payload for `message` (its exception raised); RuntimeError if the child exits meanwhile or
        does not answer within `timeout_s`."""
        if self.process is None or not self.process.is_alive():
            self._start()
        try:
            self.conn.send(message)
            if timeout_s is not None and not self.conn.poll(timeout_s):
                self.stop()
                raise RuntimeError(f"the {self.what} did not answer within {timeout_s:g} s")
            status, payload = self.conn.recv()
        except (EOFError, OSError) as exc:
            code = self.process.exitcode
            self.stop()
            raise RuntimeError(f"the {self.what} exited (exit code {code})") from exc
        if status == "error":
            raise payload
        return payload

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
        self.process = self.conn = None

    def _start(self) -> None:
        self.stop()
        # spawn, not fork: the server's process holds OpenMP, CUDA and engine threads that a forked child cannot use
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=self.target, args=(child, parent_setup(), *self.args), name=self.name, daemon=True
        )
        self.process.start()
        child.close()  # only the child holds its end: its exit reads as end-of-file here


def picklable(obj):
    """`obj` if it can be sent to a child (a formatter writing to a terminal cannot), else None."""
    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - whatever pickling raises, the child does without it
        return None
    return obj


def parent_setup() -> tuple:
    """What setup_child needs, read in the parent: its logging and its switch interval."""
    root = logging.getLogger()
    handler = root.handlers[0] if root.handlers else None
    formatter = picklable(handler.formatter) if handler else None
    filters = [f for f in (handler.filters if handler else []) if picklable(f) is not None]
    return root.level, formatter, filters, sys.getswitchinterval()


def setup_child(setup: tuple, name: str | None = None) -> None:
    """In the child, first: it logs and switches threads as its parent does, ignores Ctrl-C (it reaches the whole
    process group, and the parent stops its children) and, given `name`, is named so for ps and top."""
    level, formatter, filters, switch_interval = setup
    handler = logging.StreamHandler()
    if formatter is not None:
        handler.setFormatter(formatter)
    for log_filter in filters:
        handler.addFilter(log_filter)
    logging.basicConfig(level=level, handlers=[handler])
    sys.setswitchinterval(switch_interval)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if name is not None:
        name_process(name)


def name_process(name: str) -> None:
    """This thread's name for ps and top (Linux, at most 15 characters; threads started later take it too)."""
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)
    except OSError:  # not Linux
        pass

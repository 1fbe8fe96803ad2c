"""What every child process of the engine's needs from its parent: its logging (the parent's level, format and
filters, where they can cross the pipe), its GIL switch interval, a name for ps and top, and no Ctrl-C of its own.
"""

from __future__ import annotations

import logging
import pickle
import signal
import sys


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

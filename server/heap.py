"""The server process's heap and Python's cyclic garbage collector.

The objects that exist once the server is up (the modules, and with an engine in this process the model, its
weights' wrappers and the tokenizer) live as long as the process. A full collection walks every tracked object, and
those are most of them: in a tiny.en server on a CPU each full collection paused the event loop for 150-200 ms,
a stall of every request, realtime session and /health at once, at whatever moment the allocation counts triggered
it (1,000 realtime sessions connecting: `benchmarks/realtime_idle.py`). Frozen after start-up (gc.freeze, as
Instagram's and other long-lived servers do), they are left out of every collection; what requests allocate is
collected as before.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_objects() -> None:
    """Collect what start-up left behind, then move every surviving object to the permanent generation."""
    gc.collect()
    gc.freeze()
    log.debug("%d objects frozen out of garbage collection", gc.get_freeze_count())

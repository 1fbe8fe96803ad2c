"""Running the HTTP server: one front-end process (uvicorn on the app), the only one or one of --api-servers."""

from __future__ import annotations

import logging.config
import os
import signal
import socket
import sys
import threading
import time

from .frontends import WATCH_S, FrontEndPlan, FrontEnds
from .settings import Settings


def run_server(
    settings: Settings,
    plan: FrontEndPlan | None = None,
    sockets: list[socket.socket] | None = None,
    ready: threading.Event | None = None,
) -> int:
    """One HTTP front-end: the only one, or one of --api-servers (`plan`), on `sockets` (the first binds them);
    `ready` is set once it serves (the first front-end waits for the others')."""
    import uvicorn

    from .app import create_app
    from .drain import DRAIN_FLUSH_S, DrainingServer
    from .logs import log_config

    # The engine loop thread gives up the GIL at every GPU sync and must get it back quickly to launch the
    # next step while the event loop parses uploads; with Python's 5 ms default it waits a whole interval
    # (`benchmarks/http_load.py --spawn "... --switch-interval-ms 5"` against the default).
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    # torch in this process (voice activity, diarization, an in-process engine) uses the cores it may use: its
    # default is the machine's, whatever a container's CPU quota
    import torch

    from engine import available_cpus

    torch.set_num_threads(min(torch.get_num_threads(), available_cpus()))

    app = create_app(plan.front_end_settings(settings) if plan is not None else settings, frontend=plan)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=log_config(settings.log_level, settings.log_format),
        log_level=settings.log_level,
        # after the drain timeout the requests still running are answered 503: this leaves time to send that
        timeout_graceful_shutdown=settings.drain_timeout_s + DRAIN_FLUSH_S,
        # a realtime session reads its events one at a time: bound what uvicorn holds for it to its next event
        ws_max_size=settings.ws_max_message_bytes,
        ws_max_queue=settings.ws_max_queued_messages,
        # no permessage-deflate: base64 audio shrinks by a quarter at best, and uvicorn inflates a message on the
        # event loop (a 15 MiB append stalls every request for that long), to ws_max_size from a few KiB sent
        ws_per_message_deflate=False,
        # head and body read deadlines, connections per address (server/deadlines.py)
        http=DrainingServer.http_protocol(settings),
    )
    server = DrainingServer(config, app.state.drain)
    if plan is not None and plan.first:  # the others are handed the bound socket once the engines are up
        sockets = [config.bind_socket()]
        front_ends = FrontEnds(settings, plan, sockets, front_end_main)
        app.state.on_start.append(front_ends.start)
        app.state.on_stop.insert(0, front_ends.stop)  # before what they share stops

        async def remove_folder() -> None:
            # here, not after run(): uvicorn ends a process stopped by a signal with that signal again. The engines'
            # processes, which stop after this, find their sockets gone.
            plan.remove()

        app.state.on_stop.append(remove_folder)
        server.on_exit.append(front_ends.pass_stop)
    if ready is not None:

        async def serving() -> None:
            ready.set()

        app.state.on_start.append(serving)
    server.run(sockets=sockets)
    return 0


def front_end_main(settings: Settings, plan: FrontEndPlan, sockets: list[socket.socket], ready) -> None:
    """A further front-end process (frontends.py): the app, its engines reached over their sockets, served on the
    shared socket until SIGTERM, or until the first front-end is gone."""
    from .logs import log_config

    logging.config.dictConfig(log_config(settings.log_level, settings.log_format))
    parent = os.getppid()

    def orphaned() -> None:  # the first front-end was killed without a word (SIGKILL): do not serve on alone
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=orphaned, name="front-end-parent", daemon=True).start()
    sys.exit(run_server(settings, plan, sockets, ready))

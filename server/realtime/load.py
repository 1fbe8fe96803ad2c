"""What the realtime sessions of one server share: how many are open, the decodes they have in flight, the audio
they buffer, the one worker thread that takes their large events, and the passes that decode their small ones.

Each connection reads and updates the one SharedLoad the app holds; the limits it carries are the server's, not a
session's, so one busy session is weighed against all the others.
"""

from __future__ import annotations

import asyncio
import dataclasses

from .audio_input import decode_appends, resample_tracks
from .passes import WorkerPasses

OFFLOAD_BASE64 = 2**16  # events longer than this (a second of 24 kHz PCM) are parsed and decoded in a worker thread


@dataclasses.dataclass
class SharedLoad:
    """What every connection of the server sees: the sessions open and the decodes in flight. Partial decodes are
    capped server-wide (`--realtime-max-partial-decodes`) and, where `partials_wait_for_finals`, none starts while a
    final one runs (finals come first: a partial is only a preview that the next one replaces): under load the
    previews thin out, the finals stay prompt."""

    max_partials: int = 4
    partials_wait_for_finals: bool = True  # no partial decode starts while a final one runs
    sessions: int = 0  # connections open
    finals_in_flight: int = 0
    partials_in_flight: int = 0
    buffered_samples: int = 0  # uncommitted audio of every session, and the appends being decoded
    # large events are parsed and decoded one at a time: each holds several copies of its audio while it is, and
    # the default executor stays free for the rest of the server (/health reads engine stats through it)
    decoding: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(1))
    # the small ones (a microphone's 100 ms) of every session, decoded together beside the event loop
    appends: WorkerPasses = dataclasses.field(default_factory=lambda: WorkerPasses(decode_appends))
    # the same for the WebRTC calls' media tracks: a tenth of a second of each call's frames, resampled together
    tracks: WorkerPasses = dataclasses.field(default_factory=lambda: WorkerPasses(resample_tracks))

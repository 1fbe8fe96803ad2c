"""What the realtime sessions of one server share: how many are open, the decodes they have in flight, the audio
they buffer, the one worker thread that takes their large events, and the passes that decode their small ones.

Each connection reads and updates the one SharedLoad the app holds; the limits it carries are the server's, not a
session's, so one busy session is weighed against all the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from .audio_input import decode_appends, resample_tracks
from .passes import WorkerPasses

log = logging.getLogger(__name__)

OFFLOAD_BASE64 = 2**16  # events longer than this (a second of 24 kHz PCM) are parsed and decoded in a worker thread
# Partial decodes in flight server-wide unless `--realtime-max-partial-decodes` says: a GPU decodes many side by side
# in one step (each decodes only its turn's new words), a CPU's cores are what the finals need
GPU_PARTIAL_DECODES = 16
CPU_PARTIAL_DECODES = 4


@dataclasses.dataclass
class SharedLoad:
    """What every connection of the server sees: the sessions open and the decodes in flight. Partial decodes are
    capped server-wide (`--realtime-max-partial-decodes`) and, where `partials_wait_for_finals`, none starts while a
    final one runs (finals come first: a partial is only a preview that the next one replaces): under load the
    previews thin out, the finals stay prompt.

    A session whose partial decode is due while no slot is free waits for one (`wait_for_partial`): each slot that
    frees goes first to a turn that has sent no delta yet (its first words are what a listener waits for longest),
    then to the turn waiting longest, so that under load every open turn gets its previews in turn instead of the
    session that happens to append right after a slot frees."""

    max_partials: int = 4
    partials_wait_for_finals: bool = True  # no partial decode starts while a final one runs
    sessions: int = 0  # connections open
    finals_in_flight: int = 0
    partials_in_flight: int = 0
    # the sessions waiting for a partial decode slot: (has the turn sent a delta, since when it waits), and what
    # launches its partial decode when a slot is its (it may find it is no longer due: the slot goes on)
    waiting_partials: dict[object, tuple[tuple[bool, float], Callable[[], None]]] = dataclasses.field(
        default_factory=dict
    )
    buffered_samples: int = 0  # uncommitted audio of every session, and the appends being decoded
    # large events are parsed and decoded one at a time: each holds several copies of its audio while it is, and
    # the default executor stays free for the rest of the server (/health reads engine stats through it)
    decoding: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(1))
    # the small ones (a microphone's 100 ms) of every session, decoded together beside the event loop
    appends: WorkerPasses = dataclasses.field(default_factory=lambda: WorkerPasses(decode_appends))
    # the same for the WebRTC calls' media tracks: a tenth of a second of each call's frames, resampled together
    tracks: WorkerPasses = dataclasses.field(default_factory=lambda: WorkerPasses(resample_tracks))

    def partial_slot_free(self) -> bool:
        """Whether a partial decode may start now (the cap, and the finals where partials wait for them)."""
        if self.finals_in_flight and self.partials_wait_for_finals:
            return False
        return self.partials_in_flight < self.max_partials

    def wait_for_partial(self, owner: object, sent_delta: bool, since: float, launch: Callable[[], None]) -> None:
        """`owner`'s partial decode is due and no slot is free: `launch` is called when one is its turn's."""
        self.waiting_partials.setdefault(owner, ((sent_delta, since), launch))

    def partial_finished(self) -> None:
        self.partials_in_flight -= 1
        self._grant_partials()

    def final_finished(self) -> None:
        self.finals_in_flight -= 1
        self._grant_partials()

    def _grant_partials(self) -> None:
        """Free slots to the waiting sessions, in precedence order; one that no longer launches passes its turn."""
        waiting = self.waiting_partials
        while waiting and self.partial_slot_free():
            owner = min(waiting, key=lambda o: waiting[o][0])
            _, launch = waiting.pop(owner)
            try:
                launch()
            except Exception:  # that session's own failure: the caller is another session's decode ending
                log.exception("a realtime session's partial decode failed to launch")

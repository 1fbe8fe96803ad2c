"""What crosses between the host and the device around a launch: its inputs, where some still live on the device,
and its outputs, on their way back while the next launch is prepared.

On a GPU step N+1 is launched before step N's tokens are read (engine.Engine.step). A sequence whose last token
the host has not read yet (Sequence.pending holds ON_DEVICE) takes it, and the state its timestamp rules need,
from the previous launch's outputs on the device; everything else comes from the host in one copy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from engine.runtime.sequence import ON_DEVICE, Sequence


class StepInputs:
    """Builds launches' inputs; keeps the last launch's sampled tokens and rule state on the device (`keep`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.prev: tuple[Tensor, Tensor | None] | None = None  # the last launch's tokens and rule state, kept

    def keep(self, tokens: Tensor, state: Tensor | None) -> None:
        self.prev = (tokens, state)

    def reset(self) -> None:
        """Forget the last launch's device outputs (after a failed step: no sequence may take its tokens)."""
        self.prev = None

    def to_device(self, values: list) -> Tensor:
        """A small host list as a device tensor, without waiting for the GPU; floats become float32, as
        torch.tensor makes them.

        The list goes through numpy: torch.tensor reads nested Python lists several times slower, a cost paid
        for every row of every step. A plain torch.tensor(..., device="cuda") copies
        from pageable memory and so waits until the GPU has finished all queued work (the step being decoded);
        from pinned memory the copy is queued instead and the host goes on preparing the rest of the step."""
        array = np.array(values)
        host = torch.from_numpy(array.astype(np.float32) if array.dtype == np.float64 else array)
        if not self.on_gpu:
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def build(
        self, seqs: list[Sequence], extra: list[list[int]] | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """A launch's inputs: each row's first token (from the last launch's output on the device where the host
        does not know it yet), its position (n, 1), the timestamp rules' state (rule_state) and the host rows
        (host_row, then `extra`'s values) as copied to the device in one copy."""
        prev = self.prev
        host = [host_row(s, prev is not None) for s in seqs]
        if extra is not None:
            host = [[*row, *values] for row, values in zip(host, extra)]
        h = self.to_device(host)
        tokens = h[:, 0]
        if prev is not None:
            rows = [r[2] if r[0] == ON_DEVICE else -1 for r in host]
            tokens = from_last_step(tokens, prev[0], rows, lambda: h[:, 0] == ON_DEVICE, h[:, 2])
        return tokens, h[:, 1:2].contiguous(), self.rule_state(seqs, host, h), h

    def rule_state(self, seqs: list[Sequence], host: list[list[int]], h: Tensor) -> Tensor | None:
        """The timestamp rules' state per row (host_state's columns of h, or the last launch's on the device for
        rows that take their token from it); None while no window decodes with timestamps: kept on the device only
        then (each small eager operation costs ~10 us of host time, and a small model's step is host-bound)."""
        prev = self.prev
        state = h[:, 3:6] if any(s.job.with_timestamps for s in seqs) else None
        if state is not None and prev is not None and any(r[2] >= 0 for r in host):
            if prev[1] is not None:
                state = from_last_step(state, prev[1], [r[2] for r in host], lambda: h[:, 2:3] >= 0, h[:, 2])
            elif any(r[2] >= 0 and s.job.with_timestamps for r, s in zip(host, seqs)):
                # cannot happen: a timestamp window in the last step made it keep its state. (A timestamp window
                # joining windows without timestamps takes nothing from the last step: their state is unused.)
                raise RuntimeError("a sequence needs rule state that the last step did not keep")
        return state


def host_row(seq: Sequence, have_prev: bool) -> list[int]:
    """[token or ON_DEVICE, position, its row in the last step or -1 (the host's values are exact), state]."""
    row = seq.row if have_prev and seq.row is not None else -1
    if seq.pending[0] == ON_DEVICE and row < 0:
        raise RuntimeError("a sequence waits for a token that no launched step holds")
    return [seq.pending[0], seq.num_cached, row, *host_state(seq)]


def host_state(seq: Sequence) -> tuple[int, int, int]:
    """What the timestamp rules need from a sequence's sampled tokens: last, second to last (-1: none) and the
    last timestamp token (-1: none). Exact whenever no step's output for it is still on the device."""
    toks = seq.tokens
    return (toks[-1] if toks else -1, toks[-2] if len(toks) > 1 else -1, seq.last_timestamp)


def from_last_step(own: Tensor, last: Tensor, rows: list[int], take: Callable[[], Tensor], index: Tensor) -> Tensor:
    """Per row the host's value (`own`) or, where the mask `take()` holds, row `index` of the last step's output
    `last`; `rows` holds the same choice on the host (-1: own), so the common cases need no device work: no row
    moved (the last output as it is) or none takes from it. The mask is built only when it is needed (each small
    eager operation costs ~10 us of host time, and a small model's step is host-bound)."""
    if len(last) == len(rows) and all(r == i for i, r in enumerate(rows)):
        return last
    if all(r < 0 for r in rows):
        return own
    return torch.where(take(), last[index.clamp(min=0)], own)


class StepOutput:
    """A step's tokens, log-probabilities and extra values on their way to the host: the copy is queued behind the
    step, so reading it (`result`) is the one wait for the GPU, and the host can launch the next step first.
    `extras`: after the 2n tokens and log-probabilities, each extra part's length and the reader it goes to."""

    def __init__(self, values: Tensor, n: int, extras: list[tuple[int, Callable[[list[float]], None]]] | None = None):
        self.n = n
        self.extras = extras or []
        self.event = None
        if values.device.type == "cuda":
            self.values = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.values.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.values = values

    def result(self) -> tuple[list[int], list[float]]:
        """Waits for the step; the extra parts go to their readers, tokens and log-probs are returned."""
        if self.event is not None:
            self.event.synchronize()
        out = self.values.tolist()
        n = self.n
        at = 2 * n
        for size, read in self.extras:
            read(out[at : at + size])
            at += size
        return [int(t) for t in out[:n]], out[n : 2 * n]

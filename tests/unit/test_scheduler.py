"""Admission to rows and cross slots: a window takes one row per beam and one cross slot, which its beams share;
a cross slot is free again once no running sequence reads it."""

from __future__ import annotations

import torch

from engine.decoding import BeamSearch
from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import WindowJob


def job(beam_size: int = 1, request_id: str = "req-0") -> WindowJob:
    return WindowJob(request_id, torch.zeros(1), [1, 2], 0.0, False, beam_size=beam_size)


def admit(sched: Scheduler) -> list:
    """Admission as the engine makes it: the scheduler's rows, a beam-searched window's rows made its beams."""
    rows = sched.admit()
    BeamSearch(100, 50, 60, 448).admit(rows)
    return rows


def test_beams_share_their_windows_cross_slot_and_rows_sit_side_by_side():
    sched = Scheduler(num_slots=12, max_encoder_batch=8, num_cross_slots=4)
    jobs = [job(1), job(3), job(1), job(5), job(1)]
    for j in jobs:
        sched.add(j, continuing=False)
    admitted = admit(sched)
    # 1 + 3 + 1 + 5 rows fit in 12; the last window waits for a cross slot (4 of 4 held), not for rows (2 left)
    assert [s.slot for s in admitted] == list(range(10))
    assert [s.cross_slot for s in admitted] == [0, 1, 1, 1, 2, 3, 3, 3, 3, 3]
    assert [s.job for s in admitted if not s.beam_follower] == jobs[:4]
    assert admitted[1].beam is admitted[3].beam and admitted[1].beam.leader is admitted[1]
    assert sched.num_waiting == 1 and sched.admit() == []


def test_a_cross_slot_is_free_once_its_window_leaves_and_rows_stay_contiguous():
    sched = Scheduler(num_slots=8, max_encoder_batch=8, num_cross_slots=3)
    for j in (job(1), job(3), job(1), job(1)):
        sched.add(j, continuing=False)
    first = admit(sched)
    assert [s.cross_slot for s in first] == [0, 1, 1, 1, 2]
    shape = CacheShape.for_model(DUMMY_DIMS["tiny"], None, 32)
    cache = KVCache(shape, 8, torch.float32, torch.device("cpu"), num_cross_slots=3)
    for m in first[1].beam.members:  # the beam search ends: its three rows and its slot are free
        m.finished = True
    sched.release_finished(cache)
    assert [(s.slot, s.cross_slot) for s in sched.running] == [(0, 0), (1, 2)]  # the tail row moved into the hole
    (last,) = admit(sched)
    assert (last.slot, last.cross_slot) == (2, 1)


def test_a_dropped_request_leaves_the_queues_and_its_running_windows_end():
    sched = Scheduler(num_slots=2, max_encoder_batch=8)
    for request_id in ("a", "b", "a", "c"):
        sched.add(job(request_id=request_id), continuing=False)
    running = sched.admit()
    assert [s.job.request_id for s in running] == ["a", "b"]
    sched.drop("a")
    assert running[0].finished and running[0].aborted and not running[1].finished
    assert [j.request_id for q in sched.queues for j in q] == ["c"]


def test_pacing_holds_another_requests_next_window_but_never_a_new_one():
    sched = Scheduler(num_slots=8, max_encoder_batch=8)
    sched.add(job(request_id="short"), continuing=False)
    assert [s.job.request_id for s in sched.admit(pace=True)] == ["short"]  # nothing runs yet: nothing is held
    sched.add(job(request_id="long"), continuing=True)
    sched.add(job(request_id="short"), continuing=True)
    sched.add(job(request_id="long"), continuing=True)
    sched.add(job(request_id="new"), continuing=False)
    # "short" runs: its own next window goes in, "long"'s two wait at the queue's front in their order, "new" goes in
    assert [s.job.request_id for s in sched.admit(pace=True)] == ["short", "new"]
    assert [j.request_id for j in sched.waiting_next] == ["long", "long"]
    # two requests run now: every continuing window waits while pacing, and goes in once the engine stops pacing
    assert sched.admit(pace=True) == []
    assert [s.job.request_id for s in sched.admit()] == ["long", "long"]


def test_previews_are_paced_longer_than_continuing_windows_and_go_in_together():
    """Background windows (live previews) wait while `pace_background` though continuing ones do not; once the
    engine stops pacing them, those that waited meanwhile are admitted in one batch, after every other window."""
    sched = Scheduler(num_slots=16, max_encoder_batch=8)
    sched.add(job(request_id="final"), continuing=False)
    sched.admit()
    previews = []
    for n in range(3):
        preview = job(request_id=f"preview-{n}")
        preview.background = True
        previews.append(preview)
        sched.add(preview, continuing=False)
    sched.add(job(request_id="upload"), continuing=True)
    # the continuing window goes in, the previews wait: another request decodes
    assert [s.job.request_id for s in sched.admit(pace=False, pace_background=True)] == ["upload"]
    assert list(sched.waiting_background) == previews
    assert [s.job.request_id for s in sched.admit()] == ["preview-0", "preview-1", "preview-2"]


def test_with_adapters_grouped_each_batch_takes_the_oldest_window_then_its_adapters_and_the_rest_keep_their_places():
    """A GPU serving adapters admits new windows of one adapter together (the encoder merges an adapter's weights
    once for all its windows in a pass); the windows passed over keep their places, so the oldest waiting window is
    in every batch and none waits for ever behind a stream of another adapter's."""
    from engine.request import DecodeOptions

    def window(adapter: str | None, n: int) -> WindowJob:
        w = job(request_id=f"{adapter}-{n}")
        w.options = DecodeOptions(adapter=adapter)
        return w

    sched = Scheduler(num_slots=64, max_encoder_batch=4, group_adapters=True)
    order = ["a", "b", "c", None] * 4  # round-robin, as concurrent requests of four callers arrive
    for n, adapter in enumerate(order):
        sched.add(window(adapter, n), continuing=False)

    def ids(seqs: list) -> list[str]:
        return [s.job.request_id for s in seqs]

    assert ids(sched.admit()) == ["a-0", "a-4", "a-8", "a-12"]
    assert [j.request_id for j in sched.waiting_new][:3] == ["b-1", "c-2", "None-3"]  # in their places
    assert ids(sched.admit()) == ["b-1", "b-5", "b-9", "b-13"]
    for n in range(16, 24):  # a stream of a's new windows behind the rest: the oldest, c's, come first
        sched.add(window("a", n), continuing=False)
    assert ids(sched.admit()) == ["c-2", "c-6", "c-10", "c-14"]
    assert ids(sched.admit()) == ["None-3", "None-7", "None-11", "None-15"]
    plain = Scheduler(num_slots=64, max_encoder_batch=4)  # elsewhere first come, first served
    for n, adapter in enumerate(order):
        plain.add(window(adapter, n), continuing=False)
    assert ids(plain.admit()) == ["a-0", "b-1", "c-2", "None-3"]


def test_windows_ready_to_wait_are_those_a_batch_had_no_room_for_not_those_pacing_holds():
    """The engine launches several decode steps at once only while no window is ready_waiting: one that the next
    admission would take. A window held back by pacing is not: a launch of several steps delays it a few steps."""
    sched = Scheduler(num_slots=16, max_encoder_batch=2)
    for n in range(3):
        sched.add(job(request_id=f"new-{n}"), continuing=False)
    assert len(sched.admit()) == 2 and sched.num_waiting == 1 and sched.ready_waiting == 1  # past the encoder batch
    assert len(sched.admit()) == 1 and sched.ready_waiting == 0
    preview = job(request_id="preview")
    preview.background = True
    sched.add(preview, continuing=False)
    sched.add(job(request_id="new-0"), continuing=True)  # another request runs: paced, held like the preview
    assert sched.admit(pace=True) == [] and sched.num_waiting == 2 and sched.ready_waiting == 0
    assert len(sched.admit(pace=False, pace_background=True)) == 1 and sched.ready_waiting == 0
    assert len(sched.admit()) == 1 and sched.num_waiting == 0 and sched.ready_waiting == 0

"""TeamSize (engine/kernels/cpu_team.py): which team runs a CPU decode step follows the measured step times."""

from __future__ import annotations

import pytest

from engine.kernels.cpu_team import BUDGET, MAX_WAIT, PROBES, ROUND, StepChoice, TeamSize


def run(choice: StepChoice, cost: dict[int, float], steps: int) -> list[int]:
    """`steps` steps whose time depends only on the team size; the sizes they ran on."""
    sizes = []
    for _ in range(steps):
        size = choice.next_size()
        choice.record(size, cost[size])
        sizes.append(size)
    return sizes


def test_the_full_team_stays_while_it_is_faster():
    choice = StepChoice(2)
    cost = {2: 2.3e-3, 1: 2.8e-3}
    sizes = run(choice, cost, 2000)
    assert choice.current == 2
    assert sizes[:ROUND] == [2] * ROUND
    # the probe alternates the other size with the current one, starting with the other
    assert sizes[ROUND : ROUND + 2 * PROBES] == [1, 2] * PROBES
    # probes go on, and cost a few percent (BUDGET) over the full team alone
    assert sizes.count(1) > 0
    assert sum(cost[s] for s in sizes) < (1 + 2 * BUDGET) * len(sizes) * cost[2]


def test_one_thread_takes_over_under_a_load_and_probes_of_the_team_become_rare():
    choice = StepChoice(2)
    cost = {2: 8e-3, 1: 2.7e-3}
    sizes = run(choice, cost, 2000)
    assert choice.current == 1
    assert sizes.index(1) == ROUND  # the first probe already wins
    later = sizes[ROUND + 2 * PROBES :]
    # a probe of the full team costs ~2 one-thread steps more per step: they come MAX_WAIT steps apart
    assert 0 < later.count(2) <= PROBES * (len(later) // MAX_WAIT + 1)
    assert sum(cost[s] for s in later) < (1 + 2 * BUDGET) * len(later) * cost[1]


def test_the_choice_follows_a_change_of_load():
    choice = StepChoice(2)
    run(choice, {2: 2.3e-3, 1: 2.8e-3}, 500)
    assert choice.current == 2
    run(choice, {2: 8e-3, 1: 2.7e-3}, 300)  # a load arrives: seen within a probe's spacing
    assert choice.current == 1
    run(choice, {2: 2.3e-3, 1: 2.8e-3}, MAX_WAIT + 2 * PROBES + ROUND)  # and leaves
    assert choice.current == 2


@pytest.mark.parametrize("adaptive, full", [(False, 2), (True, 1)])
def test_fixed_team(adaptive, full):
    team = TeamSize(full, adaptive=adaptive)
    for _ in range(200):
        with team.step(1) as size:
            assert size == full


def test_one_row_and_several_rows_are_chosen_apart():
    team = TeamSize(2)
    for _ in range(ROUND):
        with team.step(1):
            pass
        with team.step(4):
            pass
    with team.step(1) as size:
        assert size == 1  # one row's first probe
    with team.step(4) as size:
        assert size == 1  # several rows' own
    assert team.sizes() == {"one row": 2, "several rows": 2}

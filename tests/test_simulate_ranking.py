"""The simulator's rankings (issue 28): each round a k-slot semi-bandit, every slot's
reward seen, the regret against the best k-list."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from linreboot.cli import main
from loadtest.environments import Environment, split_rngs
from loadtest.simulate import Cell, cell_seed, play, play_together
from policies import PolicyName, Setting


@pytest.mark.parametrize("setting", ["stochastic", "contextual", "covariates"])
@pytest.mark.parametrize("policy", ["linreboot", "linucb", "lints-g"])
def test_the_regret_of_a_round_is_what_its_list_misses_of_the_best(
    setting: Setting, policy: PolicyName
) -> None:
    """A round's regret is the top-k means' sum minus the list's, never negative; the
    first round's arms, from the same generators, begin as a decision of one arm would."""
    k, reps = 3, 4
    ranked = play(Cell(setting, 3, policy, slots=k), reps, 60, seed=2, per_decision_rng=True)
    single = play(Cell(setting, 3, policy), reps, 1, seed=2, per_decision_rng=True)
    per_round = np.diff(ranked.cumulative, axis=1, prepend=0.0)
    assert np.all(per_round >= -1e-12)
    env = Environment(Cell(setting, 3, policy).env_spec(2), split_rngs(cell_seed(2, Cell(
        setting, 3, policy)), reps)[0])
    means = env.means(env.contexts())
    assert np.all(per_round[:, 0] <= -np.sort(-means, axis=1)[:, :k].sum(axis=1)
                  - np.sort(means, axis=1)[:, :k].sum(axis=1) + 1e-12)
    np.testing.assert_array_equal(ranked.arms[:, 0], single.arms[:, 0])


def test_a_ranking_learns_from_every_slot() -> None:
    """Its regret per round falls: the last 200 rounds' against the first 200."""
    played = play(Cell("covariates", 3, "linreboot", overrides=(("spread", "pooled"),),
                       slots=3), 8, 1000, seed=4)
    per_round = np.diff(played.cumulative, axis=1, prepend=0.0)
    assert per_round[:, -200:].mean() < 0.5 * per_round[:, :200].mean()


def test_weights_of_one_are_no_weights() -> None:
    """Slots examined with probability 1 and rewards divided by 1: the same play."""
    plain, weighted = (play(Cell("contextual", 3, "linreboot", slots=3, position_weights=w),
                            3, 80, seed=1) for w in (None, (1.0,)))
    np.testing.assert_array_equal(plain.cumulative, weighted.cumulative)


def test_position_weights_are_in_the_regret_and_the_examined_slots() -> None:
    """With weights the best list's value is sum_j w_j mu_(j): a policy learning r / w_j
    still learns (regret per round falls), and a lower slot's weight changes the play."""
    cell = Cell("covariates", 3, "linreboot", overrides=(("spread", "pooled"),), slots=3,
                position_weights=(1.0, 0.5, 0.25))
    weighted = play(cell, 8, 1000, seed=4)
    per_round = np.diff(weighted.cumulative, axis=1, prepend=0.0)
    assert np.all(per_round >= -1e-12)
    assert per_round[:, -200:].mean() < 0.5 * per_round[:, :200].mean()
    plain = play(Cell("covariates", 3, "linreboot", overrides=(("spread", "pooled"),),
                      slots=3), 8, 1000, seed=4)
    assert not np.array_equal(plain.cumulative, weighted.cumulative)


def test_cells_of_other_slots_are_not_played_together() -> None:
    with pytest.raises(ValueError, match="slots"):
        play_together([Cell("covariates", 3, "linreboot", slots=2),
                       Cell("covariates", 3, "linucb", slots=3)], 2, 5, seed=0)


def test_simulate_slots_writes_regret_against_k(tmp_path: Path) -> None:
    code = main(["simulate", "--settings", "covariates", "--dims", "3", "--policies",
                 "linreboot", "linucb", "--reps", "2", "--horizon", "40", "--slots", "1", "3",
                 "--jobs", "1", "--out", str(tmp_path)])
    assert code == 0
    assert (tmp_path / "regret_by_k.png").stat().st_size > 10_000
    tables = (tmp_path / "tables.md").read_text()
    assert "k=3" in tables and "linucb |" in tables.replace(" (", " |")
    with pytest.raises(SystemExit, match="--position-weights"):
        main(["simulate", "--slots", "3", "--position-weights", "0.5", "0.8"])

"""Rankings of k arms (policies.ranking): k = 1 is draw, positions from the same index."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from scipy import integrate, stats

from policies import Ready, draw, paper_config, prepare
from policies.propensity import SERVICE, propensities
from policies.ranking import (
    _at_positions,
    _estimated,
    _next,
    _normal_positions,
    placement_propensities,
    placement_table,
    position_propensities,
    rank,
)
from policies.state import apply_sequence, init_state

K, D = 8, 3


def _ready(name: str, setting: str, seed: int = 0, epsilon: float = 0.0,
           eligible: np.ndarray | None = None) -> Ready:
    config = paper_config(name, setting, D, epsilon=epsilon)  # type: ignore[arg-type]
    rng = np.random.default_rng(seed)
    state = init_state(config, K)
    n = 60
    arms = rng.integers(0, K, size=n)
    x = rng.normal(size=(n, D)) / 2
    apply_sequence(config, state, arms, x, x @ np.array([0.5, -0.2, 0.3]) + rng.normal(size=n) / 4)
    contexts = rng.normal(size=(1, K, D)) / 2
    return prepare(config, state, contexts, eligible)


@pytest.mark.parametrize(("name", "setting"), [("linreboot", "covariates"),
                                               ("linreboot", "contextual"),
                                               ("lints-g", "stochastic"), ("linucb", "covariates")])
@pytest.mark.parametrize("epsilon", [0.0, 0.3])
def test_k_1_is_draw_and_uses_the_generators_as_draw_does(
    name: str, setting: str, epsilon: float
) -> None:
    ready = _ready(name, setting, epsilon=epsilon)
    for seed in range(40):
        ranked_rng, drawn_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        ranking = rank(ready, [ranked_rng], 1)
        choice = draw(ready, [drawn_rng])
        assert ranking.arms[0, 0] == choice.arms[0]
        np.testing.assert_array_equal(ranking.scores, choice.scores)
        assert ranked_rng.random() == drawn_rng.random()  # same state after


def test_a_ranking_is_distinct_eligible_arms_by_score() -> None:
    eligible = np.ones((1, K), bool)
    eligible[0, [1, 4]] = False
    ready = _ready("linreboot", "covariates", eligible=eligible)
    for seed in range(30):
        ranking = rank(ready, [np.random.default_rng(seed)], 5)
        placed = ranking.arms[0].tolist()
        assert len(set(placed)) == 5 and not {1, 4} & set(placed)
        scores = ranking.scores[0, placed]
        assert np.all(np.diff(scores) <= 0)  # best first (no epsilon here)
        others = [a for a in range(K) if a not in placed and eligible[0, a]]
        assert scores[-1] >= ranking.scores[0, others].max()


def test_a_deterministic_index_ranks_by_its_order() -> None:
    ready = _ready("linucb", "covariates", seed=3)
    ranking = rank(ready, [np.random.default_rng(0)], K)
    np.testing.assert_array_equal(ranking.arms[0], np.argsort(-ranking.scores[0], kind="stable"))


def test_k_beyond_the_eligible_arms_is_refused() -> None:
    eligible = np.zeros((1, K), bool)
    eligible[0, :3] = True
    ready = _ready("linreboot", "covariates", eligible=eligible)
    with pytest.raises(ValueError, match="between 1 and the eligible arms"):
        rank(ready, [np.random.default_rng(0)], 4)


@pytest.mark.parametrize("epsilon", [0.0, 0.2])
def test_position_propensities_agree_with_the_exact_first_position(epsilon: float) -> None:
    """Position 1 is draw's choice: its estimate is within four standard errors of the
    exact propensity (policies.propensity, error below 1e-4)."""
    ready = _ready("linreboot", "covariates", seed=5, epsilon=epsilon)
    draws = 4000
    for seed in range(3):
        ranking = rank(ready, [np.random.default_rng(seed)], 3)
        estimate = position_propensities(ready, ranking, draws=draws)
        exact = float(propensities(ready, ranking.arms[:, 0])[0])
        se = np.sqrt(exact * (1 - exact) / draws)  # + 1 / draws: the ranking made is a draw
        assert abs(estimate[0, 0] - exact) <= 4 * se + 1 / draws
        assert np.all((estimate > 0) & (estimate <= 1))


def test_with_two_arms_the_second_position_is_the_first_ones_complement() -> None:
    eligible = np.zeros((1, K), bool)
    eligible[0, [2, 6]] = True
    ready = _ready("linreboot", "covariates", seed=8, eligible=eligible)
    draws = 4000
    ranking = rank(ready, [np.random.default_rng(1)], 2)
    estimate = position_propensities(ready, ranking, draws=draws)
    second_first = float(propensities(ready, ranking.arms[:, 1])[0])
    exact = 1.0 - second_first  # arm 2 of the ranking is second when it is not first
    se = np.sqrt(exact * (1 - exact) / draws)
    assert abs(estimate[0, 1] - exact) <= 4 * se + 1 / draws
    # the same draws: the estimates of the two positions are the same event
    assert estimate[0, 0] == pytest.approx(estimate[0, 1])


def _all_positions(ready: Ready, k: int) -> np.ndarray:
    """P(arm a at position j) for every eligible arm a and j < k, by the integral."""
    arms = np.flatnonzero(ready.eligible[0])
    table = np.zeros((arms.size, k))
    for j in range(k):
        placed = arms[None, :]
        at = np.full(placed.shape, j)
        table[:, j] = _normal_positions(ready, placed, at)[0]  # type: ignore[index]
    return table


@pytest.mark.parametrize("setting", ["covariates", "contextual"])
def test_the_integral_is_a_distribution_over_arms_and_over_positions(setting: str) -> None:
    """Every position holds one arm and every arm one position: the rows and the columns
    of the table sum to 1 (to the trapezoidal rule's error, far below 1e-6 here); the
    first position is policies.propensity's (error below 1e-4)."""
    ready = _ready("linreboot", setting, seed=11)
    table = _all_positions(ready, K)
    np.testing.assert_allclose(table.sum(axis=0), 1.0, atol=1e-6)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(table[:, 0], propensities(ready)[0], atol=1e-4)


def test_the_integral_agrees_with_the_estimate() -> None:
    ready = _ready("linreboot", "covariates", seed=5)
    draws = 4000
    for seed in range(3):
        ranking = rank(ready, [np.random.default_rng(seed)], 4)
        exact = position_propensities(ready, ranking)
        positions = np.arange(4)[None, :]
        estimate = _estimated(ready, ranking.arms, positions, draws, 7, made=True)
        se = np.sqrt(exact * (1 - exact) / draws)
        assert np.all(np.abs(estimate - exact) <= 4 * se + 1 / draws), (estimate, exact)
        # another's placements (the arms in reverse), not counted among the draws
        other = _estimated(ready, ranking.arms[:, ::-1], positions, draws, 7, made=False)
        reverse = placement_propensities(ready, ranking.arms[:, ::-1], positions)
        se = np.sqrt(reverse * (1 - reverse) / draws)
        assert np.all(np.abs(other - reverse) <= 4 * se + 1e-9), (other, reverse)


@pytest.mark.parametrize("name", ["linucb", "greedy"])
def test_a_deterministic_index_places_each_arm_where_its_score_ranks(name: str) -> None:
    """1 at the arm's place in the order of the scores, 0 elsewhere; the estimate (every
    ranking drawn alike) agrees."""
    ready = _ready(name, "covariates", seed=4)
    order = rank(ready, [np.random.default_rng(0)], K).arms
    arms = np.repeat(order[:, :3], 3, axis=1)  # each of the first 3 at positions 0, 1, 2
    positions = np.tile(np.arange(3), 3)[None, :]
    got = placement_propensities(ready, arms, positions)
    np.testing.assert_array_equal(got, (arms == order[:, positions[0]]).astype(float))
    np.testing.assert_array_equal(got, _estimated(ready, arms, positions, 50, 1, made=False))


def _by_quadrature(mean: np.ndarray, spread: np.ndarray, arm: int, position: int) -> float:
    """P(arm at position) for independent normal indices, by adaptive quadrature of the
    density times the Poisson-binomial probability that ``position`` others score higher
    (recursed at each point: slow, plain, and independent of the rule under test)."""
    others = np.arange(mean.size) != arm

    def integrand(t: float) -> float:
        count = [1.0] + [0.0] * position
        for above in stats.norm.sf(t, mean[others], spread[others]).tolist():
            count = [count[0] * (1.0 - above)] + [
                count[m] * (1.0 - above) + count[m - 1] * above for m in range(1, position + 1)]
        return float(stats.norm.pdf(t, mean[arm], spread[arm])) * count[position]

    lo, hi = mean[arm] - 9 * spread[arm], mean[arm] + 9 * spread[arm]
    breaks = sorted({float(m) for m in mean if lo < m < hi})
    value, _ = integrate.quad(integrand, lo, hi, points=breaks or None, limit=400,
                              epsabs=1e-11, epsrel=1e-9)
    return float(value)


@pytest.mark.parametrize("case", range(6))
def test_the_integral_agrees_with_adaptive_quadrature_where_it_prunes(case: int) -> None:
    """Many arms, spreads from narrow to wide and windows apart (arms surely above or
    below the placed arm's nodes leave the recursion), or alike and crowded (cases 4
    and 5: the smooth rule's nodes): each placed arm's probability at its position
    within 1e-6 of adaptive quadrature."""
    rng = np.random.default_rng(case)
    size = 30
    mean = rng.normal(size=size) * (2.0 if case < 4 else 0.3)
    spread = (rng.uniform(0.02, 0.6, size=size) ** (1 + (case % 3) / 2) if case < 4
              else rng.uniform(0.3, 0.45, size=size))
    placed = np.argsort(-(mean + spread * rng.normal(size=size)))[: 3 + 2 * case]
    got = _at_positions(mean, spread, placed)
    assert got is not None
    for position, arm in enumerate(placed):
        assert got[position] == pytest.approx(_by_quadrature(mean, spread, int(arm), position),
                                              abs=1e-6), (position, arm)


@pytest.mark.parametrize(("name", "setting", "epsilon"), [
    ("linreboot", "covariates", 0.0), ("linreboot", "stochastic", 0.0),
    ("linucb", "covariates", 0.0), ("lints-g", "contextual", 0.0),
    ("linreboot", "covariates", 0.3)])
def test_the_one_sort_places_the_arms_the_position_by_position_loop_does(
    name: str, setting: str, epsilon: float
) -> None:
    """rank()'s one sort (no arm to explore, no epsilon, no tie) against ``_next`` called
    position by position with the same generators: the same arms, and the generators
    left alike."""
    ready = _ready(name, setting, seed=13, epsilon=epsilon)
    for seed in range(25):
        fast_rng, loop_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        fast = rank(ready, [fast_rng], 6)
        first = draw(ready, [loop_rng])
        placed = [int(first.arms[0])]
        left = ready.eligible.copy()
        left[0, placed[0]] = False
        for _ in range(5):
            arm = int(_next(ready, first.scores, left, [loop_rng])[0])
            placed.append(arm)
            left[0, arm] = False
        assert fast.arms[0].tolist() == placed
        assert fast_rng.random() == loop_rng.random()


def test_tied_scores_split_as_draw_splits_them() -> None:
    """LinUCB with no observation: every arm's index the same (a tie among all). The one
    sort does not serve; the first position is draw's split of the tie, the positions are
    distinct arms, and a row of the batch without a tie draws nothing from its
    generator."""
    config = paper_config("linucb", "covariates", D)
    contexts = np.ones((2, K, D))
    contexts[1] = np.random.default_rng(5).normal(size=(K, D))  # row 1: no tie
    ready = prepare(config, init_state(config, K, batch=2), contexts)
    firsts = set()
    for seed in range(30):
        ranked = [np.random.default_rng([seed, row]) for row in range(2)]
        drawn = [np.random.default_rng([seed, row]) for row in range(2)]
        ranking = rank(ready, ranked, 4)
        choice = draw(ready, drawn)
        np.testing.assert_array_equal(ranking.arms[:, 0], choice.arms)
        assert [len(set(row)) for row in ranking.arms.tolist()] == [4, 4]
        assert ranked[1].random() == drawn[1].random()  # the row without a tie drew nothing
        firsts.add(int(ranking.arms[0, 0]))
    assert len(firsts) > 1  # the tie was split at random, not by the sort


def _random_cases(count: int = 300, seed: int = 17
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Means, spreads and placed arms: 3-40 arms, spreads up to two orders apart, up to
    10 placed."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        size = int(rng.integers(3, 41))
        mean = rng.normal(size=size) * rng.uniform(0.05, 2.0)
        spread = rng.uniform(0.02, 1.0, size=size) ** rng.uniform(0.5, 2.0)
        yield mean, spread, rng.permutation(size)[: int(rng.integers(1, min(size, 10) + 1))]


def test_the_service_accuracy_is_within_a_thousandth_of_the_fine_one() -> None:
    """The service asks the integral at SERVICE (windows of 5 spreads, nodes 2 / sqrt(n)
    spreads apart): within 1e-3 of FINE (below 1e-6, against adaptive quadrature) in 300 random
    cases of 3-40 arms, spreads up to two orders apart, up to 10 placed."""
    worst = 0.0
    for mean, spread, placed in _random_cases():
        fine = _at_positions(mean, spread, placed)
        served = _at_positions(mean, spread, placed, accuracy=SERVICE)
        if fine is not None and served is not None:
            worst = max(worst, float(np.abs(fine - served).max()))
    assert worst <= 1e-3, worst


@pytest.mark.parametrize("size", [10, 40, 100, 400, 1000])
def test_identical_arms_are_at_every_position_with_probability_one_over_k(size: int) -> None:
    """K identical normal indices: each arm is at each position with probability exactly
    1 / K. Many arms crossing each other make the integrand narrow (about 1 / sqrt(K) of
    a spread): FINE within 1e-5 of it relatively, SERVICE within 1% (and 1e-3 as
    every service propensity) (review, session 16: nodes 0.75 spreads apart gave
    0.0014-0.0146 for 0.01 at K = 100)."""
    mean, spread = np.zeros(size), np.ones(size)
    placed = np.arange(10)
    fine = _at_positions(mean, spread, placed)
    served = _at_positions(mean, spread, placed, accuracy=SERVICE)
    assert fine is not None and served is not None
    np.testing.assert_allclose(fine * size, 1.0, rtol=0, atol=1e-5)
    np.testing.assert_allclose(served * size, 1.0, rtol=0, atol=1e-2)
    np.testing.assert_allclose(served, 1.0 / size, rtol=0, atol=1e-3)


@pytest.mark.parametrize(("others", "position"), [(100, 2), (400, 5), (400, 9), (400, 60)])
def test_a_wide_arm_among_a_crowd_of_narrow_ones(others: int, position: int) -> None:
    """Arm a N(0, 1) among ``others`` identical N(0, 0.2^2) arms (a new arm among learnt
    ones: the narrow rule's nodes, crowded): P(a at position) = the integral of a's
    density times the binomial probability that ``position`` of them score higher,
    by adaptive quadrature; FINE within 1e-6, SERVICE within 1e-4 (review, session
    16: the narrow rule's nodes did not close in with the crowd, 44% off at K = 400)."""
    mean, spread = np.zeros(others + 1), np.full(others + 1, 0.2)
    spread[0] = 1.0

    def integrand(t: float) -> float:
        return float(stats.norm.pdf(t) * stats.binom.pmf(position, others,
                                                          stats.norm.sf(t, 0.0, 0.2)))

    exact, _ = integrate.quad(integrand, -9.0, 9.0, points=[0.0], limit=500,
                              epsabs=1e-12, epsrel=1e-10)
    placed, at = np.array([0]), np.array([position])
    fine = _at_positions(mean, spread, placed, at)
    served = _at_positions(mean, spread, placed, at, accuracy=SERVICE)
    assert fine is not None and served is not None
    assert fine[0] == pytest.approx(exact, abs=1e-6)
    assert served[0] == pytest.approx(exact, abs=1e-4)


@pytest.mark.parametrize(("name", "setting"), [("linreboot", "covariates"),
                                               ("linreboot", "stochastic"),
                                               ("lints-g", "covariates")])
def test_the_table_holds_every_placement_of_every_ranking(name: str, setting: str) -> None:
    """placement_table: each arm's probability at each position, one pass for all (a
    server keeps it while the statistics stay the same): the rankings' own placements
    (their pairs on their own grids) within 1e-6, both 1e-6 of adaptive quadrature; a
    distribution over arms at each position; 0 for an arm not eligible."""
    eligible = np.ones((1, K), dtype=bool)
    eligible[0, 2] = False
    ready = _ready(name, setting, seed=3, eligible=eligible)
    table = placement_table(ready, 5)
    assert table is not None and table.shape == (1, K, 5)
    np.testing.assert_allclose(table[0].sum(axis=0), 1.0, rtol=0, atol=1e-6)
    assert np.all(table[0, 2] == 0.0)
    rngs = [np.random.default_rng(4)]
    for _ in range(20):
        ranking = rank(ready, rngs, 5)
        got = position_propensities(ready, ranking)
        np.testing.assert_allclose(table[0, ranking.arms[0], np.arange(5)], got[0],
                                   rtol=0, atol=1e-6)


def test_a_table_of_a_deterministic_index_is_its_order_and_of_a_shared_model_none() -> None:
    """LinUCB's table: 1 where the arm's score ranks at the position, else 0 (k beyond
    the eligible arms: nobody there); a shared model's placements are estimated per
    ranking: no table."""
    ready = _ready("linucb", "covariates")
    table = placement_table(ready, K + 1)
    assert table is not None
    scores = draw(ready, [np.random.default_rng(0)]).scores[0]
    expected = np.zeros((K, K + 1))
    expected[np.argsort(-scores, kind="stable"), np.arange(K)] = 1.0
    np.testing.assert_array_equal(table[0], expected)
    shared = _ready("lints-g", "stochastic")
    assert placement_table(shared, 3) is None


def test_a_group_too_fine_for_one_grid_is_taken_arm_by_arm() -> None:
    """Placed arms whose windows overlap share a grid at the finest of their steps; where
    that grid would be too large (a wide arm chained to very narrow ones), each arm is
    taken on its own grid, from its own floor, instead of the estimate: within 1e-6 of
    adaptive quadrature. The table (split=False) declines such a group: a ranking's own
    pairs are cheaper."""
    split = 0
    for mean, spread, placed in _random_cases():  # the service-accuracy test's
        whole = _at_positions(mean, spread, placed, split=False)
        got = _at_positions(mean, spread, placed)
        if whole is not None or got is None:
            continue
        split += 1
        for position, arm in enumerate(placed):
            assert got[position] == pytest.approx(
                _by_quadrature(mean, spread, int(arm), position), abs=1e-6), (position, arm)
    assert split >= 1  # the premise: some of these cases need it

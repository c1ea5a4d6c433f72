"""Partial sums of a sharded experiment merge into the whole (policies.state.merge_sums)."""

from __future__ import annotations

import numpy as np
import pytest

from policies import paper_config
from policies.state import (
    apply_sequence,
    init_state,
    layout,
    merge_sums,
    mergeable,
    raw_reward_sums,
)

_EPS = np.finfo(np.float64).eps


def _observations(rng: np.random.Generator, n: int, k: int, d: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arms = rng.integers(0, k, size=n)
    x = rng.normal(size=(n, d))
    rewards = 5.0 + rng.normal(size=n)  # far from 0: the shifts matter
    return arms, x, rewards


@pytest.mark.parametrize("name,setting", [("linreboot", "stochastic"), ("linreboot", "covariates"),
                                          ("lints-g", "contextual"), ("linucb", "covariates")])
def test_merged_parts_are_the_whole_up_to_the_order_of_additions(name: str, setting: str) -> None:
    config = paper_config(name, setting, 4)  # type: ignore[arg-type]
    rng = np.random.default_rng(7)
    k, n = 5, 300
    arms, x, rewards = _observations(rng, n, k, 4)
    whole = init_state(config, k)
    apply_sequence(config, whole, arms, x, rewards)
    shard = rng.integers(0, 3, size=n)
    shard[arms == 4] = 2  # one arm seen by one shard only
    parts = []
    for s in range(3):
        part = init_state(config, k)
        apply_sequence(config, part, arms[shard == s], x[shard == s], rewards[shard == s])
        parts.append(part)
    merged = merge_sums(config, parts)
    for count in ("n", "pulls"):
        np.testing.assert_array_equal(merged[count], whole[count])  # counts are exact
    # Each sum differs from the whole's by rounding only: at most n ulps of the sum
    # of its terms' magnitudes (two orders of at most n additions each).
    bound = 2 * n * _EPS
    for name_, value in (("xtx", np.abs(x[:, :, None] * x[:, None, :]).sum(0)),
                         ("xty", np.abs(rewards[:, None] * x).sum(0))):
        assert np.all(np.abs(merged[name_] - whole[name_]) <= bound * value + 1e-300), name_
    for names in (("n", "shift_y", "sum_dy", "sum_dy2"), ("pulls", "shift_r", "sum_dr", "sum_dr2")):
        got = raw_reward_sums(*(merged[f] for f in names))
        want = raw_reward_sums(*(whole[f] for f in names))
        scale = (np.abs(rewards).sum(), (rewards ** 2).sum())
        for g, w, s in zip(got, want, scale, strict=True):
            assert np.all(np.abs(g - w) <= 8 * n * _EPS * s), names


def test_one_part_and_empty_parts_change_no_bit() -> None:
    config = paper_config("linreboot", "stochastic", 3)
    rng = np.random.default_rng(3)
    arms, x, rewards = _observations(rng, 50, 4, 3)
    part = init_state(config, 4)
    apply_sequence(config, part, arms, x, rewards)
    for parts in ([part], [part, init_state(config, 4)], [init_state(config, 4), part]):
        merged = merge_sums(config, parts)
        for name in layout(config):
            np.testing.assert_array_equal(merged[name], part[name])
    assert merged["xtx"] is not part["xtx"]  # a copy: the parts are left as they were


def test_sums_that_do_not_add_are_refused() -> None:
    assert mergeable(paper_config("linreboot", "stochastic", 3))
    forgets = paper_config("linreboot", "stochastic", 3, discount=0.99)
    authors = paper_config("linucb", "stochastic", 3, variant="authors")
    for config in (forgets, authors):
        assert not mergeable(config)
        with pytest.raises(ValueError, match="do not merge"):
            merge_sums(config, [init_state(config, 2)])

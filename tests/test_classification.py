"""The supervised-to-bandit reduction (``loadtest.classification``) on a tiny data set."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.classification import ClassificationWorld, play_classification, prepare_dataset
from loadtest.environments import split_rngs
from policies import paper_config

# Four rows, two features (the second constant), three classes labelled 5, 7, 9.
FEATURES = np.array([[0.0, 3.0], [1.0, 3.0], [2.0, 3.0], [3.0, 3.0]])
LABELS = np.array([5, 7, 7, 9])


def test_features_are_standardised_with_an_intercept_and_labels_renumbered() -> None:
    data = prepare_dataset(FEATURES, LABELS)
    assert data.dim == 2 and data.n_classes == 3  # the constant column is dropped
    np.testing.assert_allclose(data.features[:, 0].mean(), 0.0, atol=1e-15)
    np.testing.assert_allclose(data.features[:, 0].std(), 1.0)
    assert np.all(data.features[:, 1] == 1.0)
    assert data.labels.tolist() == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="one label per row"):
        prepare_dataset(FEATURES, LABELS[:3])


def test_a_round_is_one_row_for_every_arm_and_reward_1_for_its_class() -> None:
    data = prepare_dataset(FEATURES, LABELS)
    world = ClassificationWorld(data, [np.random.default_rng(1), np.random.default_rng(2)])
    for _ in range(20):
        contexts = world.contexts()
        assert contexts.shape == (2, 3, 2)
        assert np.all(contexts == contexts[:, :1])  # one context, every arm
        rows = [int(np.flatnonzero((data.features == c[0]).all(axis=1))[0]) for c in contexts]
        truth = data.labels[rows]
        means = world.means()
        assert means.sum(axis=1).tolist() == [1.0, 1.0]
        assert means[np.arange(2), truth].tolist() == [1.0, 1.0]
        assert world.rewards(truth).tolist() == [1.0, 1.0]
        assert world.rewards((truth + 1) % 3).tolist() == [0.0, 0.0]


def test_mistakes_are_counted_and_a_batch_equals_its_runs_alone() -> None:
    data = prepare_dataset(FEATURES, LABELS)
    config = paper_config("linreboot", "covariates", data.dim, spread="pooled")
    batch = play_classification(config, data, split_rngs(4, 3), 200)
    alone = []
    for b in range(3):
        worlds, policies = split_rngs(4, 3)
        alone.append(int(play_classification(config, data, ([worlds[b]], [policies[b]]),
                                             200)[0]))
    assert batch.tolist() == alone
    assert np.all((batch >= 0) & (batch <= 200))
    with pytest.raises(ValueError, match="covariates config"):
        play_classification(paper_config("linreboot", "covariates", 3), data,
                            split_rngs(4, 1), 1)

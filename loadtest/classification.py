"""Supervised-to-bandit reductions: a labelled data set as a seeded bandit world.

Each round draws one row of the data set uniformly at random (with
replacement, so the world is stationary and any horizon is allowed); the
policy sees its features as the one context of the round, picks one of K
arms, one per class, and gets reward 1 if that is the row's class, else 0.
This is the covariates setting (one context per decision, one model per
arm): every arm's linear model learns how likely its class is. The true
mean of arm k is 1 for the right class and 0 for the others, so the
cumulative regret is the number of mistakes.

Features are standardised over the whole data set (mean 0, standard deviation
1; constant columns dropped) and a constant 1 is appended, so that each
arm's model has an intercept: ``d`` is the number of non-constant features
plus one. Repetition ``b`` draws its rows from its own generator, so a
batch of B repetitions equals B runs of one.

The data sets that ship with scikit-learn (``load_digits``, ``load_wine``,
...) are read by :func:`sklearn_dataset`; scikit-learn is needed only
there (the ``data`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from policies import PolicyConfig, choose, init_state, update

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Dataset:
    """Standardised features with an intercept, and class labels 0..K-1.

    Attributes
    ----------
    features : ndarray, shape (n, d)
    labels : ndarray of int, shape (n,)
    n_classes : K
    """

    features: Array
    labels: NDArray[np.int64]
    n_classes: int

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])


def prepare_dataset(features: np.ndarray, labels: np.ndarray) -> Dataset:
    """Standardise ``features`` (n, p), drop constant columns, append a 1; relabel 0..K-1."""
    raw = np.asarray(features, dtype=np.float64)
    if raw.ndim != 2 or raw.shape[0] != len(labels) or raw.shape[0] < 2:
        raise ValueError("need a 2-d feature array with one label per row, at least 2 rows")
    sd = raw.std(axis=0)
    kept = sd > 0
    scaled = (raw[:, kept] - raw[:, kept].mean(axis=0)) / sd[kept]
    with_intercept = np.hstack([scaled, np.ones((raw.shape[0], 1))])
    classes, codes = np.unique(np.asarray(labels), return_inverse=True)
    return Dataset(with_intercept, codes.astype(np.int64), int(classes.size))


def sklearn_dataset(name: str) -> Dataset:
    """``sklearn.datasets.load_<name>()`` (e.g. ``digits``, ``wine``), prepared."""
    from sklearn import datasets  # the ``data`` extra; imported only here

    bunch = getattr(datasets, f"load_{name}")()
    return prepare_dataset(bunch.data, bunch.target)


class ClassificationWorld:
    """B independent streams of rows of one data set (module notes).

    Parameters
    ----------
    data : Dataset
    rngs : one generator per repetition.
    """

    def __init__(self, data: Dataset, rngs: Sequence[np.random.Generator]) -> None:
        self.data = data
        self.rngs = list(rngs)
        self._rows = np.zeros(len(self.rngs), dtype=np.int64)

    def contexts(self) -> Array:
        """Begin a round: one row per repetition, its features repeated for every arm.

        Returns
        -------
        ndarray, shape (B, K, d)
        """
        n = self.data.labels.size
        self._rows = np.array([int(rng.integers(n)) for rng in self.rngs], dtype=np.int64)
        x = self.data.features[self._rows]
        return np.repeat(x[:, None, :], self.data.n_classes, axis=1)

    def means(self) -> Array:
        """1 for this round's right class, 0 for the others, shape (B, K)."""
        out = np.zeros((self._rows.size, self.data.n_classes))
        out[np.arange(self._rows.size), self.data.labels[self._rows]] = 1.0
        return out

    def rewards(self, arms: NDArray[np.int64]) -> Array:
        """1.0 where the chosen arm is this round's class, shape (B,)."""
        return (self.data.labels[self._rows] == arms).astype(np.float64)


def play_classification(
    config: PolicyConfig, data: Dataset, rngs: tuple[Sequence[np.random.Generator],
                                                     Sequence[np.random.Generator]],
    horizon: int,
) -> NDArray[np.int64]:
    """Mistakes of every repetition after ``horizon`` rounds, shape (B,).

    ``rngs``: the worlds' generators and the policy's, one of each per
    repetition (``loadtest.environments.split_rngs``). ``config`` must be of
    the covariates setting with ``dim == data.dim``.
    """
    return classification_mistakes(config, data, rngs, horizon).sum(axis=1)


def classification_mistakes(
    config: PolicyConfig, data: Dataset, rngs: tuple[Sequence[np.random.Generator],
                                                     Sequence[np.random.Generator]],
    horizon: int,
) -> NDArray[np.int64]:
    """:func:`play_classification` round by round: 1 for a mistake, shape (B, horizon)."""
    world_rngs, policy_rngs = rngs
    if config.setting != "covariates" or config.dim != data.dim:
        raise ValueError(f"need a covariates config of dim {data.dim}")
    world = ClassificationWorld(data, world_rngs)
    batch = len(world_rngs)
    state = init_state(config, data.n_classes, batch)
    rows = np.arange(batch)
    mistakes = np.zeros((batch, horizon), dtype=np.int64)
    for t in range(horizon):
        contexts = world.contexts()
        arms = choose(config, state, contexts, policy_rngs).arms
        rewards = world.rewards(arms)
        mistakes[:, t] = rewards == 0.0
        update(config, state, arms, contexts[rows, arms], rewards)
    return mistakes

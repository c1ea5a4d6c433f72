"""The explicit residual bootstrap of Algorithm 1, one experiment at a time.

This is the definition LinReBoot starts from: every residual of arm ``k`` gets
its own bootstrap weight, drawn afresh each round, and the index is

    mu_tilde_k = mu_hat_k + (1 / s_k) sum_i w_{k,i} e_{k,i},
    e_{k,i} = r_{k,i} - mu_hat_k.

It costs O(s_k) per arm and round, so the policies never use it: they draw the
Gaussian-weight index from its closed form (:func:`policies.indices.linreboot`).
It is kept, unvectorised and deliberately plain, as the reference that closed
form is tested against, and to run the non-Gaussian (Rademacher) weights the
paper mentions.

References
----------
Wu, Wang, Li, Cheng. Residual Bootstrap Exploration for Stochastic Linear
Bandit. UAI 2022: Algorithm 1, eq. (6) (the index), "Choice of Bootstrapping
Weights" (Gaussian and Rademacher weights), Section 3.3 (efficient form).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]
Weights = Literal["gaussian", "rademacher"]

WEIGHTS: tuple[Weights, ...] = get_args(Weights)


def bootstrap_weights(
    size: int, sigma_omega: float, weights: Weights, rng: np.random.Generator
) -> Array:
    """I.i.d. bootstrap weights with mean 0 and variance ``sigma_omega ** 2``.

    Parameters
    ----------
    size : int
        Number of weights (the arm's pull count s_k).
    sigma_omega : float
        Standard deviation of each weight.
    weights : {"gaussian", "rademacher"}
        ``N(0, sigma_omega^2)``, or ``+sigma_omega`` / ``-sigma_omega`` with
        probability 1/2 each.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray, shape (size,)
    """
    if weights == "gaussian":
        return sigma_omega * rng.standard_normal(size)
    if weights == "rademacher":
        signs = np.where(rng.integers(0, 2, size=size) == 1, 1.0, -1.0)
        return sigma_omega * signs
    raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")


def explicit_bootstrap_index_from_residuals(
    mu_hat: ArrayLike,
    residuals_by_arm: Sequence[ArrayLike],
    sigma_omega: float,
    weights: Weights,
    rng: np.random.Generator,
) -> Array:
    """``mu_hat_k + (1 / s_k) sum_i w_{k,i} e_{k,i}`` for given residuals.

    Use this form when the residuals are not taken against ``mu_hat`` itself,
    e.g. against the context each reward was observed with
    (``e_{k,i} = r_{k,i} - x_{k,i}' theta_hat``, the ``observed`` variant).

    Parameters
    ----------
    mu_hat : array_like, shape (K,)
        Estimated mean reward of every arm this round, ``x_k' theta_hat``.
    residuals_by_arm : sequence of K array_like, the k-th of shape (s_k,)
        The residuals of arm ``k``'s past rewards.
    sigma_omega : float
        Standard deviation of the bootstrap weights (non-negative).
    weights : {"gaussian", "rademacher"}
        Distribution of the weights, see :func:`bootstrap_weights`.
    rng : numpy.random.Generator
        Arms are visited in order ``0 .. K-1``, each drawing its ``s_k`` weights.

    Returns
    -------
    ndarray, shape (K,)
        The bootstrapped means ``mu_tilde``. An arm never pulled (``s_k = 0``)
        has no residual to resample and gets ``mu_hat_k`` unperturbed, as in
        :func:`policies.indices.linreboot`.

    Raises
    ------
    ValueError
        On a ``mu_hat`` that is not one-dimensional, a residual list of the
        wrong length, a residual array that is not one-dimensional, a negative
        or non-finite ``sigma_omega`` or an unknown weight distribution.
    """
    mu = np.asarray(mu_hat, dtype=np.float64)
    if mu.ndim != 1:
        raise ValueError(f"mu_hat must be one-dimensional, got shape {mu.shape}")
    if len(residuals_by_arm) != mu.shape[0]:
        raise ValueError(
            f"need one residual array per arm: {mu.shape[0]} arms, {len(residuals_by_arm)} arrays"
        )
    if not (math.isfinite(sigma_omega) and sigma_omega >= 0.0):
        raise ValueError("sigma_omega must be a non-negative finite number")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    index = mu.copy()
    for k, residuals in enumerate(residuals_by_arm):
        e = np.asarray(residuals, dtype=np.float64)
        if e.ndim != 1:
            raise ValueError(f"residuals of arm {k} must be one-dimensional, got shape {e.shape}")
        if e.size == 0:
            continue
        w = bootstrap_weights(e.size, sigma_omega, weights, rng)
        index[k] += float(np.dot(w, e)) / e.size
    return index


def explicit_bootstrap_index(
    mu_hat: ArrayLike,
    rewards_by_arm: Sequence[ArrayLike],
    sigma_omega: float,
    weights: Weights,
    rng: np.random.Generator,
) -> Array:
    """LinReBoot's index by the explicit residual bootstrap (Algorithm 1, eq. 6).

    ``mu_tilde_k = mu_hat_k + (1 / s_k) sum_i w_{k,i} (r_{k,i} - mu_hat_k)`` with
    i.i.d. weights of mean 0 and variance ``sigma_omega^2``. Given the history,
    the index has mean ``mu_hat_k`` and variance
    ``sigma_omega^2 RSS_k / s_k^2`` whatever the weight distribution; with
    Gaussian weights it is exactly ``N(mu_hat_k, sigma_omega^2 RSS_k / s_k^2)``
    (Section 3.3).

    Parameters
    ----------
    mu_hat : array_like, shape (K,)
        Estimated mean reward of every arm this round, ``x_k' theta_hat``.
    rewards_by_arm : sequence of K array_like, the k-th of shape (s_k,)
        The rewards arm ``k`` returned so far.
    sigma_omega : float
        Standard deviation of the bootstrap weights (non-negative).
    weights : {"gaussian", "rademacher"}
        ``N(0, sigma_omega^2)`` or ``+-sigma_omega`` with probability 1/2.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray, shape (K,)
        The bootstrapped means; an arm never pulled gets ``mu_hat_k``.

    Raises
    ------
    ValueError
        On inputs of the wrong shape or an invalid ``sigma_omega`` / ``weights``
        (see :func:`explicit_bootstrap_index_from_residuals`).
    """
    mu = np.asarray(mu_hat, dtype=np.float64)
    if mu.ndim != 1:
        raise ValueError(f"mu_hat must be one-dimensional, got shape {mu.shape}")
    if len(rewards_by_arm) != mu.shape[0]:
        raise ValueError(
            f"need one reward array per arm: {mu.shape[0]} arms, {len(rewards_by_arm)} arrays"
        )
    residuals = [
        np.asarray(rewards, dtype=np.float64) - mu[k] for k, rewards in enumerate(rewards_by_arm)
    ]
    return explicit_bootstrap_index_from_residuals(mu, residuals, sigma_omega, weights, rng)

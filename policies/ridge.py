"""Batched ridge regression and Gaussian draws from Cholesky factors.

All functions take a leading batch axis ``B`` and a model axis ``M`` (1 when
theta is shared by the arms, K in the covariates setting).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.floating[Any]]


def regularised(xtx: Array, reg: float) -> Array:
    """``X'X + reg I`` for a stack of Gram matrices, shape (..., d, d)."""
    d = xtx.shape[-1]
    return xtx + reg * np.eye(d)


def cholesky(gram: Array) -> Array:
    """Lower Cholesky factors of a stack of positive definite matrices."""
    return np.linalg.cholesky(gram)


# Below this many matrices LAPACK (one call per matrix) is faster; above it,
# substitution vectorised across the stack is (its cost is d numpy calls,
# whatever the stack size). Both are exact up to rounding.
_SUBSTITUTION_MIN_STACK = 48


def solve_triangular(chol: Array, rhs: Array, *, transpose: bool = False) -> Array:
    """Solve ``L y = rhs`` (or ``L' y = rhs``) for a stack of lower factors.

    Parameters
    ----------
    chol : ndarray, shape (..., d, d), lower triangular
    rhs : ndarray, shape (..., d, m)

    Returns
    -------
    ndarray, shape (..., d, m)
    """
    tri = np.swapaxes(chol, -1, -2) if transpose else chol
    stack = int(np.prod(np.broadcast_shapes(chol.shape[:-2], rhs.shape[:-2])))
    if stack < _SUBSTITUTION_MIN_STACK:
        return np.linalg.solve(tri, rhs)
    d = chol.shape[-1]
    out = np.empty(np.broadcast_shapes(tri.shape[:-1], (*rhs.shape[:-2], d)) + rhs.shape[-1:])
    for i in range(d - 1, -1, -1) if transpose else range(d):
        # Slices, not index lists: the solved part is contiguous on either side.
        solved = slice(i + 1, d) if transpose else slice(0, i)
        partial = np.matmul(tri[..., i : i + 1, solved], out[..., solved, :])[..., 0, :]
        out[..., i, :] = (rhs[..., i, :] - partial) / tri[..., i, i, None]
    return out


def cho_solve(chol: Array, rhs: Array) -> Array:
    """Solve ``(L L') z = rhs`` for a stack of factors.

    Parameters
    ----------
    chol : ndarray, shape (..., d, d)
    rhs : ndarray, shape (..., d)

    Returns
    -------
    ndarray, shape (..., d)
    """
    y = solve_triangular(chol, rhs[..., None])
    return solve_triangular(chol, y, transpose=True)[..., 0]


def ridge(xtx: Array, xty: Array, reg: float) -> tuple[Array, Array]:
    """Ridge estimate ``theta_hat = (X'X + reg I)^-1 X'y`` (paper eq. 3b).

    Returns
    -------
    theta_hat : ndarray, shape (..., d)
    chol : ndarray, shape (..., d, d)
        Lower Cholesky factor of ``X'X + reg I``, reused for sampling and widths.
    """
    chol = cholesky(regularised(xtx, reg))
    return cho_solve(chol, xty), chol


def gaussian_direction(chol: Array, z: Array) -> Array:
    """``L'^-1 z``: a draw from ``N(0, (L L')^-1)`` when ``z`` is standard normal.

    This is the GUIDE's ``solve(L.T, z)``: no matrix inverse and no SVD per draw.
    """
    return solve_triangular(chol, z[..., None], transpose=True)[..., 0]


def inverse_norms(chol: Array, contexts: Array) -> Array:
    """``||x_k||^2`` in the metric ``(L L')^-1`` for every arm.

    Parameters
    ----------
    chol : ndarray, shape (B, M, d, d), M in {1, K}
    contexts : ndarray, shape (B, K, d)

    Returns
    -------
    ndarray, shape (B, K)
    """
    if chol.shape[1] == 1:
        w = solve_triangular(chol[:, 0], np.swapaxes(contexts, 1, 2))  # (B, d, K)
        return np.einsum("bdk,bdk->bk", w, w)
    w = solve_triangular(chol, contexts[..., None])[..., 0]  # (B, K, d)
    return np.einsum("bkd,bkd->bk", w, w)


def predict(theta: Array, contexts: Array) -> Array:
    """Mean reward ``x_k' theta`` of every arm.

    Parameters
    ----------
    theta : ndarray, shape (B, M, d), M in {1, K}
    contexts : ndarray, shape (B, K, d)

    Returns
    -------
    ndarray, shape (B, K)
    """
    if theta.shape[1] == 1:
        return np.matmul(contexts, theta[:, 0, :, None])[..., 0]
    return np.einsum("bkd,bkd->bk", contexts, theta)


def quadratic(theta: Array, gram: Array) -> Array:
    """``theta' G theta`` for stacks, shape (...,)."""
    return np.einsum("...i,...ij,...j->...", theta, gram, theta)


class BufferedStreams(Sequence[np.random.Generator]):
    """One generator per experiment, with standard normals drawn in blocks.

    A drop-in for the list of generators that :func:`policies.choose` takes.
    Normals are drawn ``block`` requests at a time from each experiment's own
    generator, which saves one Python call per experiment per round in long
    simulations. Experiment ``b``'s draws still depend only on its generator
    and its own history, so a batch of 100 decides like 100 single runs with
    the same wrapper; the stream differs from unbuffered draws.
    """

    def __init__(self, rngs: Sequence[np.random.Generator], block: int = 256) -> None:
        self._rngs = list(rngs)
        self._block = block
        self._buffer: Array | None = None
        self._position = 0

    def __len__(self) -> int:
        return len(self._rngs)

    def __getitem__(self, index: int) -> np.random.Generator:  # type: ignore[override]
        return self._rngs[index]

    def normals(self, shape: tuple[int, ...]) -> Array:
        size = int(np.prod(shape))
        if self._buffer is None or self._position + size > self._buffer.shape[1]:
            # Every experiment consumes the same number of normals per round, so
            # all refill together; a remainder too short for a request is dropped.
            self._buffer = np.stack([g.standard_normal(self._block * size) for g in self._rngs])
            self._position = 0
        out = self._buffer[:, self._position : self._position + size]
        self._position += size
        return out.reshape(len(self._rngs), *shape)


def standard_normals(rngs: Sequence[np.random.Generator], shape: tuple[int, ...]) -> Array:
    """One independent block of N(0, 1) draws per experiment, shape (B, *shape).

    Each experiment draws from its own generator, so experiment ``b`` makes the
    same decisions alone as in a batch of 100.
    """
    if isinstance(rngs, BufferedStreams):
        return rngs.normals(shape)
    if len(rngs) == 1:  # the service's batch of one: no list and stack
        return rngs[0].standard_normal(shape)[None]
    return np.stack([rng.standard_normal(shape) for rng in rngs])

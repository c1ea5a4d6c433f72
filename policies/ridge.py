"""Batched ridge regression that cannot fail, and Gaussian draws from its factor.

All functions take a leading batch axis ``B`` and a model axis ``M`` (1 when
theta is shared by the arms, K in the covariates setting).

Numerics
--------
Raw features of very different scales (a price next to an indicator) or
large collinear ones (the same context again and again) make ``X'X + lambda I``
too ill-conditioned for a plain Cholesky factorisation in float64: at
``|x_i| = 1e6`` and d = 3, a few hundred identical contexts are enough. Every
solve here therefore works on the same well-posed system:

1. **Equilibration.** With ``s = diag(A)^(-1/2)`` the matrix ``S A S`` has a
   unit diagonal, so its condition number reflects collinearity only, not the
   features' units.
2. **A relative floor.** The matrix factorised is ``S A S + JITTER I``, that
   is ``A + JITTER diag(A)`` in the original coordinates: its condition
   number is at most ``(d + JITTER) / JITTER``. The floor changes the ridge
   estimate only along directions that the data determine to less than
   ``JITTER`` of their own scale (where the rounding error of the stored sums
   is of the same order), and by a relative ``JITTER * cond(S A S)`` elsewhere.
3. **A fallback that cannot fail.** Rounding in a long sum of outer products
   can leave ``X'X`` indefinite by a few ulps; a row whose solve or Cholesky
   factorisation then fails is redone by a symmetric eigendecomposition with
   the eigenvalues clipped at zero before the floor is added. Rows are
   handled one at a time, so a row's result does not depend on the rest of
   the batch (an experiment decides the same alone and in a batch of 100).

The solves are LAPACK's, one call per stack: no per-machine tuning. They call
the generalised ufuncs behind ``numpy.linalg.solve`` and ``cholesky``
directly (:func:`lu_solve`, :func:`cholesky`): the same LAPACK routine on the
same arrays, so the same bits, without the wrapper's per-call checks, which
cost more than a 20 x 20 solve itself in a single experiment's round.

References
----------
Higham, *Accuracy and Stability of Numerical Algorithms* (2002), sections 7.3
(row and column scaling) and 10.1 (Cholesky and the scaled condition number).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.floating[Any]]

JITTER = 1e-10
"""Relative floor added to the equilibrated system (see the module notes)."""

try:  # the gufuncs numpy.linalg wraps; private, hence the fallback and the test
    from numpy.linalg import _umath_linalg

    _LU_SOLVE: Any = _umath_linalg.solve
    _CHOLESKY: Any = _umath_linalg.cholesky_lo
except (ImportError, AttributeError):  # pragma: no cover - another numpy's layout
    _LU_SOLVE = _CHOLESKY = None


def lu_solve(matrix: Array, rhs: Array) -> Array:
    """``numpy.linalg.solve(matrix, rhs)`` for float64 stacks, rhs shape (..., d, m).

    A singular row gives NaN (numpy.linalg raises for the whole stack), which
    every caller's check sends down its fallback, row by row.
    """
    if _LU_SOLVE is None:  # pragma: no cover
        return _solve_rows(matrix, rhs)
    with np.errstate(all="ignore"):
        return _LU_SOLVE(matrix, rhs, signature="dd->d")


def cholesky(matrix: Array) -> Array:
    """``numpy.linalg.cholesky`` for a float64 stack; NaN rows where it is not definite."""
    if _CHOLESKY is None:  # pragma: no cover
        return np.stack([_cholesky_nan(m) for m in matrix.reshape(-1, *matrix.shape[-2:])]
                        ).reshape(matrix.shape)
    with np.errstate(all="ignore"):
        return _CHOLESKY(matrix, signature="d->d")


def _cholesky_nan(matrix: Array) -> Array:
    try:
        return np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        return np.full_like(matrix, np.nan)


def regularised(xtx: Array, reg: float) -> Array:
    """``X'X + reg I`` for a stack of Gram matrices, shape (..., d, d)."""
    d = xtx.shape[-1]
    return xtx + reg * np.eye(d)


def _equilibrate(xtx: Array, reg: float) -> tuple[Array, Array]:
    """The floored system ``S (xtx + reg I) S + JITTER I`` and ``s``, for a stack.

    ``s = diag(xtx + reg I)^(-1/2)``, or 1 where that diagonal is zero (a
    coordinate no data has touched, with ``reg = 0``).
    """
    scale, touched = _scale(xtx, 1.0, reg)
    system = _scaled(xtx, scale)
    _unit_diagonal(system, touched)
    return system, scale


def _scale(xtx: Array, weight: float, reg: float) -> tuple[Array, NDArray[np.bool_] | None]:
    """``s = diag(weight xtx + reg I)^(-1/2)`` (1 where that diagonal is not positive), and
    the mask of the positive entries, None when all are."""
    d = xtx.shape[-1]
    # The diagonal as a strided view of the flattened matrices (cheaper than np.diagonal).
    diagonal = xtx.reshape(*xtx.shape[:-2], d * d)[..., :: d + 1]
    diagonal = diagonal + reg if weight == 1.0 else weight * diagonal + reg
    # A Gram matrix's diagonal is a sum of squares: with a ridge it is positive.
    # Without, it is 0 where no data has touched that coordinate, and a bare
    # second-moment matrix made by cancellation (the authors' LinGIRO) can round
    # to a tiny negative; the masks, which cost a few array calls, only when some
    # entry is not positive.
    touched = None
    if reg <= 0:
        positive_entries = diagonal > 0
        if np.count_nonzero(positive_entries) < positive_entries.size:
            touched = positive_entries
    positive = diagonal if touched is None else np.where(touched, diagonal, 1.0)
    # 1 / sqrt, not ** -0.5: pow costs about 25 ns an element, which at B = K = 100
    # and d = 20 (a model per arm) was a third of a round.
    scale = np.sqrt(positive)
    np.divide(1.0, scale, out=scale)
    return scale, touched


def _scaled(xtx: Array, scale: Array) -> Array:
    """``S xtx S``, a new array."""
    # One temporary: the outer product of the scales, multiplied in place.
    system = np.multiply(scale[..., :, None], scale[..., None, :])
    return np.multiply(xtx, system, out=system)


def _diagonal_view(system: Array) -> Array:
    d = system.shape[-1]
    return system.reshape(*system.shape[:-2], d * d)[..., :: d + 1]


def _unit_diagonal(system: Array, touched: NDArray[np.bool_] | None) -> None:
    """Write the equilibrated diagonal with its floor, in place (a strided view):
    ``s_i^2 (weight xtx_ii + reg)`` is 1 by the choice of s, 0 where that diagonal is 0."""
    on_diagonal = _diagonal_view(system)
    on_diagonal[...] = 1.0 + JITTER if touched is None else np.where(touched, 1.0 + JITTER, JITTER)


def perturbed_systems(xtx: Array, weight: float, reg: float) -> tuple[Equilibrated, Equilibrated]:
    """LinPHE's and LinGIRO's two systems in one scaling: ``G = weight X'X + reg I``
    equilibrated (the scale of :meth:`Equilibrated.of`, the entries to an ulp or two:
    the products go in another order), and ``X'X`` itself in G's
    scaling, ``S X'X S + JITTER I``, whose factor gives the root of their perturbation
    (``X'X`` floored by ``JITTER`` of G's diagonal). One outer product and one product
    with ``X'X`` serve both (a separate equilibration of ``X'X`` cost as much again).
    """
    scale, touched = _scale(xtx, weight, reg)
    bare = _scaled(xtx, scale)
    gram = bare * weight if weight != 1.0 else bare.copy()
    _unit_diagonal(gram, touched)
    _diagonal_view(bare)[...] += JITTER
    return Equilibrated(gram, scale), Equilibrated(bare, scale)


def _spectral(matrix: Array) -> tuple[Array, Array]:
    """Eigenvalues (clipped at 0, plus the floor) and eigenvectors of ``S A S``.

    ``matrix`` already holds the floor; it is taken off before clipping so
    that a row done here solves the same system as one done by the fast path.
    """
    values, vectors = np.linalg.eigh(matrix)
    return np.maximum(values - JITTER, 0.0) + JITTER, vectors


def _spectral_solve(matrix: Array, rhs: Array) -> Array:
    """``matrix^-1 rhs`` through :func:`_spectral`, for a stack; rhs shape (..., d, m)."""
    values, vectors = _spectral(matrix)
    coefficients = np.matmul(np.swapaxes(vectors, -1, -2), rhs) / values[..., :, None]
    return np.matmul(vectors, coefficients)


def _spectral_root(matrix: Array) -> Array:
    """A square root ``R`` (``R R' = matrix``, floored) that is not triangular."""
    values, vectors = _spectral(matrix)
    return vectors * np.sqrt(values)[..., None, :]


def ridge(xtx: Array, xty: Array, reg: float) -> Array:
    """Ridge estimate ``theta_hat = (X'X + reg I)^-1 X'y`` (paper eq. 3b), floored.

    Parameters
    ----------
    xtx : ndarray, shape (..., d, d)
        Gram matrices ``X'X`` (without the ridge term).
    xty : ndarray, shape (..., d)
    reg : float, positive

    Returns
    -------
    theta_hat : ndarray, shape (..., d)
    """
    return solve(xtx, reg, xty[..., None])[..., 0]


def solve(xtx: Array, reg: float, rhs: Array) -> Array:
    """``(X'X + reg I)^-1 rhs``, floored, for several right-hand sides at once.

    One LAPACK solve of the equilibrated system (module notes); a row whose
    solve fails, or whose solution is larger than the floor allows (the mark
    of a system that rounding left indefinite), is redone spectrally.

    Parameters
    ----------
    xtx : ndarray, shape (..., d, d)
    reg : float, non-negative
    rhs : ndarray, shape (..., d, m)

    Returns
    -------
    ndarray, shape (..., d, m)
    """
    return Equilibrated(*_equilibrate(xtx, reg)).solve(rhs)


@dataclass(frozen=True)
class Equilibrated:
    """The floored, equilibrated system of one stack of ``X'X + reg I`` (module notes).

    Made once per state, it serves every solve and the factor of that matrix:
    a policy that needs both (the Thompson samplers) equilibrates once.

    Attributes
    ----------
    system : ndarray, shape (..., d, d)
        ``S (X'X + reg I) S + JITTER I``.
    scale : ndarray, shape (..., d)
        ``s = diag(X'X + reg I)^(-1/2)``.
    """

    system: Array
    scale: Array

    @classmethod
    def of(cls, xtx: Array, reg: float) -> Equilibrated:
        return cls(*_equilibrate(xtx, reg))

    def solve(self, rhs: Array) -> Array:
        """``(X'X + reg I)^-1 rhs`` (floored); rhs shape (..., d, m)."""
        system, scale = self.system, self.scale
        # C order: a broadcast product may come out in another, which LAPACK must copy.
        scaled = np.multiply(scale[..., None], rhs, order="C")
        solution = lu_solve(system, scaled)  # NaN for an exactly singular row
        # On the floored system ||column|| <= ||rhs column|| / JITTER; twice that
        # (or a NaN) means rounding made it indefinite.
        # (numpy's stubs do not know a gufunc's axis argument)
        squares = np.vecdot(solution, solution, axis=-2)  # type: ignore[call-overload]
        bounds = np.vecdot(scaled, scaled, axis=-2)  # type: ignore[call-overload]
        bounds *= 4.0 / JITTER**2
        fine = squares <= bounds
        if np.count_nonzero(fine) < fine.size:  # count_nonzero: cheaper than all()
            suspect = ~fine.all(axis=-1)
            solution[suspect] = _spectral_solve(system[suspect], scaled[suspect])
        solution *= scale[..., None]  # in place: a fresh array of this size costs page faults
        return solution

    def factor(self) -> Factor:
        """The :class:`Factor` of this system: Cholesky, spectral for a row it refuses."""
        system = self.system
        root = cholesky(system)  # NaN rows where Cholesky refuses
        refused = np.isnan(root[..., -1, -1])
        if np.count_nonzero(refused):
            root[refused] = [_spectral_root(m) for m in system[refused]]
        return Factor(self.scale, root)


def _solve_rows(system: Array, scaled: Array) -> Array:
    """Row by row, so that a singular row does not change how the others are solved."""
    flat_rhs = np.broadcast_to(scaled, (*system.shape[:-2], *scaled.shape[-2:]))
    return np.stack([
        _solve_one(m, b) for m, b in zip(
            system.reshape(-1, *system.shape[-2:]),
            flat_rhs.reshape(-1, *scaled.shape[-2:]), strict=True,
        )
    ]).reshape(flat_rhs.shape)


def _solve_one(matrix: Array, rhs: Array) -> Array:
    try:
        return np.linalg.solve(matrix, rhs)
    except np.linalg.LinAlgError:
        return np.full(rhs.shape, np.nan)


@dataclass(frozen=True)
class Factor:
    """A factorisation ``A = S^-1 R R' S^-1`` of the floored ``gram + reg I``.

    ``R`` is the lower Cholesky factor of the equilibrated system, or for a
    row that Cholesky refused a (non-triangular) spectral square root; every
    use below goes through a general solve, so either serves.

    Attributes
    ----------
    scale : ndarray, shape (..., d)
        ``s = diag(A)^(-1/2)``.
    root : ndarray, shape (..., d, d)
    """

    scale: Array
    root: Array

    def solve(self, rhs: Array) -> Array:
        """``A^-1 rhs``; rhs shape (..., d)."""
        inner = lu_solve(self.root, (self.scale * rhs)[..., None])
        return self.scale * lu_solve(np.swapaxes(self.root, -1, -2), inner)[..., 0]

    def colour(self, z: Array) -> Array:
        """``S R'^-1 z``: a draw from ``N(0, A^-1)`` when ``z`` is standard normal.

        The GUIDE's ``solve(L.T, z)``: no matrix inverse and no SVD per draw.
        """
        lifted = lu_solve(np.swapaxes(self.root, -1, -2), z[..., None])[..., 0]
        return self.scale * lifted

    def times_root(self, z: Array) -> Array:
        """``S^-1 R z``: a draw from ``N(0, A)`` when ``z`` is standard normal."""
        return np.matmul(self.root, z[..., None])[..., 0] / self.scale


def factorise(xtx: Array, reg: float = 0.0) -> Factor:
    """The :class:`Factor` of ``xtx + reg I`` (floored); ``reg`` may be 0 for a bare Gram.

    Parameters
    ----------
    xtx : ndarray, shape (..., d, d), positive semi-definite
    reg : float, non-negative
    """
    return Equilibrated.of(xtx, reg).factor()


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
    # G theta, then a dot: a three-operand einsum's loop cost about six times as much at
    # B = 100, K = 10, d = 20 (770 against 135 µs), LinGIRO's every round with a model per arm.
    # matmul takes BLAS for contiguous rows and its own loop for strided ones, which may
    # differ in the last bits: a caller's batch and single paths must lay theta out alike
    # (today's do, so an experiment decides alone as in a batch).
    return np.vecdot(theta, np.matmul(gram, theta[..., None])[..., 0])


class BufferedStreams(Sequence[np.random.Generator]):
    """One generator per experiment, with its normals and uniforms drawn in blocks.

    A drop-in for the list of generators that :func:`policies.choose` takes.
    Normals (and the Gamma draws' normals and uniforms, each kind in its own
    buffer) are drawn ``block`` requests at a time from each experiment's own
    generator, which saves one Python call per experiment per round in long
    simulations. Experiment ``b``'s draws still depend only on its generator
    and its own history, so a batch of 100 decides like 100 single runs with
    the same wrapper; the stream differs from unbuffered draws.
    """

    def __init__(self, rngs: Sequence[np.random.Generator], block: int = 256) -> None:
        self._rngs = list(rngs)
        self._block = block
        self._buffers: dict[str, tuple[Array, int]] = {}  # kind: (values, position)
        # Uniforms for the arms picked at random, which only some experiments draw in a
        # round: a position per experiment, each refilled alone when it runs out (made
        # at the first pick).
        self._uniforms: Array | None = None
        self._uniform_at = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._rngs)

    def __getitem__(self, index: int) -> np.random.Generator:  # type: ignore[override]
        return self._rngs[index]

    def normals(self, shape: tuple[int, ...]) -> Array:
        return self._take("normals", shape)

    def gammas(self, shapes: Array) -> Array:
        """``Gamma(shapes[b])`` draws for experiment b from its own stream, shape of ``shapes``.

        Marsaglia and Tsang's method, vectorised: one buffered normal and one
        uniform per draw, accepted or not; a draw whose candidate is rejected
        (about 5 % at shape 1, 0.1 % at shape 20), or whose shape is below 1,
        is drawn again by its experiment's generator itself (exact, and rare).
        Either way the value has the Gamma law, and each experiment uses only
        its own generator: a batch still decides like single runs.
        """
        per_row = shapes.reshape(len(self._rngs), -1)
        size = per_row.shape[1]
        values, accepted = gamma_candidates(
            per_row, self._take("gamma normals", (size,)), self._take("gamma uniforms", (size,))
        )
        if np.count_nonzero(accepted) < accepted.size:
            for row, column in zip(*np.nonzero(~accepted), strict=True):
                values[row, column] = self._rngs[row].standard_gamma(float(per_row[row, column]))
        return values.reshape(shapes.shape)

    def uniforms(self, rows: NDArray[np.int64]) -> Array:
        """One uniform on [0, 1) for each of ``rows`` (distinct experiments), from the
        experiment's own buffer: a row's position moves only when that row draws."""
        block = self._block
        if self._uniforms is None:
            self._uniforms = np.empty((len(self._rngs), block))
            self._uniform_at = np.full(len(self._rngs), block)
        at = self._uniform_at[rows]
        spent = rows[at == block]
        if spent.size:
            for row in spent.tolist():
                self._rngs[row].random(out=self._uniforms[row])
            at[at == block] = 0
        self._uniform_at[rows] = at + 1
        return self._uniforms[rows, at]

    def _take(self, kind: str, shape: tuple[int, ...]) -> Array:
        """The next ``shape`` values of ``kind`` from every experiment's buffer, (B, *shape)."""
        size = math.prod(shape)
        values, position = self._buffers.get(kind, (None, 0))
        if values is None or position + size > values.shape[1]:
            # Every experiment consumes the same number per round, so all refill
            # together; a remainder too short for a request is dropped. Each
            # generator fills its row in place (the values of a fresh draw): no
            # stacking copy. A new buffer, so earlier blocks stay valid.
            values = np.empty((len(self._rngs), self._block * size))
            for generator, row in zip(self._rngs, values, strict=True):
                if kind == "gamma uniforms":
                    generator.random(out=row)
                else:
                    generator.standard_normal(out=row)
            position = 0
        self._buffers[kind] = (values, position + size)
        return values[:, position : position + size].reshape(len(self._rngs), *shape)


def gamma_candidates(shapes: Array, normals: Array, uniforms: Array
                     ) -> tuple[Array, NDArray[np.bool_]]:
    """Marsaglia and Tsang's Gamma(shape) candidate from a standard normal and a uniform,
    and whether it is accepted (never for a shape below 1), elementwise.

    With ``d = shape - 1/3``, ``c = 1 / sqrt(9 d)`` and ``v = (1 + c x)^3`` the
    candidate ``d v`` is accepted when ``v > 0`` and
    ``log u < x^2 / 2 + d - d v + d log v``; an accepted candidate has the
    Gamma(shape) law exactly. Every candidate takes the logarithmic test: Marsaglia
    and Tsang's squeeze ``u < 1 - 0.0331 x^4`` accepts a subset of what it accepts
    (in exact arithmetic; in floating point checked over shapes 1 to 500), so it
    would change no decision, and for the hundred candidates of a shared model's
    round the calls it saves cost more than the logarithms of all of them (about
    even at 1,000 candidates, the paper's covariates world; slower from 10,000).

    References
    ----------
    Marsaglia, Tsang. A simple method for generating gamma variables. ACM
    Transactions on Mathematical Software 26(3), 2000.
    """
    d = shapes - 1.0 / 3.0
    c = 1.0 / np.sqrt(9.0 * np.maximum(d, 0.5))  # d >= 2/3 from shape 1; below, refused
    root = 1.0 + c * normals
    v = root * root * root
    # u = 0 (probability 2^-53): log u = -inf, accepted; v <= 0: NaN, refused by root > 0.
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = d * (1.0 - v + np.log(v))
        bound += 0.5 * (normals * normals)
        accepted = np.log(uniforms) < bound
    accepted &= root > 0.0
    accepted &= shapes >= 1.0
    return d * v, accepted


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


def uniform_integers(rngs: Sequence[np.random.Generator], rows: NDArray[np.int64],
                     counts: NDArray[np.int64]) -> NDArray[np.int64]:
    """For each of ``rows``, a uniform integer in ``[0, counts[i])`` from ``rngs[rows[i]]``.

    Plain generators (the service's) call ``integers(count)``, exactly uniform. A
    :class:`BufferedStreams` takes ``floor(u count)`` of one of the row's buffered
    uniforms (:meth:`BufferedStreams.uniforms`): a Python call per row cost more than
    the rest of a round's first pass; each value's probability is within
    ``count 2^-53`` of ``1 / count``.
    """
    if isinstance(rngs, BufferedStreams):
        # Below count: u <= 1 - 2^-53, and rounded to nearest u * count stays below any
        # whole count up to 2^53 (tested at the largest u).
        return (rngs.uniforms(rows) * counts).astype(np.int64)
    return np.array([rngs[row].integers(count)
                     for row, count in zip(rows.tolist(), counts.tolist(), strict=True)],
                    dtype=np.int64)


def standard_gammas(rngs: Sequence[np.random.Generator], shapes: Array) -> Array:
    """One ``Gamma(shapes[b])`` draw per entry of row b from experiment b's generator.

    ``shapes`` has shape (B, ...). A :class:`BufferedStreams` draws them from
    its buffers (:meth:`BufferedStreams.gammas`); plain generators (the
    service's) with NumPy's own sampler.
    """
    if isinstance(rngs, BufferedStreams):
        return rngs.gammas(shapes)
    return _gammas(rngs, shapes)


def _gammas(rngs: Sequence[np.random.Generator], shapes: Array) -> Array:
    """Row b's draws from ``rngs[b]``, shape of ``shapes``.

    With one shape per row (a shared model) each draw takes a Python float:
    NumPy's scalar path gives the value a one-element array would, about ten
    times faster (the array path's set-up dominates a single draw).
    """
    if shapes[0].size == 1:
        values = [g.standard_gamma(s) for g, s in zip(rngs, shapes.reshape(-1).tolist(),
                                                      strict=True)]
        return np.array(values).reshape(shapes.shape)
    return np.stack([rng.standard_gamma(s) for rng, s in zip(rngs, shapes, strict=True)])

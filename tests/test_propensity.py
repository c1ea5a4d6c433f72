"""Propensities (``policies.propensity``) against the policy's own draws and exact integrals.

* **Monte Carlo.** ``n`` decisions of ``policies.draw`` itself (masking,
  ties, exploration and epsilon included; one generator feeds all the draws
  at once) estimate each arm's probability ``q``, whose standard error is
  ``s = sqrt(q (1 - q) / n) <= 0.0005`` at ``n = 1e6``. An exact propensity
  ``p`` passes ``|p - q| <= 4.5 s`` except with probability below ``7e-6``
  per arm. Every policy in every setting is checked at ``n = 1e6`` with the
  tolerance ``max(1e-3, 4.5 s)`` (a 1e6-draw estimate cannot resolve 1e-3 for
  probabilities near 1/2: 1e-3 is two of its standard errors there); the
  targeted cases (spreads a million times apart, point masses and ties,
  masking, exploration, epsilon, a shared model) take as many draws as make
  ``1e-3`` at least 4.5 standard errors, and check ``1e-3`` itself.
* **Quadrature.** The independent-arms integral against
  ``scipy.integrate.quad`` (adaptive, an independent method) to ``1e-4``,
  which the module's notes claim (its measured worst is 6e-5).
* **Structure.** Rows sum to 1; an experiment in a batch gets the same
  numbers, bit for bit, as alone; the chosen-arm form equals the full one.

The shared-model estimate has its own standard error (at most
``SHARED_TARGET_SE = 1e-4``), added in quadrature to the Monte Carlo's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import integrate, special

import policies.propensity as propensity_module
from policies import (
    POLICIES,
    SETTINGS,
    PolicyConfig,
    Ready,
    draw,
    init_state,
    paper_config,
    prepare,
    update,
)
from policies.authors import index_of
from policies.config import PolicyName, Setting
from policies.propensity import (
    FINE,
    SERVICE,
    SHARED_TARGET_SE,
    Accuracy,
    arm_propensity,
    estimated,
    off_the_loop,
    propensities,
    shared_propensity,
)
from policies.ridge import Array, BufferedStreams
from tests.test_policies_behaviour import make_worlds

TOL = 1e-3  # the acceptance criterion
QUADRATURE = 1e-4  # the claimed error of the independent-arms integral
CHUNK = 250_000


# --------------------------------------------------------------------------- Monte Carlo


class _OneStream(BufferedStreams):
    """``n`` experiments whose generators are one: every draw's normals in one call."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        super().__init__([rng] * n)
        self._rng, self._n = rng, n

    def normals(self, shape: tuple[int, ...]) -> Array:
        return self._rng.standard_normal((self._n, *shape))

    def gammas(self, shapes: Array) -> Array:
        return self._rng.standard_gamma(shapes)

    def uniforms(self, rows: NDArray[np.int64]) -> Array:
        return self._rng.random(rows.size)


def replicate(ready: Ready, n: int) -> Ready:
    """``n`` copies of a one-experiment decision: ``draw`` of it makes n independent draws."""
    def copies(a: NDArray[Any]) -> NDArray[Any]:
        return np.broadcast_to(a, (n, *a.shape[1:]))

    exploring = np.arange(n) if ready.exploring_rows.size else ready.exploring_rows
    return Ready(ready.config, {k: copies(v) for k, v in ready.prepared.items()},
                 copies(ready.eligible), copies(ready.unexplored), exploring, ready.masked)


def frequencies(ready: Ready, draws: int, seed: int) -> Array:
    """How often ``draw(ready)`` picks each arm in ``draws`` decisions."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(ready.eligible.shape[1])
    for start in range(0, draws, CHUNK):
        size = min(CHUNK, draws - start)
        arms = draw(replicate(ready, size), _OneStream(rng, size)).arms
        counts += np.bincount(arms, minlength=counts.size)
    return counts / draws


def draws_for(p: Array, own_se: float = 0.0) -> int:
    """Draws that make TOL 4.5 standard errors of ``p - q`` at every arm (at least 1e6)."""
    budget = ((TOL - QUADRATURE) / 4.5) ** 2 - own_se**2
    return max(1_000_000, math.ceil(float(np.max(p * (1.0 - p))) / budget))


def check_against_monte_carlo(ready: Ready, seed: int, draws: int | None = None) -> Array:
    """``propensities(ready)`` vs ``draws`` decisions; TOL when ``draws`` is ``draws_for``."""
    p = propensities(ready)[0]
    own = SHARED_TARGET_SE if _shared(ready) else 0.0
    n = draws_for(p, own) if draws is None else draws
    q = frequencies(ready, n, seed)
    noise = 4.5 * np.sqrt(q * (1.0 - q) / n + own**2) + QUADRATURE
    tolerance = np.maximum(TOL, noise) if draws is not None else np.full_like(p, TOL)
    assert np.all(np.abs(p - q) <= tolerance), (p, q, n)
    return p


def _shared(ready: Ready) -> bool:
    return ready.config.shared and ready.config.name in ("lints-g", "lints-ig", "linphe",
                                                         "lingiro")


def state_after(
    name: PolicyName, setting: Setting, rounds: int, seed: int, n_arms: int = 4, dim: int = 3,
    **overrides: float | str,
) -> tuple[PolicyConfig, Ready]:
    """A policy's prepared decision after ``rounds`` rounds of a seeded world."""
    config = paper_config(name, setting, dim, **overrides)
    worlds = make_worlds(setting, [seed], rounds + 1, n_arms, dim)
    state = init_state(config, n_arms)
    rng = np.random.default_rng([seed, 2])
    for t in range(rounds):
        arms = draw(prepare(config, state, worlds.contexts[:, t]), [rng]).arms
        rewards = worlds.means[0, t, arms] + worlds.noise[0, t, arms]
        update(config, state, arms, worlds.contexts[0, t, arms], rewards)
    return config, prepare(config, state, worlds.contexts[:, rounds])


@pytest.mark.parametrize(("name", "setting"), [(n, s) for n in POLICIES for s in SETTINGS])
def test_every_policy_against_a_million_of_its_own_draws(
    name: PolicyName, setting: Setting
) -> None:
    _, ready = state_after(name, setting, rounds=30, seed=POLICIES.index(name))
    p = check_against_monte_carlo(ready, seed=1, draws=1_000_000)
    assert p.sum() == pytest.approx(1.0, abs=4 * 4 * SHARED_TARGET_SE + 4 * QUADRATURE)


def ready_for(
    mean: Sequence[float], spread: Sequence[float], eligible: Sequence[bool] | None = None,
    pulled: Sequence[bool] | None = None, epsilon: float = 0.0,
) -> Ready:
    """A LinReBoot decision whose indices are N(mean_k, spread_k^2), built directly."""
    mu = np.array([mean], dtype=float)
    ok = np.ones_like(mu, dtype=bool) if eligible is None else np.array([eligible])
    unexplored = ok & (False if pulled is None else ~np.array([pulled]))
    config = PolicyConfig("linreboot", "covariates", 1, sigma_omega=1.0, epsilon=epsilon)
    return Ready(config, {"mu_hat": mu, "spread": np.array([spread], dtype=float)}, ok,
                 unexplored, np.flatnonzero(unexplored.any(axis=1)),
                 bool(unexplored.any() or not ok.all()))


def test_spreads_a_million_times_apart() -> None:
    # A wide arm over narrow ones: each narrow CDF is a step inside the wide density.
    p = check_against_monte_carlo(
        ready_for([0.0, 0.3, 0.3001, 0.2999, -0.5], [1.0, 1e-6, 1e-4, 1e-3, 2.0]), seed=2)
    assert np.all(p > 0.01)  # every arm contends


def test_point_masses_ties_and_random_arms() -> None:
    # Arms 0 and 1 are point masses tied at 1: they split what the random arms leave.
    p = check_against_monte_carlo(ready_for([1.0, 1.0, 1.1, 1.0 + 1e-7, 0.2],
                                            [0.0, 0.0, 0.1, 1e-6, 0.5]), seed=3)
    assert p[0] == p[1] > 0.01


def test_ineligible_arms_are_never_chosen() -> None:
    p = check_against_monte_carlo(
        ready_for([0.0, 2.0, 0.1, 0.2, 5.0], [1.0, 1.0, 0.5, 1.0, 1.0],
                  eligible=[True, False, True, True, False]), seed=4)
    assert p[1] == p[4] == 0.0


def test_unexplored_eligible_arms_first_uniformly() -> None:
    eligible = [True] * 24 + [False]
    pulled = [True] * 4 + [False] * 21
    ready = ready_for(np.linspace(0, 1, 25).tolist(), [1.0] * 25, eligible, pulled)
    # Exact by construction; 200,000 draws (draw picks each row's arm in Python)
    # confirm that draw is uniform: 4.5 standard errors are 2.2e-3 here.
    p = check_against_monte_carlo(ready, seed=5, draws=200_000)
    assert np.array_equal(p, np.array([0.0] * 4 + [1 / 20] * 20 + [0.0]))


def test_epsilon_mixes_in_a_uniform_choice() -> None:
    ready = ready_for([0.0, 0.5, 0.6, 3.0], [1.0, 0.1, 0.1, 0.0], epsilon=0.04)
    p = check_against_monte_carlo(ready, seed=6)
    exact = propensities(ready_for([0.0, 0.5, 0.6, 3.0], [1.0, 0.1, 0.1, 0.0]))
    assert np.array_equal(p, 0.96 * exact[0] + 0.04 / 4)


def test_a_shared_model_with_enough_draws_for_the_acceptance_bound() -> None:
    _, ready = state_after("lints-g", "stochastic", rounds=40, seed=7, n_arms=5)
    check_against_monte_carlo(ready, seed=8)


# --------------------------------------------------------------------------- quadrature


def reference(mean: Array, spread: Array, arm: int) -> float:
    """``int phi_a(t) prod_(k != a) Phi_k(t) dt`` by adaptive quadrature, every CDF's
    turn a breakpoint."""
    others = np.arange(mean.size) != arm

    def integrand(t: float) -> float:
        density = math.exp(-0.5 * ((t - mean[arm]) / spread[arm]) ** 2) / spread[arm]
        return density / math.sqrt(2 * math.pi) * float(np.prod(special.ndtr(
            (t - mean[others]) / spread[others])))

    low, high = mean[arm] - 12 * spread[arm], mean[arm] + 12 * spread[arm]
    turns = {float(m + z * s) for m, s in zip(mean, spread, strict=True) for z in (-3, -1, 0, 1, 3)}
    points = sorted(t for t in turns if low < t < high)
    return float(integrate.quad(integrand, low, high, points=points or None, limit=2000,
                                epsabs=1e-13, epsrel=1e-12)[0])


@pytest.mark.parametrize(("accuracy", "tolerance"), [(FINE, QUADRATURE), (SERVICE, 1e-3)])
@pytest.mark.parametrize("seed", range(4))
def test_the_integral_against_adaptive_quadrature(
    seed: int, accuracy: Accuracy, tolerance: float
) -> None:
    """Both accuracies against adaptive quadrature: the library's default and the service's."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n_arms = int(rng.integers(2, 7))
        mean = rng.normal(size=n_arms) * rng.choice([0.1, 1.0, 3.0])
        spread = np.exp(rng.normal(size=n_arms) * rng.choice([0.3, 1.0, 3.0, 6.0]))
        p = propensities(ready_for(mean.tolist(), spread.tolist()), accuracy=accuracy)[0]
        exact = np.array([reference(mean, spread, a) for a in range(n_arms)])
        assert np.abs(p - exact).max() <= tolerance, (mean, spread, p, exact)


@pytest.mark.parametrize("seed", range(3))
def test_factors_down_to_a_tenth_of_arm_as_spread_take_the_smooth_rule_as_accurately(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The smooth rule's nodes are spaced by the narrowest factor, so it serves factors
    down to SMOOTH (0.1) times arm a as accurately as wider ones, at a quarter of the
    merged rule's time (BENCHMARKS.md §21): many arms, the narrowest 0.1-0.25 times
    the chosen one, against adaptive quadrature, with the merged rule never called."""

    def merged(*args: object, **kwargs: object) -> Array:
        raise AssertionError("the merged rule ran")

    monkeypatch.setattr(propensity_module._Window, "merged", merged)
    rng = np.random.default_rng([seed, 21])
    checked = 0
    while checked < 12:
        n_arms = int(rng.integers(3, 40))
        mean = rng.normal(size=n_arms) * rng.choice([0.1, 0.5, 1.0])
        spread = np.exp(rng.uniform(math.log(0.1), 0.0, size=n_arms)) * rng.choice(
            [0.05, 1.0, 3.0])
        arm = int(np.argmax(mean + spread * rng.normal(size=n_arms)))
        if not 0.1 <= np.delete(spread, arm).min() / spread[arm] < 0.25:
            continue
        exact = reference(mean, spread, arm)
        for accuracy, tolerance in ((FINE, QUADRATURE), (SERVICE, 1e-3)):
            p = propensities(ready_for(mean.tolist(), spread.tolist()), np.array([arm]),
                             accuracy=accuracy)[0]
            assert abs(p - exact) <= tolerance, (mean, spread, arm, p, exact)
        checked += 1


def t_reference(mean: Array, spread: Array, dof: Array, arm: int) -> float:
    """The Student t integral by adaptive quadrature over arm a's quantiles ``v`` in (0, 1),
    every other mean a breakpoint."""
    others = np.arange(mean.size) != arm

    def integrand(v: float) -> float:
        t = mean[arm] + spread[arm] * special.stdtrit(dof[arm], v)
        return float(np.prod(special.stdtr(dof[others], (t - mean[others]) / spread[others])))

    turns = sorted(float(special.stdtr(dof[arm], (m - mean[arm]) / spread[arm])) for m in mean)
    points = [v for v in turns if 1e-12 < v < 1 - 1e-12]
    return float(integrate.quad(integrand, 0.0, 1.0, points=points or None, limit=4000,
                                epsabs=1e-12, epsrel=1e-10)[0])


@pytest.mark.parametrize(("accuracy", "tolerance"), [(FINE, QUADRATURE), (SERVICE, 1e-3)])
def test_the_student_t_integral_against_adaptive_quadrature(
    accuracy: Accuracy, tolerance: float
) -> None:
    """LinTS-IG with a model per arm: independent t indices, 1 (an arm never pulled with
    alpha = 1/2: Cauchy) to 500 degrees of freedom."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        n_arms = int(rng.integers(2, 6))
        mean = rng.normal(size=n_arms) * rng.choice([0.1, 1.0, 3.0])
        spread = np.exp(rng.normal(size=n_arms) * rng.choice([0.3, 1.0, 3.0]))
        dof = rng.choice([1.0, 2.0, 3.0, 5.0, 12.0, 60.0, 500.0], size=n_arms)
        # rate / shape = spread^2 with shape = dof / 2, loadings of norm 1 (d = 1): V = 1,
        # so theta = X'y = mean and rate = beta + (y'y - mean^2) / 2
        beta = 1e-6
        config = PolicyConfig("lints-ig", "covariates", 1, ig_beta=beta)
        shape = dof / 2
        squares = 2.0 * (spread**2 * shape - beta) + mean**2
        # As prepare_lints_inverse_gamma lays out a model per arm: the draw basis
        # (theta_hat, W = V^-1 L = 1) and the rate from theta_hat.
        prepared = {"xty": mean[None, :, None], "basis.theta": mean[None, :, None],
                    "basis.lift": np.ones((1, n_arms, 1, 1)), "shape": shape[None],
                    "rate": (beta + 0.5 * (squares - mean**2))[None],
                    "squares": squares[None], "contexts": np.ones((1, n_arms, 1))}
        ok = np.ones((1, n_arms), dtype=bool)
        ready = Ready(config, prepared, ok, ~ok, np.zeros(0, dtype=np.int64), False)
        p = propensities(ready, accuracy=accuracy)[0]
        exact = np.array([t_reference(mean, spread, dof, a) for a in range(n_arms)])
        assert np.abs(p - exact).max() <= tolerance, (mean, spread, dof, p, exact)


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize(("name", "setting"), [
    ("linreboot", "contextual"), ("lints-ig", "covariates"), ("linphe", "stochastic"),
    ("linucb", "covariates"),
])
def test_an_experiment_gets_the_same_numbers_alone_and_in_a_batch(
    name: PolicyName, setting: Setting
) -> None:
    config = paper_config(name, setting, 3, epsilon=0.1)
    batch, horizon = 12, 12
    worlds = make_worlds(setting, list(range(batch)), horizon + 1, 5, 3)
    state = init_state(config, 5, batch)
    rngs = [np.random.default_rng([s, 2]) for s in range(batch)]
    rows = np.arange(batch)
    # Different histories: a row pulls only while t < its number (some still explore).
    for t in range(horizon):
        ready = prepare(config, state, worlds.contexts[:, t])
        arms = draw(ready, rngs).arms
        active = rows[rows > t]
        rewards = worlds.means[active, t, arms[active]] + worlds.noise[active, t, arms[active]]
        part = {k: v[active] for k, v in state.items()}
        update(config, part, arms[active], worlds.contexts[active, t, arms[active]], rewards)
        for k in state:
            state[k][active] = part[k]
    eligible = np.ones((batch, 5), dtype=bool)
    eligible[::3, 1] = False
    together = propensities(prepare(config, state, worlds.contexts[:, horizon], eligible))
    for row in range(batch):
        alone = prepare(config, {k: v[row: row + 1] for k, v in state.items()},
                        worlds.contexts[row: row + 1, horizon], eligible[row: row + 1])
        assert np.array_equal(propensities(alone)[0], together[row])
        chosen = np.arange(5)
        for arm in chosen:
            assert propensities(alone, np.array([arm]))[0] == together[row, arm]
    assert np.allclose(together.sum(axis=1), 1.0, atol=5 * 4 * SHARED_TARGET_SE)
    assert np.all(together[::3, 1] == 0.0)


@pytest.mark.parametrize("accuracy", [FINE, SERVICE])
def test_one_arms_propensity_is_the_batched_rules_number(
    accuracy: Accuracy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service asks for one arm (a lean path for the smooth rule): the same bits as
    the batched rule, whichever rule serves."""
    served: list[bool] = []
    lean = propensity_module._smooth_one

    def counted(*args: Any) -> float | None:
        value = lean(*args)
        served.append(value is not None)
        return value

    monkeypatch.setattr(propensity_module, "_smooth_one", counted)
    rng = np.random.default_rng(5)
    for _ in range(60):
        n_arms = int(rng.integers(2, 30))
        mean = rng.normal(size=n_arms) * rng.choice([0.1, 1.0, 3.0])
        spread = np.exp(rng.normal(size=n_arms) * rng.choice([0.1, 0.3, 3.0]))
        ready = ready_for(mean.tolist(), spread.tolist())
        every = propensities(ready, accuracy=accuracy)[0]
        for arm in range(n_arms):
            assert propensities(ready, np.array([arm]), accuracy=accuracy)[0] == every[arm]
    assert 0 < sum(served) < len(served)  # both the lean path and the fallback were taken


def test_the_shared_model_estimate_reports_its_standard_error() -> None:
    config, ready = state_after("lints-ig", "contextual", rounds=40, seed=9, n_arms=6)
    from policies.indices import INDEX

    law = INDEX["lints-ig"].law(config, ready.prepared)
    assert law.loadings is not None and law.dof is not None
    errors = [shared_propensity(law.mean[0], law.loadings[0], float(law.dof[0]),
                                ready.eligible[0], arm)[1] for arm in range(6)]
    assert 0.0 <= max(errors) <= SHARED_TARGET_SE


def test_identical_arms_of_a_shared_model_split_their_chance() -> None:
    """Two arms with the same context score the same in every draw (ties split evenly)."""
    config = paper_config("lints-g", "contextual", 2)
    state = init_state(config, 3)
    contexts = np.array([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    for arm, reward in ((0, 1.0), (1, 0.2), (2, 0.3), (0, 0.8)):
        update(config, state, np.array([arm]), contexts[:, arm], np.array([reward]))
    p = check_against_monte_carlo(prepare(config, state, contexts), seed=10, draws=1_000_000)
    assert p[1] == p[2] > 0.01


def test_arms_must_be_one_per_experiment_and_in_range() -> None:
    ready = ready_for([0.0, 1.0], [1.0, 1.0])
    for bad in (np.array([2]), np.array([-1]), np.array([0, 1])):
        with pytest.raises(ValueError, match="arm indexes"):
            propensities(ready, bad)


@pytest.mark.parametrize("policy", ["lints-g", "lints-ig"])
def test_the_services_coarser_shared_estimate_is_within_its_standard_error(
    policy: PolicyName,
) -> None:
    """The service stops a shared model's estimate at ``SERVICE.shared_se``; each value is
    within 4.5 of those standard errors (plus the accurate one's) of the accurate value,
    and the service's flag says which states are estimated."""
    _, ready = state_after(policy, "contextual", rounds=60, seed=11, n_arms=12)
    assert estimated(ready)
    accurate = propensities(ready)[0]
    coarse = propensities(ready, accuracy=SERVICE)[0]
    assert np.all(np.abs(coarse - accurate) <= 4.5 * (SERVICE.shared_se + SHARED_TARGET_SE))
    assert not estimated(state_after("linreboot", "contextual", rounds=5, seed=1, n_arms=3)[1])


@pytest.mark.parametrize(("policy", "setting", "slow"), [
    ("lints-ig", "covariates", True),  # Student t arms: integrated, on a finer grid
    ("lints-g", "contextual", True),  # a shared model: estimated
    ("lints-g", "covariates", False),  # independent normal arms
    ("linreboot", "covariates", False),
    ("linucb", "stochastic", False),
])
def test_the_propensities_a_server_runs_off_its_event_loop(
    policy: PolicyName, setting: Setting, slow: bool
) -> None:
    """``off_the_loop`` marks the laws whose propensity has no microsecond rule: a shared
    model's correlated scores, and Student t scores (the law's degrees of freedom)."""
    _, ready = state_after(policy, setting, rounds=60, seed=3, n_arms=30, dim=5)
    law = index_of(ready.config).law(ready.config, ready.prepared)
    assert off_the_loop(ready) == slow == (estimated(ready) or law.dof is not None)


@pytest.mark.parametrize("policy", ["linreboot", "lints-g", "linucb"])
def test_the_only_eligible_arm_is_chosen_with_probability_exactly_one(policy: str) -> None:
    config = paper_config(policy, "covariates", 2, **(  # type: ignore[arg-type]
        {"spread": "pooled"} if policy == "linreboot" else {}))
    state = init_state(config, 3)
    rng = np.random.default_rng(0)
    for arm in (0, 1, 2, 0):
        update(config, state, np.array([arm]), rng.normal(size=(1, 2)), rng.normal(size=1))
    contexts = np.broadcast_to(rng.normal(size=2), (1, 3, 2))
    eligible = np.array([[False, True, False]])
    ready = prepare(config, state, contexts, eligible)
    assert propensities(ready).tolist() == [[0.0, 1.0, 0.0]]
    assert propensities(ready, np.array([1])).tolist() == [1.0]


def test_one_decisions_path_gives_the_general_paths_bits() -> None:
    """Issue 26: the propensity of one experiment's drawn arm with independent normal
    indices (the service's every LinReBoot decision) takes a shorter path, the same
    operations on the same numbers: its values are the general path's, bit for bit, with
    every arm eligible or some not, arms alike or a factor far narrower than the arm (the
    smooth rule does not serve), and other arms' point masses (below arm a's window, or
    inside it: then the merged rule); arm a a point mass is the general path's."""
    from unittest import mock

    module = propensity_module
    rng = np.random.default_rng(26)
    taken = taken_beside_points = 0
    for case in range(300):
        n_arms = int(rng.integers(2, 40))
        mean = rng.normal(size=n_arms) * rng.choice([0.01, 0.3, 3.0])
        spread = np.exp(rng.normal(size=n_arms) * rng.choice([0.1, 1.0, 4.0]))
        if case % 5 == 0:
            spread[rng.integers(n_arms)] = 0.0  # a point mass
        if case % 5 == 1:  # several, one perhaps the highest index of all
            spread[rng.choice(n_arms, size=max(1, n_arms // 4), replace=False)] = 0.0
        eligible = rng.random(n_arms) < 0.8 if case % 3 == 0 else np.ones(n_arms, bool)
        eligible[0] = True
        ready = dataclasses.replace(ready_for(mean.tolist(), spread.tolist(), eligible.tolist()),
                                    every_arm_eligible=bool(eligible.all()))
        for arm in np.flatnonzero(eligible)[:3]:
            chosen = np.array([arm])
            law = index_of(ready.config).law(ready.config, ready.prepared)
            took = module._one_normal(ready, law, int(arm), SERVICE) is not None
            taken += took
            taken_beside_points += took and not spread.all()
            fast = propensities(ready, chosen, accuracy=SERVICE)
            with mock.patch.object(module, "_one_normal", lambda *a: None):
                general = propensities(ready, chosen, accuracy=SERVICE)
            assert fast.tobytes() == general.tobytes(), (case, arm, fast, general)
    assert taken > 300  # the short path served most cases, not only the fallbacks
    assert taken_beside_points > 60, taken_beside_points  # and those beside point masses


@pytest.mark.parametrize("accuracy", [FINE, SERVICE])
def test_an_experiments_arm_by_arm_propensities_are_its_propensities(
    accuracy: Accuracy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: the service asks for one arm after another from the same statistics, with
    what their integrals share computed once (arm_propensity): each is propensities'
    value for that arm, bit for bit: every arm, eligible or not, beside point masses, with
    epsilon, with arms to explore (where the general path serves), and in a LinReBoot
    world played for a while; an arm out of range is refused as propensities refuses it."""
    lean: list[bool] = []
    value_of = propensity_module._NormalArms.value

    def counted(self: Any, arm: int) -> float | None:
        value = value_of(self, arm)
        lean.append(value is not None)
        return value

    monkeypatch.setattr(propensity_module._NormalArms, "value", counted)
    made: list[int] = []
    of = propensity_module._NormalArms.of

    def counted_of(ready: Ready, law: Any, accuracy: Accuracy) -> Any:
        made.append(1)
        return of(ready, law, accuracy)

    monkeypatch.setattr(propensity_module._NormalArms, "of", counted_of)
    rng = np.random.default_rng(37)
    readies = []
    for case in range(150):
        n_arms = int(rng.integers(2, 30))
        mean = rng.normal(size=n_arms) * rng.choice([0.01, 0.3, 3.0])
        spread = np.exp(rng.normal(size=n_arms) * rng.choice([0.1, 1.0, 4.0]))
        if case % 4 == 0:
            spread[rng.choice(n_arms, size=max(1, n_arms // 4), replace=False)] = 0.0
        eligible = rng.random(n_arms) < 0.8 if case % 3 == 0 else np.ones(n_arms, bool)
        eligible[0] = True
        pulled = rng.random(n_arms) < 0.9 if case % 7 == 0 else None
        epsilon = 0.1 if case % 5 == 0 else 0.0
        ready = ready_for(mean.tolist(), spread.tolist(), eligible.tolist(),
                          None if pulled is None else pulled.tolist(), epsilon)
        readies.append(dataclasses.replace(ready, every_arm_eligible=bool(eligible.all())))
    for spread in ("paper", "pooled"):  # the paper's LinReBoot, and the service's default
        readies.append(state_after("linreboot", "stochastic", rounds=300, seed=4, n_arms=12,
                                   dim=5, spread=spread)[1])
    served = 0
    for ready in readies:
        one = arm_propensity(ready, accuracy)
        every = propensities(ready, accuracy=accuracy)[0]
        for arm in range(ready.eligible.shape[1]):
            expected = propensities(ready, np.array([arm]), accuracy=accuracy)[0]
            made.clear()
            assert one(arm) == expected, (arm, one(arm), expected)
            assert not made  # the shared arrays are not made again, nor on the fallback
            served += every[arm] > 0
    assert served > 1000  # most of them integrals, not the zeros of ineligible arms
    assert sum(lean) > 0.6 * len(lean) > 600  # by the shared arrays, most of them
    for arm in (12, -1):
        with pytest.raises(ValueError, match="arms must be"):
            arm_propensity(readies[-1], accuracy)(arm)

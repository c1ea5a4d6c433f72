"""Prototype of a LinReBoot that needs no tuning (issue 11, item 3): first figures.

Not a policy yet: the index is computed here from the policies' own state and
functions, so the paper's LinReBoot (``policies``) is untouched. The
prototype ("pooled") changes two things:

* **no forced first pass**: an arm never pulled competes from the start;
* **one pseudo-residual per arm of the pooled size**: the spread is
  ``sigma_omega sqrt(RSS_k + v) / (s_k + 1)`` with
  ``v = (sum_k RSS_k + v_y) / (sum_k s_k + 1)``, the residual variance pooled
  over the arms (``v_y``: the variance of all rewards so far, 1 before two),
  so an arm with ``s_k = 0`` or ``RSS_k = 0`` (0/1 rewards) keeps a spread;

and "capped" also caps that spread at ``sigma_omega sqrt(v_k x_k' V^-1 x_k)``
(``v_k = (RSS_k + v) / (s_k + 1)``): no more uncertain than the model's own
estimate of ``x_k' theta``, which with one theta shared by many arms is far
less than one arm's pulls suggest; with one model per arm the cap rarely binds.
All with one ``sigma_omega`` for every setting. Usage::

    python -m benchmarks.proto_default --reps 20 --horizon 3000
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from loadtest.environments import Environment, make_spec, split_rngs
from policies import PolicyConfig, choose, init_state, paper_config, update
from policies.indices import reward_variance
from policies.ridge import Array, predict, regularised, ridge
from policies.state import State

Scorer = Callable[[State, Array, list[np.random.Generator]], Array]


def leverage(state: State, contexts: Array, reg: float) -> Array:
    """``x_k' V^-1 x_k`` with ``V = X'X + reg I`` of arm k's model, shape (B, K)."""
    gram = regularised(state["xtx"], reg)  # (B, M, d, d)
    if gram.shape[1] == 1:
        lifted = np.linalg.solve(gram[:, 0], np.swapaxes(contexts, 1, 2))  # (B, d, K)
        return np.einsum("bdk,bkd->bk", lifted, contexts)
    lifted = np.linalg.solve(gram, contexts[..., None])[..., 0]
    return np.einsum("bkd,bkd->bk", lifted, contexts)


def pooled_scores(config: PolicyConfig, shared_cap: bool = False) -> Scorer:
    def score(state: State, contexts: Array, rngs: list[np.random.Generator]) -> Array:
        theta = ridge(state["xtx"], state["xty"], config.reg)
        mu_hat = predict(theta, contexts)
        pulls, centre = state["pulls"], mu_hat - state["shift_r"]
        rss = state["sum_dr2"] - 2.0 * centre * state["sum_dr"] + pulls * centre**2
        rss = np.maximum(rss, 0.0)
        n = state["n"].sum(axis=1)
        prior = np.where(n > 1, reward_variance(state).mean(axis=1), 1.0)
        pooled = (rss.sum(axis=1) + prior) / (pulls.sum(axis=1) + 1.0)
        spread = config.sigma_omega * np.sqrt(rss + pooled[:, None]) / (pulls + 1.0)
        if shared_cap:  # no more uncertain than the model's own estimate of x_k' theta
            own = np.sqrt((rss + pooled[:, None]) / (pulls + 1.0))
            cap = config.sigma_omega * own * np.sqrt(leverage(state, contexts, config.reg))
            spread = np.minimum(spread, cap)
        z = np.stack([rng.standard_normal(mu_hat.shape[1]) for rng in rngs])
        return np.asarray(mu_hat + spread * z)
    return score


def run(setting: str, name: str, reps: int, horizon: int, seed: int) -> Array:
    """Final cumulative regret of every repetition, shape (reps,)."""
    spec = make_spec(setting, 5)  # type: ignore[arg-type]
    env_rngs, policy_rngs = split_rngs(seed, reps)
    env = Environment(spec, env_rngs)
    policy, _, sigma = name.partition(":")
    pooled = policy in ("pooled", "capped")
    base = "linreboot" if pooled else policy
    config = paper_config(base, spec.setting, spec.dim)  # type: ignore[arg-type]
    if pooled:
        config = paper_config("linreboot", spec.setting, spec.dim, sigma_omega=float(sigma))
    state = init_state(config, spec.n_arms, reps)
    rows, regret = np.arange(reps), np.zeros(reps)
    scorer = pooled_scores(config, policy == "capped") if pooled else None
    for _ in range(horizon):
        contexts = env.contexts()
        if scorer is None:
            arms = choose(config, state, contexts, policy_rngs).arms
        else:
            arms = np.argmax(scorer(state, contexts, policy_rngs), axis=1)
        means = env.means(contexts)
        regret += means.max(axis=1) - means[rows, arms]
        update(config, state, arms, contexts[rows, arms], env.rewards(contexts, arms))
    return regret


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--horizon", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", nargs="+", default=["stochastic", "contextual",
                                                          "covariates"])
    parser.add_argument("--policies", nargs="+", default=[
        "linreboot", "greedy", "linucb-const", "pooled:0.5", "pooled:1"])
    args = parser.parse_args()
    print(f"d = 5, {args.reps} repetitions x {args.horizon} rounds, seed {args.seed}; "
          "final regret mean ± s.e. (same worlds in a row)")
    print("| setting | " + " | ".join(args.policies) + " |")
    print("|---" * (len(args.policies) + 1) + "|")
    for setting in args.settings:
        start, cells = time.perf_counter(), []
        for name in args.policies:
            r = run(setting, name, args.reps, args.horizon, args.seed)
            cells.append(f"{r.mean():.1f} ± {r.std(ddof=1) / math.sqrt(r.size):.1f}")
        print(f"| {setting} | " + " | ".join(cells) + f" |  ({time.perf_counter() - start:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()

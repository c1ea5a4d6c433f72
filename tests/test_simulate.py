"""The in-process simulator: seeding, batching and the results format."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from loadtest.environments import Environment, split_rngs
from loadtest.experiment import GridRun, write_outputs
from loadtest.plots import regret_grid
from loadtest.results import read_curves, recorded_rounds, summarise
from loadtest.simulate import (
    Cell,
    Player,
    cell_seed,
    grid,
    play,
    play_together,
    run_cell,
    to_curve,
)
from policies.config import POOLED_SIGMA_OMEGA, PolicyName
from policies.ridge import BufferedStreams, standard_normals


@pytest.mark.parametrize("setting", ["stochastic", "contextual", "covariates"])
@pytest.mark.parametrize("policy", ["linreboot", "lints-ig", "lingiro"])
def test_a_repetition_plays_the_same_alone_and_in_a_batch(setting: str, policy: str) -> None:
    """Buffered per-repetition streams: repetition 0 of a batch of 3 equals a batch of 1."""
    cell = Cell(setting, 3, policy)  # type: ignore[arg-type]
    batch = play(cell, 3, 150, seed=11)
    alone = play(cell, 1, 150, seed=11)
    assert np.array_equal(batch.arms[0], alone.arms[0])
    assert np.array_equal(batch.cumulative[0], alone.cumulative[0])


def test_buffered_normals_are_each_generators_own_stream() -> None:
    seeds = [3, 4]
    streams = BufferedStreams([np.random.default_rng(s) for s in seeds], block=4)
    draws = np.concatenate([standard_normals(streams, (5,)) for _ in range(9)], axis=1)
    for row, s in enumerate(seeds):
        # Refills of 4 requests x 5 normals; nothing is dropped since 20 is a multiple of 5.
        assert np.array_equal(draws[row], np.random.default_rng(s).standard_normal(45 + 15)[:45])


@pytest.mark.parametrize("shape", [0.4, 1.0, 1.2, 2.0, 7.5, 60.0, 5000.0])
def test_buffered_gammas_have_the_gamma_law(shape: float) -> None:
    """Kolmogorov-Smirnov against Gamma(shape) at 1 in 1,000: 20,000 draws from 4 streams.

    Below shape 1 every draw is its generator's own (the fallback); at 1 about
    5 % of the candidates are refused and drawn again: both paths are in the sample.
    """
    from scipy import stats

    streams = BufferedStreams([np.random.default_rng(s) for s in range(4)], block=16)
    draws = np.concatenate([streams.gammas(np.full((4, 25), shape)).ravel() for _ in range(200)])
    critical = np.sqrt(-np.log(1e-3 / 2) / 2) / np.sqrt(draws.size)  # asymptotic KS bound
    assert stats.kstest(draws, stats.gamma(shape).cdf).statistic < critical


def test_gamma_candidates_are_refused_as_often_as_the_method_says() -> None:
    """Marsaglia and Tsang accept with probability ``Gamma(a) e^d / (d^(a - 1/2) sqrt(2 pi))``
    (the integral of their acceptance bound over the normal: about 0.952 at a = 1, 0.994
    at a = 5); a shape below 1 is always refused. Within 5 standard errors."""
    from scipy import special

    from policies.ridge import gamma_candidates

    rng = np.random.default_rng(5)
    n = 200_000
    for shape in (1.0, 5.0):
        d = shape - 1.0 / 3.0
        expected = np.exp(special.gammaln(shape) + d - (shape - 0.5) * np.log(d)) / np.sqrt(
            2.0 * np.pi)
        _, accepted = gamma_candidates(np.full(n, shape), rng.standard_normal(n), rng.random(n))
        sd = np.sqrt(expected * (1.0 - expected) / n)
        assert abs(accepted.mean() - expected) < 5.0 * sd
    assert not gamma_candidates(np.full(10, 0.9), rng.standard_normal(10), rng.random(10))[1].any()


def test_gamma_candidates_accept_all_that_the_squeeze_would() -> None:
    """Marsaglia and Tsang's squeeze ``u < 1 - 0.0331 x^4`` (not computed: every candidate
    takes the logarithmic test) accepts only candidates that the test accepts, so
    leaving it out changes no draw; checked over 1,000,000 candidates, shapes 1 to 500."""
    from policies.ridge import gamma_candidates

    rng = np.random.default_rng(11)
    n = 1_000_000
    shapes, normals, uniforms = rng.uniform(1.0, 500.0, n), rng.standard_normal(n), rng.random(n)
    _, accepted = gamma_candidates(shapes, normals, uniforms)
    c = 1.0 / np.sqrt(9.0 * (shapes - 1.0 / 3.0))
    squeezed = (1.0 + c * normals > 0.0) & (uniforms < 1.0 - 0.0331 * normals**4)
    assert squeezed.sum() > 0.9 * n  # the squeeze decides most candidates
    assert accepted[squeezed].all()
    assert 0 < np.count_nonzero(accepted & ~squeezed) < 0.1 * n  # and the test the rest


def test_buffered_gammas_of_an_experiment_are_the_same_alone_and_in_a_batch() -> None:
    """Refused candidates are drawn again by their own experiment's generator only,
    between refills of the buffers of every kind (normals drawn in between, as LinTS-IG
    does)."""
    shapes = np.array([[1.0, 0.5, 3.0], [1.0, 2.0, 0.7], [1.5, 1.0, 1.0]])
    batch = BufferedStreams([np.random.default_rng(s) for s in (1, 2, 3)], block=8)
    alone = BufferedStreams([np.random.default_rng(2)], block=8)
    together, single = [], []
    for _ in range(50):
        together += [batch.gammas(shapes), standard_normals(batch, (2,))]
        single += [alone.gammas(shapes[1:2]), standard_normals(alone, (2,))]
    for mixed, one in zip(together, single, strict=True):
        assert np.array_equal(mixed[1:2], one)
    assert all(np.all(g > 0.0) for g in together[::2])


def test_buffered_uniforms_are_each_experiments_own_stream_whichever_rows_draw() -> None:
    """Picks (the first pass, ties) are drawn by some experiments only: each row's
    uniforms are its generator's ``random`` stream, refilled alone (block of 4)."""
    seeds = (7, 8, 9)
    streams = BufferedStreams([np.random.default_rng(s) for s in seeds], block=4)
    drawn: list[list[float]] = [[], [], []]
    for rows in ([0, 2], [1], [0, 1, 2], [2], [2], [2], [0, 2], [1, 2], [2], [0]):
        for row, value in zip(rows, streams.uniforms(np.array(rows)), strict=True):
            drawn[row].append(float(value))
    for row, s in enumerate(seeds):
        assert drawn[row] == np.random.default_rng(s).random(len(drawn[row])).tolist()


def test_uniform_integers_from_buffered_streams_are_uniform_and_below_the_count() -> None:
    """Frequencies of ``floor(u count)`` within 5 standard errors of ``1 / count`` (their
    bias, at most count 2^-53, is far below that); the largest uniform, 1 - 2^-53, gives
    ``count - 1``: its product with a whole count rounds below the count."""
    from policies.ridge import uniform_integers

    streams = BufferedStreams([np.random.default_rng(s) for s in range(50)])
    rows, counts = np.arange(50), np.full(50, 7)
    picks = np.concatenate([uniform_integers(streams, rows, counts) for _ in range(2_000)])
    frequencies = np.bincount(picks, minlength=8) / picks.size
    assert frequencies[7] == 0.0
    se = np.sqrt((1 / 7) * (6 / 7) / picks.size)
    assert np.all(np.abs(frequencies[:7] - 1 / 7) < 5.0 * se)

    class AlmostOne(BufferedStreams):
        def uniforms(self, rows: np.ndarray) -> np.ndarray:
            return np.full(rows.size, 1.0 - 2.0**-53)

    edge = AlmostOne([np.random.default_rng(0)] * 6)
    counts = np.array([1, 3, 64, 100, 99991, 2**40 + 1])
    assert np.array_equal(uniform_integers(edge, np.arange(6), counts), counts - 1)


def test_same_seed_same_curves_and_different_seed_differs() -> None:
    cell = Cell("covariates", 3, "linreboot")
    first, again = play(cell, 4, 200, seed=1), play(cell, 4, 200, seed=1)
    other = play(cell, 4, 200, seed=2)
    assert np.array_equal(first.cumulative, again.cumulative)
    assert not np.array_equal(first.cumulative, other.cumulative)


def test_summary_mean_and_standard_error() -> None:
    rng = np.random.default_rng(0)
    cumulative = np.cumsum(rng.random((7, 50)), axis=1)
    rounds = recorded_rounds(50, 10)
    assert rounds[0] == 1 and rounds[-1] == 50
    mean, se = summarise(cumulative, rounds)
    picked = cumulative[:, rounds - 1]
    assert np.allclose(mean, picked.mean(axis=0))
    assert np.allclose(se, picked.std(axis=0, ddof=1) / np.sqrt(7))


def test_grid_sweeps_sigma_omega_for_linreboot_only() -> None:
    cells = grid(["stochastic"], [5, 10], ["linreboot", "linucb"], sigma_omegas=[0.1, 0.5])
    labels = sorted({c.label for c in cells})
    assert labels == ["linreboot (σω=0.1)", "linreboot (σω=0.5)", "linucb"]
    assert len(cells) == 2 * 3
    assert {c.config().sigma_omega for c in cells if c.policy == "linreboot"} == {0.1, 0.5}


def test_grid_plays_linreboot_once_per_spread_rule() -> None:
    cells = grid(["stochastic"], [5], ["linreboot", "greedy"], spreads=["paper", "pooled"])
    assert [c.label for c in cells] == ["linreboot", "linreboot (spread=pooled)", "greedy"]
    paper, pooled, greedy = (c.config() for c in cells)
    assert (paper.spread, pooled.spread, greedy.spread) == ("paper", "pooled", "paper")
    assert pooled.sigma_omega == POOLED_SIGMA_OMEGA["stochastic"] != paper.sigma_omega


def test_the_authors_baselines_run_the_authors_linreboot_with_the_papers_spread_only() -> None:
    cells = grid(["covariates"], [5], ["linreboot", "greedy", "linucb"],
                 baselines="authors", spreads=["paper", "pooled"])
    variants = {c.label: c.config().variant for c in cells}
    assert variants == {"linreboot (variant=authors)": "authors",
                        "linreboot (spread=pooled)": "project",
                        "greedy": "project", "linucb (variant=authors)": "authors"}


@pytest.mark.parametrize("setting", ["stochastic", "contextual", "covariates"])
def test_cells_played_together_play_as_they_play_alone(setting: str) -> None:
    # One environment for the policies of a setting and d: each cell must get the
    # worlds, noise and decisions it gets alone (forgetting in a switching world too).
    switching = (("discount", 0.9),)
    cells = [Cell(setting, 4, "linreboot"), Cell(setting, 4, "lints-ig"),  # type: ignore[arg-type]
             Cell(setting, 4, "linreboot", overrides=(("spread", "pooled"),)),  # type: ignore[arg-type]
             Cell(setting, 4, "linucb-const", overrides=(("epsilon", 0.2),))]  # type: ignore[arg-type]
    for group in (cells, [Cell(setting, 4, "greedy", overrides=switching, switch_every=40),  # type: ignore[arg-type]
                          Cell(setting, 4, "linucb", switch_every=40)]):  # type: ignore[arg-type]
        together = play_together(group, 5, 150, 3)
        for cell, played in zip(group, together, strict=True):
            alone = play(cell, 5, 150, 3)
            np.testing.assert_array_equal(played.arms, alone.arms)
            np.testing.assert_array_equal(played.cumulative, alone.cumulative)
    assert len({p.arms.tobytes() for p in play_together(cells, 5, 150, 3)}) == len(cells)


def test_only_cells_of_the_same_worlds_are_played_together() -> None:
    from loadtest.experiment import _groups

    a, b = Cell("covariates", 5, "linreboot"), Cell("covariates", 5, "linucb")
    other_d, switching = Cell("covariates", 10, "linucb"), Cell("covariates", 5, "greedy",
                                                                   switch_every=100)
    with pytest.raises(ValueError, match="share their worlds"):
        play_together([a, other_d], 2, 10, 0)
    assert _groups([a, other_d, b, switching], seed=0) == [[other_d], [a, b], [switching]]
    # Fewer groups than jobs: split, so that every job has work.
    assert _groups([a, b], seed=0, jobs=2) == [[a], [b]]


def test_outputs_round_trip(tmp_path: Path) -> None:
    cells = grid(["stochastic", "covariates"], [3], ["linreboot", "greedy"])
    curves = [run_cell(c, reps=3, horizon=120, seed=0, points=30) for c in cells]
    paths = write_outputs(GridRun(curves, {}, 1.0), tmp_path, "test")
    back = {(c.setting, c.label): c for c in read_curves(paths["results"])}
    assert len(back) == 4
    for c in curves:
        twin = back[(c.setting, c.label)]
        assert np.array_equal(twin.rounds, c.rounds)
        assert np.allclose(twin.mean, c.mean, rtol=1e-5)
        assert np.allclose(twin.se, c.se, rtol=1e-5, atol=1e-9)
    assert paths["figure"].stat().st_size > 10_000
    text = paths["tables"].read_text()
    assert "| stochastic | 3 |" in text and "| covariates | 3 |" in text


def test_the_reproduction_benchmark_times_every_group_for_project_and_floor(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``benchmarks.bench_reproduction`` (BENCHMARKS.md §10) on a small grid: a row per
    group with positive times, and the totals."""
    from benchmarks.bench_reproduction import main

    main(["--reps", "3", "--horizon", "120", "--dims", "2", "3", "--jobs", "1"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and line[2].isalpha() and "setting" not in line]
    # The largest first: by d, the covariates group (the floor's largest) first within a d.
    assert [(r[1].strip(), r[2].strip()) for r in rows[:-1]] == [
        (s, d) for d in ("3", "2") for s in ("covariates", "stochastic", "contextual")]
    assert rows[-1][1].strip() == "all"
    assert all(float(r[4]) > 0 and float(r[5]) > 0 for r in rows)


def test_the_policy_benchmark_counts_the_cells_within_the_targets(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``benchmarks.bench_policies`` (BENCHMARKS.md §10) on two small cells: its summary
    counts the table's ratios as printed against 1.3 (batched) and 1.5 (alone)."""
    from benchmarks.bench_policies import main

    main(["--settings", "stochastic", "covariates", "--dims", "3", "--policies", "linreboot",
          "--horizon", "60", "--repeats", "1", "--batch", "4"])
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")
            and line.split("|")[2].strip().isdigit()]
    assert len(rows) == 2
    for kind, column, limit in (("batched", 7, 1.3), ("single", 10, 1.5)):
        ratios = [float(row[column].strip(" *")) for row in rows]
        within = sum(ratio <= limit for ratio in ratios)
        assert f"{kind}: within {limit}x of the floor in {within} of 2 cells; " \
               f"worst {max(ratios):.2f}" in out
    assert "the grid's batched time, project / floor: " in out


def test_a_delayed_reward_is_learnt_that_many_decisions_later() -> None:
    """With delay D, the outcome of round t is added at the end of round t + D: after
    t rounds the statistics hold t - D outcomes, those of the first rounds."""
    cell = Cell("covariates", 3, "greedy", delay=5)
    assert cell.label == "greedy (delay 5)"
    env = Environment(cell.env_spec(1), split_rngs(cell_seed(1, cell), 3)[0])
    player = Player.of(cell, 1, 3, 12, False)
    for t in range(12):
        contexts = env.contexts()
        player.step(t, env, contexts, env.means(contexts), env.noise())
        np.testing.assert_array_equal(player.state["n"].sum(axis=1), max(0, t + 1 - 5))
    immediate = play(Cell("covariates", 3, "greedy"), 3, 12, seed=1)
    assert not np.array_equal(immediate.arms, player.chosen)
    with pytest.raises(ValueError, match="delay"):
        play(Cell("covariates", 3, "greedy", delay=-1), 2, 3, seed=1)


def test_end_labels_keep_their_gap_and_stay_at_or_above_their_values() -> None:
    from loadtest.plots import spread_labels

    values = [1.0, 1.1, 1.15, 5.0, 5.02, 9.0]
    spots = spread_labels(values, gap=0.5)
    assert all(b - a >= 0.5 - 1e-12 for a, b in itertools.pairwise(spots))
    assert all(s >= v for s, v in zip(spots, values, strict=True))
    assert spots[0] == 1.0 and spots[3] == 5.0 and spots[5] == 9.0  # free ones stay put


def test_one_worlds_figure_has_the_curves_and_their_final_regret(tmp_path: Path) -> None:
    """The demo's figure (one setting and d): the curves labelled at their ends and a bar
    per policy (issue 30 item 4)."""
    import matplotlib.image

    policies: list[PolicyName] = ["linreboot", "linucb", "greedy"]
    cells = [Cell("stochastic", 2, p) for p in policies]
    curves = [to_curve("http", c, p) for c, p in zip(
        cells, play_together(cells, 2, 30, seed=0), strict=True)]
    path = regret_grid(curves, tmp_path / "demo.png", "a title")
    height, width, _ = matplotlib.image.imread(path).shape
    assert width > 1.5 * height  # two panels side by side, no legend below

"""Statistical tests of the classic mechanisms, with power.

Every distribution check is run twice: on the mechanism (must pass) and on a sample from
the same mechanism with 2/3 of the right noise (must be rejected) — so the check would
catch an under-noised implementation. Seeds are fixed; thresholds: accept p > 1e-3,
reject p < 1e-6.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from featuredp.mechanisms.classic import (
    CoinFlipSurvey,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponse,
    VectorMechanism,
    _on_grid,
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
)

N = 20_000
ACCEPT, REJECT = 1e-3, 1e-6


def _assert_power(check, good_sample, bad_sample):
    assert check(good_sample) > ACCEPT
    assert check(bad_sample) < REJECT


# ----------------------------------------------------------------------------------------------- Laplace


@pytest.mark.statistical
@pytest.mark.parametrize("epsilon,sensitivity", [(1.0, 1.0), (0.3, 2.0)])
def test_laplace_noise_distribution(epsilon, sensitivity):
    mech = LaplaceMechanism(epsilon, sensitivity)
    under = LaplaceMechanism(epsilon * 1.5, sensitivity)  # scale × 2/3
    assert mech.scale == pytest.approx(sensitivity / epsilon)
    assert under.scale == pytest.approx(mech.scale * 2 / 3)

    def check(noise):
        return stats.kstest(noise, stats.laplace(scale=mech.scale).cdf).pvalue

    _assert_power(check, mech.release(np.zeros(N // 2), rng=1), under.release(np.zeros(N // 2), rng=1))


# ----------------------------------------------------------------------------------------------- Gaussian


def exact_delta(eps, sigma, sens):
    mu = sens / sigma
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("epsilon,delta,sens", [(1.0, 1e-5, 1.0), (0.1, 1e-6, 2.0), (8.0, 1e-5, 0.5)])
def test_analytic_gaussian_is_exact(epsilon, delta, sens):
    sigma = analytic_gaussian_sigma(epsilon, delta, sens)
    assert exact_delta(epsilon, sigma, sens) <= delta * (1 + 1e-9)
    assert exact_delta(epsilon, sigma * (1 - 1e-6), sens) > delta  # and not a hair more noise than needed


def test_gaussian_known_values_and_classic_is_looser():
    assert analytic_gaussian_sigma(1.0, 1e-5) == pytest.approx(3.7306, abs=1e-3)
    assert classic_gaussian_sigma(0.5, 1e-5, 2.0) == pytest.approx(2 * math.sqrt(2 * math.log(1.25e5)) / 0.5)
    for eps in (0.1, 0.5, 0.9):
        assert classic_gaussian_sigma(eps, 1e-5) > analytic_gaussian_sigma(eps, 1e-5)
        assert exact_delta(eps, classic_gaussian_sigma(eps, 1e-5), 1.0) <= 1e-5


def test_classic_gaussian_refuses_large_epsilon():
    with pytest.raises(ValueError, match="analytic"):
        GaussianMechanism(1.0, 1e-5, method="classic")
    with pytest.raises(ValueError, match="method"):
        GaussianMechanism(0.5, 1e-5, method="magic")


@pytest.mark.statistical
@pytest.mark.parametrize("method,epsilon", [("analytic", 2.0), ("analytic", 0.5), ("classic", 0.5)])
def test_gaussian_noise_distribution(method, epsilon):
    mech = GaussianMechanism(epsilon, 1e-5, 1.0, method=method)
    under = GaussianMechanism(epsilon, 1e-5, 2 / 3, method=method)  # sensitivity under-estimated: σ × 2/3
    assert under.sigma == pytest.approx(mech.sigma * 2 / 3, rel=1e-2)  # the grid's ⌈Δ/Λ⌉: within 1 %

    def check(noise):  # N coordinates of one release: σ for N (the zCDP bound, above the scalar σ)
        return stats.kstest(noise, stats.norm(scale=mech.sigma_for(N // 4)).cdf).pvalue

    # N/4: the exact sampler is Python integer arithmetic; a 2/3 scale is still rejected at p < 1e-6
    _assert_power(check, mech.release(np.zeros(N // 4), rng=2), under.release(np.zeros(N // 4), rng=2))


# ----------------------------------------------------------------------------------------------- vector mechanism


@pytest.mark.statistical
@pytest.mark.parametrize("dim", [1, 5, 50])
def test_vector_mechanism_norm_and_direction(dim):
    mech = VectorMechanism(epsilon=2.0, sensitivity=0.5)
    under = VectorMechanism(epsilon=3.0, sensitivity=0.5)  # β × 3/2: noise × 2/3
    b = mech.noise(dim, size=N, rng=3)
    bu = under.noise(dim, size=N, rng=3)

    def check_norm(x):
        return stats.kstest(np.linalg.norm(x, axis=1), stats.gamma(a=dim, scale=1 / mech.beta).cdf).pvalue

    _assert_power(check_norm, b, bu)
    if dim > 1:
        # a uniform direction: (u₁ + 1)/2 ~ Beta((d−1)/2, (d−1)/2); and no preferred direction on average
        u1 = b[:, 0] / np.linalg.norm(b, axis=1)
        a = (dim - 1) / 2
        assert stats.kstest((u1 + 1) / 2, stats.beta(a, a).cdf).pvalue > ACCEPT
        mean_dir = (b / np.linalg.norm(b, axis=1, keepdims=True)).mean(axis=0)
        assert np.all(np.abs(mean_dir) < 5 / math.sqrt(N * dim))  # each coordinate has sd 1/sqrt(N·d)


def test_vector_release_shape_and_validation():
    mech = VectorMechanism(1.0)
    out = mech.release(np.ones(4), rng=0)
    assert out.shape == (4,)
    with pytest.raises(ValueError, match="1-d"):
        mech.release(np.ones((2, 2)), rng=0)
    with pytest.raises(ValueError, match="1-d"):
        mech.release(np.ones(0), rng=0)
    with pytest.raises(ValueError, match="dim"):
        mech.noise(0)


# ----------------------------------------------------------------------------------------------- randomized response


@pytest.mark.statistical
def test_coin_flip_survey_distribution_and_estimate():
    survey = CoinFlipSurvey()
    assert survey.epsilon == pytest.approx(math.log(3))
    # 2/3 of the noise: the random-answer probability 1/2 becomes 1/3 (truth_prob 2/3)
    under = CoinFlipSurvey(truth_prob=2 / 3)

    def check(responses):  # P(yes | yes) must be 3/4
        return stats.binomtest(int(responses.sum()), responses.size, 0.75).pvalue

    yes = np.ones(N, dtype=bool)
    _assert_power(check, survey.randomize(yes, rng=4), under.randomize(yes, rng=4))
    # P(yes | no) = 1/4
    assert stats.binomtest(int(survey.randomize(~yes, rng=5).sum()), N, 0.25).pvalue > ACCEPT
    # unbiased estimate p_true = 2·p_obs − 1/2, within 4 standard errors
    truth = np.random.default_rng(6).random(50_000) < 0.3
    est = survey.estimate(survey.randomize(truth, rng=7))
    se = 2 * math.sqrt(0.4 * 0.6 / truth.size)
    assert abs(est - truth.mean()) < 4 * se
    r = np.array([True, False, True, True])
    assert survey.estimate(r) == pytest.approx(2 * 0.75 - 0.5)


def test_coin_flip_from_epsilon():
    assert CoinFlipSurvey.from_epsilon(math.log(3)).truth_prob == pytest.approx(0.5)
    s = CoinFlipSurvey.from_epsilon(1.0)
    assert s.epsilon == pytest.approx(1.0)
    with pytest.raises(ValueError, match="truth_prob"):
        CoinFlipSurvey(truth_prob=1.0)


@pytest.mark.statistical
@pytest.mark.parametrize("epsilon,k", [(1.0, 4), (2.0, 10)])
def test_kary_randomized_response_distribution(epsilon, k):
    rr = RandomizedResponse(epsilon, k)
    p = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    assert rr.keep_prob == pytest.approx(p)
    # 2/3 of the noise: change probability (1 − p) × 2/3
    p_under = 1 - (1 - p) * 2 / 3
    under = RandomizedResponse(math.log(p_under * (k - 1) / (1 - p_under)), k)
    assert under.keep_prob == pytest.approx(p_under)
    expected = np.array([p] + [(1 - p) / (k - 1)] * (k - 1))

    def check(reports):
        counts = np.bincount(reports, minlength=k)
        return stats.chisquare(counts, expected * reports.size).pvalue

    zeros = np.zeros(N, dtype=np.int64)
    _assert_power(check, rr.randomize(zeros, rng=8), under.randomize(zeros, rng=8))


@pytest.mark.statistical
def test_kary_frequency_estimate_is_unbiased():
    rr = RandomizedResponse(1.0, 3)
    truth = np.random.default_rng(9).choice(3, size=60_000, p=[0.5, 0.3, 0.2])
    est = rr.estimate_frequencies(rr.randomize(truth, rng=10))
    true_freq = np.bincount(truth, minlength=3) / truth.size
    assert np.allclose(est, true_freq, atol=0.02)
    assert est.sum() == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------- validation, rng


@pytest.mark.parametrize(
    "build,name",
    [
        (lambda: LaplaceMechanism(0.0), "epsilon"),
        (lambda: LaplaceMechanism(1.0, -1.0), "sensitivity"),
        (lambda: LaplaceMechanism(1.0, 1.0, delta=1.0), "delta"),
        (lambda: GaussianMechanism(1.0, 0.0), "delta"),
        (lambda: GaussianMechanism(-1.0, 1e-5), "epsilon"),
        (lambda: GaussianMechanism(1.0, 1e-5, sensitivity=0.0), "sensitivity"),
        (lambda: VectorMechanism(float("nan")), "epsilon"),
        (lambda: RandomizedResponse(1.0, 1), "k"),
        (lambda: RandomizedResponse(0.0, 3), "epsilon"),
    ],
)
def test_bad_parameters_are_named(build, name):
    with pytest.raises(ValueError, match=name):
        build()


def test_rng_handling():
    mech = LaplaceMechanism(1.0)
    assert mech.release(0.0, rng=123) == mech.release(0.0, rng=123)
    g = np.random.default_rng(5)
    a, b = mech.release(np.zeros(3), rng=g), mech.release(np.zeros(3), rng=g)
    assert not np.array_equal(a, b)
    assert isinstance(mech.release(1.0), float)
    with pytest.raises(TypeError, match="rng"):
        mech.release(0.0, rng="seed")
    with pytest.raises(ValueError, match="value"):
        mech.release([np.nan], rng=0)
    with pytest.raises(ValueError, match="values"):
        RandomizedResponse(1.0, 3).randomize(np.array([0, 3]), rng=0)


# ------------------------------------------------------------------------ floating-point safety (issue 35, item 2)


def _porous_laplace(value: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """The old release: fl(value + numpy's Laplace(1)), ε = 1."""
    return value + rng.laplace(0.0, 1.0, size=n)


def _low_bits_fire(x: np.ndarray) -> np.ndarray:
    """Mironov's distinguisher: |x| < 1/2 with a bit below 2^−53. For value 1, fl(1 + noise) there is a multiple of
    2^−53 (1 and noise of |noise| >= 1/2 both are); for value 0 the output is the noise, whose low bits are random."""
    return (np.abs(x) < 0.5) & (np.mod(x * 2.0**53, 1.0) != 0)


def _rates_equal(a: np.ndarray, b: np.ndarray, sds: float = 4.0) -> bool:
    p = (a.sum() + b.sum()) / (a.size + b.size)
    se = math.sqrt(max(p * (1 - p), 1e-12) * (1 / a.size + 1 / b.size))
    return abs(a.mean() - b.mean()) <= sds * se


def test_the_low_bit_attack_separates_the_old_laplace_release():
    rng = np.random.default_rng(35)
    zero, one = _low_bits_fire(_porous_laplace(0.0, 20_000, rng)), _low_bits_fire(_porous_laplace(1.0, 20_000, rng))
    assert zero.mean() > 0.2 and one.mean() == 0.0  # fires a quarter of the time for 0, never for 1
    assert not _rates_equal(zero, one)


@pytest.mark.parametrize("mech", [LaplaceMechanism(1.0), GaussianMechanism(1.0, 1e-5)], ids=["laplace", "gaussian"])
def test_the_grid_mechanisms_do_not_separate_zero_and_one_by_their_low_bits(mech):
    n = 4000
    outs = {v: np.array([mech.release(v, rng=np.random.default_rng(1000 * v + i)) for i in range(n)]) for v in (0, 1)}
    for out in outs.values():
        units = out / mech.grid
        assert np.array_equal(units, np.round(units))  # every output a multiple of Λ
        assert mech.grid == 2.0 ** round(math.log2(mech.grid)) and 1 / mech.grid == int(1 / mech.grid)
    assert _rates_equal(_low_bits_fire(outs[0]), _low_bits_fire(outs[1]))
    # the low mantissa bits in general: the last 8 bits of the float64 pattern, rate of "all zero"
    low = {v: (outs[v].view(np.uint64) & np.uint64(0xFF)) == 0 for v in (0, 1)}
    assert _rates_equal(low[0], low[1])
    # and the values modulo 16 grid steps (1 = 2^10 steps: a shift by the value leaves them alike)
    mods = {v: np.mod(np.round(outs[v] / mech.grid), 16).astype(int) for v in (0, 1)}
    table = np.array([np.bincount(mods[v], minlength=16) for v in (0, 1)])
    assert stats.chi2_contingency(table).pvalue > 1e-4


@pytest.mark.parametrize(("kind", "epsilon"), [("laplace", 1.0), ("laplace", 0.1), ("gaussian", 1.0)])
def test_the_discrete_noise_has_the_continuous_scale_and_a_two_thirds_scale_fails(kind, epsilon):
    n = 4000

    def spread(mech) -> float:
        rng = np.random.default_rng(7)
        return float(np.std([mech.release(0.0, rng=rng) for _ in range(n)]))

    if kind == "laplace":
        mech, under, target = LaplaceMechanism(epsilon), LaplaceMechanism(epsilon * 1.5), math.sqrt(2) / epsilon
        tol = 0.06  # the sd of a Laplace sample's sd: about 1.1/√n relative (heavy tails)
    else:
        mech, under, target = GaussianMechanism(epsilon, 1e-5), GaussianMechanism(epsilon, 1e-5, 2 / 3), None
        target = analytic_gaussian_sigma(epsilon, 1e-5)
        tol = 0.04
    assert abs(spread(mech) / target - 1) < tol
    assert abs(spread(under) / target - 1) > 0.25  # the power: 2/3 of the scale is far outside


def test_the_discrete_gaussian_delta_is_exact_and_the_calibration_tight():
    from featuredp.mechanisms._discrete import discrete_gaussian_delta

    mech = GaussianMechanism(1.0, 1e-5)
    sens, sigma_z = math.ceil(1.0 / mech.grid), mech.sigma / mech.grid
    assert discrete_gaussian_delta(1.0, sigma_z, sens) <= 1e-5
    assert discrete_gaussian_delta(1.0, sigma_z * (1 - 1e-4), sens) > 1e-5
    # at these scales the discrete Gaussian's δ is the continuous one's
    assert discrete_gaussian_delta(1.0, sigma_z, sens) == pytest.approx(exact_delta(1.0, sigma_z, sens), rel=1e-3)


def test_release_draws_from_os_entropy_by_default(monkeypatch):
    import secrets

    calls = []
    real = secrets.randbelow
    monkeypatch.setattr(secrets, "randbelow", lambda n: calls.append(n) or real(n))
    LaplaceMechanism(1.0).release(0.5)
    GaussianMechanism(1.0, 1e-5).release([0.5, 1.0])
    VectorMechanism(1.0).release([0.5, 1.0])
    assert len(calls) > 4


# ------------------------------------------------------------------ the vector mechanism's release (issue 42, item 1)


def _porous_vector(value: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """The old release: fl(value + CMS11 noise), the float64 exp(−‖b‖₂) noise of ``VectorMechanism.noise`` (ε = 1)."""
    return value + VectorMechanism(1.0).noise(value.size, size=n, rng=rng)


def _vector_releases(mech: VectorMechanism, value: np.ndarray, n: int, seed: int) -> np.ndarray:
    return np.array([mech.release(value, rng=np.random.default_rng([seed, i])) for i in range(n)])


def test_the_low_bit_attack_separates_the_old_vector_release():
    rng = np.random.default_rng(42)
    zero, e1 = np.zeros(3), np.array([1.0, 0.0, 0.0])  # neighbours: L2 distance 1 = Δ₂
    fire0 = _low_bits_fire(_porous_vector(zero, 4000, rng)[:, 0])
    fire1 = _low_bits_fire(_porous_vector(e1, 4000, rng)[:, 0])
    assert fire0.mean() > 0.1 and fire1.mean() == 0.0  # "pure" ε = 1, yet one output rules e1 out for good
    assert not _rates_equal(fire0, fire1)


def test_the_vector_release_does_not_separate_neighbours_by_their_low_bits():
    mech, n = VectorMechanism(1.0), 4000
    zero, e1 = np.zeros(3), np.array([1.0, 0.0, 0.0])
    outs = {0: _vector_releases(mech, zero, n, 0), 1: _vector_releases(mech, e1, n, 1)}
    # the attack first: on the old release it fires for 16 % of the releases of 0 and never for e1
    assert _rates_equal(_low_bits_fire(outs[0][:, 0]), _low_bits_fire(outs[1][:, 0]))
    low = {v: (outs[v][:, 0].view(np.uint64) & np.uint64(0xFF)) == 0 for v in (0, 1)}
    assert _rates_equal(low[0], low[1])
    grid = mech.grid_for(3)
    assert grid == 2.0 ** round(math.log2(grid)) and 1 / grid == int(1 / grid)
    for out in outs.values():
        assert np.array_equal(out / grid, np.round(out / grid))  # every output on the grid: no other support
    mods = {v: np.mod(np.round(outs[v][:, 0] / grid), 16).astype(int) for v in (0, 1)}
    assert stats.chi2_contingency(np.array([np.bincount(mods[v], minlength=16) for v in (0, 1)])).pvalue > 1e-4


@pytest.mark.parametrize(
    ("epsilon", "sensitivity", "dim"), [(1.0, 1.0, 1), (1.0, 1.0, 3), (0.3, 2.5, 7), (4.0, 0.1, 64)]
)
def test_the_vector_release_is_pure_epsilon_exactly_on_the_grid(epsilon, sensitivity, dim):
    """The accounting, exactly: for neighbours at L2 distance Δ₂ (worst directions, worst grid offsets), the grid
    L1 distance is at most K and K/t <= ε, so P(y | a)/P(y | b) = exp((|y − r(b)|₁ − |y − r(a)|₁)/t) <= e^ε."""
    mech = VectorMechanism(epsilon, sensitivity)
    grid, t = mech.grid_for(dim), mech.grid_scale(dim)
    k = math.ceil(math.sqrt(dim) * sensitivity / grid - 1e-9) + dim - 1
    assert t.denominator == 1 and Fraction(k) / t <= Fraction(epsilon)  # ε exactly, never more
    assert Fraction(k) / (t - 1) > Fraction(epsilon)  # and t the smallest such
    rng = np.random.default_rng(dim)
    worst = 0
    for _ in range(300):
        direction = rng.choice([-1.0, 1.0], size=dim) if rng.random() < 0.5 else rng.standard_normal(dim)
        delta = direction * (sensitivity / np.linalg.norm(direction))
        # start just below a rounding boundary where the step goes up (and above it where it goes down)
        a = (rng.integers(-50, 50, size=dim) + 0.5 - np.sign(delta) * 1e-7) * grid
        b = a + delta
        assert np.linalg.norm(b - a) <= sensitivity * (1 + 1e-12)
        worst = max(worst, int(np.abs(np.subtract(_on_grid(a, grid), _on_grid(b, grid))).sum()))
    assert worst <= k
    assert worst >= k - dim  # the construction is near the worst case: the bound is not vacuous


@pytest.mark.statistical
def test_the_vector_release_noise_has_its_stated_scale_and_a_two_thirds_scale_fails():
    dim, n = 5, 1000
    mech, under = VectorMechanism(2.0, 0.5), VectorMechanism(3.0, 0.5)  # β × 3/2: scale × 2/3
    scale = float(mech.grid_scale(dim)) * mech.grid_for(dim)  # t·Λ_d, the discrete Laplace's scale in value units
    assert 1 <= scale / (math.sqrt(dim) * 0.5 / 2.0) <= 1 + (1 + 1 / 2.0) / 1024

    def check(out):
        return stats.kstest(out.ravel(), stats.laplace(scale=scale).cdf).pvalue

    _assert_power(check, _vector_releases(mech, np.zeros(dim), n, 2), _vector_releases(under, np.zeros(dim), n, 3))
    # against the continuous CMS11 noise the RMS norm is √(2d/(d + 1)) larger (the price of exactness)
    rms = math.sqrt(float((_vector_releases(mech, np.zeros(dim), n, 4) ** 2).sum(axis=1).mean()))
    continuous = math.sqrt(dim * (dim + 1)) / mech.beta
    assert rms / continuous == pytest.approx(math.sqrt(2 * dim / (dim + 1)), rel=0.05)

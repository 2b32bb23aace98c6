import numpy as np
import pytest
from scipy import stats

from featuredp.sampling import EpochShuffler, PoissonSampler, UniformSampler, make_streams


@pytest.mark.statistical
def test_poisson_batch_sizes_fit_binomial():
    n, p, trials = 2_000, 0.05, 4_000
    s = PoissonSampler(n, p, make_streams(0).private_sampling)
    sizes = np.array([len(s.sample()) for _ in range(trials)])
    # Mean within 4 standard errors, and the law passes a chi-square test against Binomial(n, p).
    se = np.sqrt(n * p * (1 - p) / trials)
    assert abs(sizes.mean() - n * p) < 4 * se
    lo, hi = stats.binom.ppf([0.005, 0.995], n, p).astype(int)
    edges = np.arange(lo, hi + 2)
    observed = np.histogram(np.clip(sizes, lo, hi), bins=edges)[0]
    probs = np.diff(stats.binom.cdf(edges - 1, n, p))
    probs[0] += stats.binom.cdf(lo - 1, n, p)
    probs[-1] += stats.binom.sf(hi, n, p)
    chi = stats.chisquare(observed, probs * trials)
    assert chi.pvalue > 1e-3


@pytest.mark.statistical
def test_poisson_sampler_has_power_against_wrong_rate():
    # The same test statistic rejects a sampler running at 0.9·p: the test has power.
    n, p, trials = 2_000, 0.05, 4_000
    s = PoissonSampler(n, 0.9 * p, make_streams(1).private_sampling)
    sizes = np.array([len(s.sample()) for _ in range(trials)])
    se = np.sqrt(n * p * (1 - p) / trials)
    assert abs(sizes.mean() - n * p) > 4 * se


@pytest.mark.statistical
def test_each_record_included_with_probability_p():
    n, p, trials = 200, 0.1, 5_000
    s = PoissonSampler(n, p, make_streams(2).private_sampling)
    counts = np.zeros(n)
    for _ in range(trials):
        counts[s.sample()] += 1
    # Per-record counts are Binomial(trials, p); the whole vector passes a chi-square test.
    chi = ((counts - trials * p) ** 2 / (trials * p * (1 - p))).sum()
    assert stats.chi2.sf(chi, df=n) > 1e-3
    # Inclusions of two records are independent (no fixed batch size): correlation ~ 0.
    s2 = PoissonSampler(n, p, make_streams(3).private_sampling)
    m = np.zeros((trials, n), dtype=bool)
    for t in range(trials):
        m[t, s2.sample()] = True
    corr = np.corrcoef(m[:, 0], m[:, 1])[0, 1]
    assert abs(corr) < 4 / np.sqrt(trials)


def test_poisson_indices_valid_and_sorted():
    s = PoissonSampler(1000, 0.3, make_streams(4).private_sampling)
    for _ in range(20):
        idx = s.sample()
        assert idx.dtype == np.int64
        assert np.all(np.diff(idx) > 0)
        assert idx.min(initial=0) >= 0 and idx.max(initial=0) < 1000
    assert len(PoissonSampler(10, 1.0, make_streams(0).private_sampling).sample()) == 10


def test_streams_are_independent_and_reproducible():
    a, b = make_streams(7), make_streams(7)
    assert np.array_equal(a.private_sampling.integers(0, 1 << 30, 50), b.private_sampling.integers(0, 1 << 30, 50))
    c = make_streams(7)
    priv = c.private_sampling.integers(0, 1 << 30, 1000)
    pub = c.public_sampling.integers(0, 1 << 30, 1000)
    assert not np.array_equal(priv, pub)
    # Drawing from the private stream must not move the public stream.
    d, e = make_streams(9), make_streams(9)
    d.private_sampling.random(12345)
    assert np.array_equal(d.public_sampling.random(10), e.public_sampling.random(10))


def test_uniform_sampler():
    s = UniformSampler(100, 30, make_streams(5).public_sampling)
    idx = s.sample()
    assert len(idx) == 30 and len(set(idx.tolist())) == 30
    with pytest.raises(ValueError, match="batch_size"):
        UniformSampler(10, 11, make_streams(5).public_sampling)


def test_epoch_shuffler_covers_each_record_once_per_epoch():
    s = EpochShuffler(10, 5, make_streams(6).init)
    seen = np.concatenate([s.sample(), s.sample()])
    assert sorted(seen.tolist()) == list(range(10))


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, float("nan")])
def test_bad_rate_is_named(rate):
    with pytest.raises(ValueError, match="sampling_rate"):
        PoissonSampler(10, rate, make_streams(0).private_sampling)

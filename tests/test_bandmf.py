"""BandMF building block: strategy, correlated noise, cyclic Poisson sampler, amplified accounting, RMSE figure."""

from __future__ import annotations

import copy
import io
import itertools
import math
import pickle

import numpy as np
import pytest
import torch

from _fdp_synth import secure_source, torch_source
from featuredp.accounting import calibrate_noise_multiplier, compute_epsilon, dpsgd_event
from featuredp.noise import bandmf as bm

# ----------------------------------------------------------------------------- strategy


def _dense_workload(n: int, beta: float) -> np.ndarray:
    # Built from the SGD-momentum recursion itself, not from the closed form the module uses.
    A = np.zeros((n, n))
    for r in range(n):  # a unit gradient at step r through torch's SGD momentum: v_t = β·v_{t−1} + g_t, θ += v_t
        velocity = theta = 0.0
        for t in range(n):
            velocity = beta * velocity + float(t == r)
            theta += velocity
            A[t, r] = theta
    return A


@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_loss_and_rmse_match_dense_matrices(beta):
    n, rng = 20, np.random.default_rng(0)
    c = np.r_[1.0, 0.3 * rng.normal(size=3)]
    A, C = _dense_workload(n, beta), bm.strategy_matrix(c, n)
    assert np.allclose(np.tril(C), C) and np.allclose(np.diag(C), 1.0) and np.count_nonzero(C[:, 0]) == 4
    frob = np.linalg.norm(A @ np.linalg.inv(C)) ** 2
    sens = np.linalg.norm(C, axis=0).max()
    assert bm.sensitivity(c, n) == pytest.approx(sens, rel=1e-14)
    assert bm.strategy_loss(c, n, momentum=beta) == pytest.approx(frob * sens**2, rel=1e-10)
    assert bm.noise_rmse(c, n, 1.7, momentum=beta) == pytest.approx(1.7 * math.sqrt(frob / n), rel=1e-10)


def test_optimised_strategy_is_a_deterministic_local_minimum_better_than_dpsgd():
    n = 64
    c = bm.banded_toeplitz_strategy(n, 4)
    assert c.shape == (4,) and c[0] == 1.0
    assert np.array_equal(c, bm.banded_toeplitz_strategy(n, 4))  # deterministic, bit for bit
    best = bm.strategy_loss(c, n)
    assert best < 0.5 * bm.strategy_loss([1.0], n)
    rng = np.random.default_rng(1)
    for _ in range(30):  # no nearby strategy is better
        d = np.r_[0.0, 1e-3 * rng.normal(size=3)]
        assert bm.strategy_loss(c + d, n) >= best * (1 - 1e-9)
    assert bm.banded_toeplitz_strategy(n, 1).tolist() == [1.0]
    tail = bm.banded_toeplitz_strategy(3, 6)
    assert tail[3:].tolist() == [0.0, 0.0, 0.0] and bm.strategy_loss(tail, 3) <= bm.strategy_loss([1.0], 3)


def test_momentum_strategy_is_optimised_for_its_own_workload():
    n = 48
    plain, mom = bm.banded_toeplitz_strategy(n, 8), bm.banded_toeplitz_strategy(n, 8, momentum=0.9)
    assert not np.allclose(plain, mom)
    assert bm.strategy_loss(mom, n, momentum=0.9) < bm.strategy_loss(plain, n, momentum=0.9)
    assert bm.strategy_loss(plain, n) < bm.strategy_loss(mom, n)


def _separated(n: int, gap: int, k: int):
    for pattern in itertools.combinations(range(n), k):
        if all(b - a >= gap for a, b in itertools.pairwise(pattern)):
            yield pattern


def test_sensitivity_lemma_holds_at_separation_b_and_fails_below():
    # The lemma: participations >= b apart touch disjoint rows of a b-banded C, so k of them cost sqrt(k)·max col.
    n, b, k = 10, 3, 3
    c = np.array([1.0, 0.6, 0.4])
    C = bm.strategy_matrix(c, n)
    max_col = bm.sensitivity(c, n)
    for pattern in _separated(n, b, k):
        G = C[:, pattern].T @ C[:, pattern]
        assert np.count_nonzero(G - np.diag(np.diag(G))) == 0  # disjoint supports: no cross terms
        assert np.trace(G) <= k * max_col**2 + 1e-12
    # Attack: one step closer than b, the same gradient twice adds coherently past sqrt(k)·max col.
    worst = max(np.ones(k) @ C[:, p].T @ C[:, p] @ np.ones(k) for p in _separated(n, b - 1, k))
    assert worst > k * max_col**2 * 1.1


# ----------------------------------------------------------------------------- noise




@pytest.mark.parametrize("make", [torch_source, secure_source])
def test_banded_noise_is_C_inverse_of_the_source_stream(make):
    T, dim = 12, 7
    c = bm.banded_toeplitz_strategy(T, 4)
    noise, twin = bm.BandedNoise(c, dim, make(3)), make(3)
    W = torch.stack([noise.sample() for _ in range(T)])
    Z = torch.stack([twin.add({"z": torch.zeros(dim, dtype=torch.float64)}, 1.0)["z"] for _ in range(T)])
    C = torch.from_numpy(bm.strategy_matrix(c, T))
    expected = torch.linalg.solve_triangular(C, Z, upper=False)
    assert W.dtype == torch.float64 and torch.allclose(W, expected, rtol=0, atol=1e-12)


@pytest.mark.statistical
def test_covariance_is_C_inverse_C_inverse_transpose_with_power():
    # Each of the dim coordinates is one realisation of the T-step process: the empirical T×T covariance over
    # 40,000 coordinates must match C⁻¹C⁻ᵀ entry by entry (5 standard errors).
    T, dim = 6, 40_000
    c = np.array([1.0, 0.7, 0.45])
    noise = bm.BandedNoise(c, dim, torch_source(11))
    W = torch.stack([noise.sample() for _ in range(T)]).numpy()
    Cinv = np.linalg.inv(bm.strategy_matrix(c, T))
    sigma = Cinv @ Cinv.T
    se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / dim)

    def fits(samples: np.ndarray) -> bool:
        return bool(np.all(np.abs(samples @ samples.T / dim - sigma) < 5 * se))

    assert fits(W)
    # Power: independent noise with the same per-step std is rejected (C⁻¹C⁻ᵀ has large off-diagonals).
    z = np.random.default_rng(12).standard_normal((T, dim))
    assert not fits(np.sqrt(np.diag(sigma))[:, None] * z)
    assert np.abs(sigma - np.diag(np.diag(sigma))).max() > 50 * se.max()


def test_zero_std_adds_nothing_and_the_std_cannot_change():
    sums = {"w": torch.randn(3, 4), "b": torch.randn(5)}
    noise = bm.BandedNoise([1.0, 0.5], 17, torch_source(0))
    out = noise.add(sums, 0.0)
    assert all(torch.equal(out[k], sums[k]) and out[k] is not sums[k] for k in sums)
    assert noise.step == 0  # nothing drawn
    with pytest.raises(ValueError, match=r"std must stay 0\.0"):
        noise.add(sums, 1.0)
    noisy = bm.BandedNoise([1.0, 0.5], 17, torch_source(0))
    noisy.add(sums, 1.0)
    with pytest.raises(ValueError, match=r"std must stay 1\.0"):  # a smaller σ later would break the analysis
        noisy.add(sums, 0.5)
    with pytest.raises(ValueError, match="dim=17"):
        noisy.add({"w": torch.zeros(3)}, 1.0)


@pytest.mark.parametrize("make", [torch_source, secure_source])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_band_is_independent_noise_bit_for_bit(make, dtype):
    g = torch.Generator().manual_seed(5)
    sums = {"w": torch.randn(4, 3, generator=g, dtype=dtype), "b": torch.randn(7, generator=g, dtype=dtype)}
    banded, plain = bm.BandedNoise([1.0], 19, make(9)), make(9)
    for _ in range(4):
        a, b = banded.add(sums, 0.83), plain.add(sums, 0.83)
        assert all(a[k].dtype == dtype and torch.equal(a[k], b[k]) for k in sums)
    # and more bands really change the noise
    two = bm.BandedNoise([1.0, 0.5], 19, make(9))
    outs = [two.add(sums, 0.83) for _ in range(2)]
    fresh = make(9)
    ref = [fresh.add(sums, 0.83) for _ in range(2)]
    assert torch.equal(outs[0]["w"], ref[0]["w"]) and not torch.equal(outs[1]["w"], ref[1]["w"])


def test_state_round_trip_resumes_the_correlated_stream():
    c = [1.0, 0.6, 0.3, 0.1]
    sums = {"w": torch.zeros(6, dtype=torch.float64)}
    a = bm.BandedNoise(c, 6, torch_source(21))
    for _ in range(3):
        a.add(sums, 1.0)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    expected = [a.add(sums, 1.0)["w"] for _ in range(4)]
    b = bm.BandedNoise(c, 6, torch_source(99))
    b.load_state_dict(state)
    assert all(torch.equal(b.add(sums, 1.0)["w"], e) for e in expected)
    with pytest.raises(ValueError, match="coefficients differ"):
        bm.BandedNoise([1.0, 0.6], 6, torch_source(0)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"std must stay 1\.0"):
        b.add(sums, 2.0)  # the restored std still binds


def test_history_is_never_shown_or_copied():
    noise = bm.BandedNoise([1.0, 0.5, 0.25], 4, torch_source(0))
    w = noise.sample()
    assert repr(noise) == "BandedNoise(bands=3, dim=4, step=1)" and f"{float(w[0]):.4f}" not in repr(noise)
    for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="must not be copied"):
            attempt(noise)
    with pytest.raises(TypeError, match="source must be"):
        bm.BandedNoise([1.0], 4, noise)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"coeffs\[0\] must be > 0"):
        bm.BandedNoise([0.0, 1.0], 4, torch_source(0))


# ----------------------------------------------------------------------------- accounting


@pytest.mark.parametrize(("sigma", "m", "n", "T"), [(1.0, 512, 60000, 117), (0.8, 1024, 32561, 159)])
def test_one_band_is_dpsgd_exactly(sigma, m, n, T):
    event = bm.bandmf_event(sigma, m, n, T, 1, [1.0])
    assert event == dpsgd_event(sigma, m / n, T)
    assert bm.bandmf_epsilon(sigma, m, n, T, 1, [1.0], 1e-5) == compute_epsilon(dpsgd_event(sigma, m / n, T), 1e-5)


def test_event_is_dpsgd_on_the_rounds_with_the_column_norm():
    c = np.array([1.0, 0.6, 0.3])
    sens = float(np.linalg.norm(c))
    assert bm.bandmf_event(2.0, 512, 60000, 117, 4, c) == dpsgd_event(2.0 / sens, 512 * 4 / 60000, 30)
    assert bm.bandmf_event(2.0, 512, 60000, 117, 3, c) == dpsgd_event(2.0 / sens, 512 * 3 / 60000, 39)
    # a partition smaller than the batch: every record of it every round (q = 1), the plain Gaussian
    assert bm.bandmf_event(2.0, 600, 1000, 10, 3, c) == dpsgd_event(2.0 / sens, 1.0, 4)
    with pytest.raises(ValueError, match="more than bands=2"):  # separation below the bandwidth: lemma fails
        bm.bandmf_event(2.0, 512, 60000, 117, 2, c)


def test_epsilon_decreases_in_sigma_and_amplification_is_accounted():
    c = bm.banded_toeplitz_strategy(117, 4)
    eps = [bm.bandmf_epsilon(s, 512, 60000, 117, 4, c, 1e-5) for s in (0.6, 0.8, 1.0, 1.5, 2.5)]
    assert all(a > b for a, b in itertools.pairwise(eps))
    # fewer, denser rounds cost more than DP-SGD at the same multiplier on z / sens
    sens = bm.sensitivity(c, 117)
    dpsgd = bm.bandmf_epsilon(1.0, 512, 60000, 117, 1, [1.0], 1e-5)
    assert bm.bandmf_epsilon(sens, 512, 60000, 117, 4, c, 1e-5) > dpsgd


@pytest.mark.parametrize(("target", "bands"), [(1.0, 1), (1.0, 8), (8.0, 4), (0.5, 2)])
def test_calibration_never_overshoots(target, bands):
    c = bm.banded_toeplitz_strategy(117, bands)
    sigma = bm.calibrate_bandmf_noise(target, 1e-5, 512, 60000, 117, bands, c)
    eps = bm.bandmf_epsilon(sigma, 512, 60000, 117, bands, c, 1e-5)
    assert 0.99 * target <= eps <= target
    # the multiplier the event sees is never below the one DP-SGD's calibration found for the rounds
    nm = calibrate_noise_multiplier(target, 1e-5, bm.bandmf_sampling_rate(512, 60000, bands), -(-117 // bands))
    assert sigma / bm.sensitivity(c, 117) >= nm


# ----------------------------------------------------------------------------- RMSE figure


def test_relative_rmse_is_one_at_one_band_and_below_one_at_large_epsilon():
    assert bm.relative_rmse(1.0, 1e-5, 60000, 512, 117, 1) == 1.0
    ratio = bm.relative_rmse(8.0, 1e-5, 60000, 512, 117, 64)
    assert 0.45 < ratio < 0.53  # the report's table: 0.492 (PLD)
    b, best, ratios = bm.best_bands(8.0, 1e-5, 32561, 1024, 159, choices=(1, 16, 32))
    assert 32 not in ratios and b == 16 and best == ratios[16] < 1  # b = 32 > n/m is infeasible


def test_rmse_settings_are_the_presets():
    from featuredp.data import load_dataset
    from featuredp.experiments.presets import IMAGE_PRESETS, PRESETS

    def steps(epochs: float, n: int, m: int) -> int:  # the engine's rule (Trainer: epochs·n/m, rounded)
        return max(1, round(epochs * n / m))

    n_adult = len(load_dataset("adult")[0].y)
    image = IMAGE_PRESETS["fashion-mnist"]
    adult = PRESETS["adult"]["methods"]
    expected = {
        "fashion-mnist": (image["load"]["n_train"], image["methods"]["dpsgd"], image["delta"]),
        "adult (dpsgd)": (n_adult, adult["dpsgd"], PRESETS["adult"]["delta"]),
        "adult (fdp)": (n_adult, adult["fdp"], PRESETS["adult"]["delta"]),
    }
    for name, n, m, T, delta in bm.RMSE_SETTINGS:
        n_p, method, delta_p = expected[name]
        assert (n, m, T, delta) == (n_p, method["batch_size"], steps(method["epochs"], n_p, method["batch_size"]),
                                    delta_p)  # fmt: skip

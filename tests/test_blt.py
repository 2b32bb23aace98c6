"""BLT building block: the strategy's coefficients and inverse, the min-sep sensitivity, the correlated noise, the
single-Gaussian accounting and the RMSE trade against amplified DP-SGD (issue 27)."""

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
from featuredp.accounting import compute_epsilon
from featuredp.accounting.events import gaussian_event
from featuredp.errors import UnreachableTargetError
from featuredp.noise import blt

VALID = [([0.9], [0.5]), ([0.95, 0.4], [0.3, 0.25]), ([0.99, 0.8, 0.2], [0.1, 0.3, 0.4]), ([0.0], [1.0])]


def _dense(c: np.ndarray) -> np.ndarray:
    n = c.size
    return np.array([[c[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def _dense_workload(n: int, beta: float) -> np.ndarray:
    # From torch's SGD-momentum recursion itself, not from the closed form the module uses.
    A = np.zeros((n, n))
    for r in range(n):
        velocity = theta = 0.0
        for t in range(n):
            velocity = beta * velocity + float(t == r)
            theta += velocity
            A[t, r] = theta
    return A


def _brute_sensitivity(C: np.ndarray, b: int, k: int) -> float:
    """max over every participation pattern (gaps >= b, at most k) and every unit g_i of ‖Σ C[:, t_i] g_i‖; the
    g_i are searched over ±1 in one dimension, which is the worst case only if the argument holds: checked here
    by also trying random directions in 3 dimensions."""
    n = C.shape[0]
    best = 0.0
    rng = np.random.default_rng(0)
    for size in range(1, k + 1):
        for pat in itertools.combinations(range(n), size):
            if any(pat[i + 1] - pat[i] < b for i in range(size - 1)):
                continue
            cols = C[:, list(pat)]
            for signs in itertools.product((1.0, -1.0), repeat=min(size, 4)):
                s = np.ones(size)
                s[: len(signs)] = signs
                best = max(best, float(np.linalg.norm(cols @ s)))
            g = rng.standard_normal((size, 3))
            g /= np.linalg.norm(g, axis=1, keepdims=True)
            best = max(best, float(np.linalg.norm(cols @ g)))
    return best


# ----------------------------------------------------------------------------- the strategy


@pytest.mark.parametrize(("theta", "omega"), VALID)
def test_coefficients_and_inverse_match_the_dense_matrices(theta, omega):
    n = 40
    c = blt.blt_coefficients(theta, omega, n)
    C = _dense(c)
    for j in range(1, n):  # c_j = Σ ω_i θ_i^(j−1), computed here term by term
        assert c[j] == pytest.approx(sum(w * t ** (j - 1) for t, w in zip(theta, omega)), rel=1e-12, abs=1e-300)
    inv = blt.inverse_coefficients(theta, omega, n)
    np.testing.assert_allclose(inv, np.linalg.inv(C)[:, 0], rtol=1e-9, atol=1e-12)
    assert np.all(np.diff(c) <= 1e-15) and np.all(c >= 0)  # the valid region gives what the sensitivity needs


@pytest.mark.parametrize("beta", [0.0, 0.9])
@pytest.mark.parametrize(("theta", "omega"), VALID[:3])
def test_loss_matches_dense_workload_and_sensitivity(theta, omega, beta):
    n, b = 18, 5
    C = _dense(blt.blt_coefficients(theta, omega, n))
    frob = np.linalg.norm(_dense_workload(n, beta) @ np.linalg.inv(C)) ** 2
    sens = _brute_sensitivity(C, b, -(-n // b))
    assert blt.blt_loss(theta, omega, n, b, momentum=beta) == pytest.approx(frob * sens**2, rel=1e-9)


@pytest.mark.parametrize(("theta", "omega"), VALID)
@pytest.mark.parametrize(("n", "b", "k"), [(12, 1, 12), (12, 1, 3), (12, 4, 3), (12, 5, 2), (13, 13, 1), (10, 3, 1)])
def test_minsep_sensitivity_is_the_worst_pattern_found_by_enumeration(theta, omega, n, b, k):
    C = _dense(blt.blt_coefficients(theta, omega, n))
    got = blt.minsep_sensitivity(C[:, 0], n, b, k)
    assert got == pytest.approx(_brute_sensitivity(C, b, k), rel=1e-12)
    # Teeth: single participation understates it whenever k > 1 participations fit.
    if min(k, -(-n // b)) > 1:
        assert got > 1.2 * float(np.linalg.norm(C[:, 0]))


def test_minsep_sensitivity_refuses_coefficients_the_argument_does_not_cover():
    # Negative coefficients: opposite g_i make the columns add (the enumeration beats the formula's pattern).
    c = np.array([1.0, -0.6, 0.3])
    C = _dense(np.concatenate((c, np.zeros(5))))
    assert _brute_sensitivity(C, 1, 3) > np.linalg.norm(C[:, :3].sum(axis=1)) + 0.1
    with pytest.raises(ValueError, match="non-negative"):
        blt.minsep_sensitivity(c, 8, 1)
    with pytest.raises(ValueError, match="non-increasing"):
        blt.minsep_sensitivity([1.0, 0.5, 0.7], 8, 1)
    bad = [([1.0], [0.5], "buf_decay must be in"), ([0.5], [0.7, 0.1], "one length"),
           ([0.5, 0.2], [0.7, 0.4], "sum <= 1"), ([0.5], [-0.1], "output_scale must be")]  # fmt: skip
    for theta, omega, needle in bad:
        with pytest.raises(ValueError, match=needle):
            blt.check_blt_params(theta, omega)


def test_every_step_participation_keeps_independent_noise():
    # With a record in every step (b = 1) the column sums of any valid C outgrow its error gain: C = I is returned.
    theta, omega = blt.optimize_blt(30, 1)
    assert theta.size == 0 and omega.size == 0
    assert blt.blt_loss([0.9], [0.5], 30, 1) > blt.blt_loss([], [], 30, 1)


@pytest.mark.parametrize(("n", "b", "beta"), [(64, 64, 0.0), (60, 12, 0.0), (48, 8, 0.9), (40, 2, 0.0)])
def test_optimised_strategy_is_valid_deterministic_and_beats_dpsgds(n, b, beta):
    theta, omega = blt.optimize_blt(n, b, momentum=beta)
    again = blt.optimize_blt(n, b, momentum=beta)
    assert np.array_equal(theta, again[0]) and np.array_equal(omega, again[1])
    assert 1 <= theta.size <= blt.MAX_BUFFERS
    blt.check_blt_params(theta, omega)
    assert np.all(np.diff(theta) <= 0)  # decays in decreasing order, as jax_privacy canonicalises
    ratio = blt.blt_loss(theta, omega, n, b, momentum=beta) / blt.blt_loss([], [], n, b, momentum=beta)
    assert ratio < 0.6


def test_the_optimisers_parameters_stay_in_the_valid_region_at_its_edge():
    # Σω → 1 (c_1 → c_0) is where the optimum often lies; softmax rounding once put Σω an ulp above 1, which the
    # plan then refused when a tuning trial loaded it.
    v = [-3.518676179034963, -6.327107355230263, -3.116372312686761, 0.206629896736218]
    theta, omega = blt._unpack(np.array([0.0, 0.0, 0.0, 0.0, *v, 40.0]), 4)
    assert omega.sum() <= 1.0
    blt.check_blt_params(theta, omega)
    # and far out (a line search can wander there) the map neither overflows nor leaves the region
    theta, omega = blt._unpack(np.array([-1000.0, 1000.0, 0.0, 0.0, -1000.0]), 2)
    assert omega.sum() == 0.0 and np.all((theta >= 0) & (theta < 1))
    blt.check_blt_params(theta, omega)


def test_momentum_strategy_is_optimised_for_its_own_workload():
    n, b = 60, 15
    plain = blt.optimize_blt(n, b)
    mom = blt.optimize_blt(n, b, momentum=0.9)
    assert blt.blt_loss(*mom, n, b, momentum=0.9) < blt.blt_loss(*plain, n, b, momentum=0.9) * 0.999


def test_single_participation_strategy_is_near_the_optimal_toeplitz_factorization():
    # For one participation the best lower-triangular Toeplitz C is near the square root of the prefix sums
    # (Fichtenberger et al. 2023): BLT with a few buffers gets within a few per cent of it (arXiv:2404.16706).
    n = 128
    theta, omega = blt.optimize_blt(n, n)
    r = np.zeros(n)
    r[0] = 1.0
    for k in range(1, n):  # the Toeplitz square root of the all-ones lower triangle: r_k = C(2k, k) / 4^k
        r[k] = r[k - 1] * (2 * k - 1) / (2 * k)
    sqrt_loss = float(np.linalg.norm(np.tril(np.ones((n, n))) @ np.linalg.inv(_dense(r))) ** 2 * np.dot(r, r))
    got = blt.blt_loss(theta, omega, n, n)
    assert got <= sqrt_loss * 1.05


# ----------------------------------------------------------------------------- the noise




@pytest.mark.parametrize("make", [torch_source, secure_source])
def test_blt_noise_is_C_inverse_of_the_source_stream(make):
    T, dim = 30, 5
    theta, omega = [0.97, 0.5, 0.1], [0.3, 0.25, 0.2]
    noise, twin = blt.BLTNoise(theta, omega, dim, make(3)), make(3)
    W = torch.stack([noise.sample() for _ in range(T)])
    Z = torch.stack([twin.add({"z": torch.zeros(dim, dtype=torch.float64)}, 1.0)["z"] for _ in range(T)])
    C = torch.from_numpy(_dense(blt.blt_coefficients(theta, omega, T)))
    expected = torch.linalg.solve_triangular(C, Z, upper=False)
    assert W.dtype == torch.float64 and torch.allclose(W, expected, rtol=0, atol=1e-11)


@pytest.mark.statistical
def test_covariance_is_C_inverse_C_inverse_transpose_with_power():
    T, dim = 7, 40_000
    theta, omega = [0.9, 0.3], [0.5, 0.3]
    noise = blt.BLTNoise(theta, omega, dim, torch_source(11))
    W = torch.stack([noise.sample() for _ in range(T)]).numpy()
    Cinv = np.linalg.inv(_dense(blt.blt_coefficients(theta, omega, T)))
    sigma = Cinv @ Cinv.T
    se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / dim)

    def fits(samples: np.ndarray) -> bool:
        return bool(np.all(np.abs(samples @ samples.T / dim - sigma) < 5 * se))

    assert fits(W)
    z = np.random.default_rng(12).standard_normal((T, dim))
    assert not fits(np.sqrt(np.diag(sigma))[:, None] * z)  # independent noise of the same per-step std fails
    assert np.abs(sigma - np.diag(np.diag(sigma))).max() > 50 * se.max()


@pytest.mark.parametrize("make", [torch_source, secure_source])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_buffers_is_independent_noise_bit_for_bit(make, dtype):
    g = torch.Generator().manual_seed(5)
    sums = {"w": torch.randn(4, 3, generator=g, dtype=dtype), "b": torch.randn(7, generator=g, dtype=dtype)}
    plain_blt, plain = blt.BLTNoise([], [], 19, make(9)), make(9)
    for _ in range(4):
        a, b = plain_blt.add(sums, 0.83), plain.add(sums, 0.83)
        assert all(a[k].dtype == dtype and torch.equal(a[k], b[k]) for k in sums)
    one = blt.BLTNoise([0.9], [0.5], 19, make(9))
    outs = [one.add(sums, 0.83) for _ in range(2)]
    fresh = make(9)
    ref = [fresh.add(sums, 0.83) for _ in range(2)]
    assert torch.equal(outs[0]["w"], ref[0]["w"]) and not torch.equal(outs[1]["w"], ref[1]["w"])


def test_zero_std_adds_nothing_and_the_std_cannot_change():
    sums = {"w": torch.randn(3, 4), "b": torch.randn(5)}
    noise = blt.BLTNoise([0.9], [0.5], 17, torch_source(0))
    out = noise.add(sums, 0.0)
    assert all(torch.equal(out[k], sums[k]) and out[k] is not sums[k] for k in sums) and noise.step == 0
    with pytest.raises(ValueError, match=r"std must stay 0\.0"):
        noise.add(sums, 1.0)


def test_state_round_trip_resumes_the_correlated_stream_and_the_buffers_are_secret():
    theta, omega = [0.95, 0.4], [0.3, 0.25]
    sums = {"w": torch.zeros(6, dtype=torch.float64)}
    a = blt.BLTNoise(theta, omega, 6, torch_source(21))
    for _ in range(5):
        a.add(sums, 1.0)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    expected = [a.add(sums, 1.0)["w"] for _ in range(4)]
    b = blt.BLTNoise(theta, omega, 6, torch_source(99))
    b.load_state_dict(state)
    assert all(torch.equal(b.add(sums, 1.0)["w"], e) for e in expected)
    # Teeth: without the buffers the continuation is another noise.
    lost = blt.BLTNoise(theta, omega, 6, torch_source(99))
    lost.load_state_dict({**state, "history": torch.zeros_like(state["history"])})
    assert not torch.equal(lost.add(sums, 1.0)["w"], expected[0])
    with pytest.raises(ValueError, match="coefficients differ"):
        blt.BLTNoise([0.95, 0.4], [0.3, 0.2], 6, torch_source(0)).load_state_dict(state)
    w = a.sample()
    assert repr(a) == "BLTNoise(buffers=2, dim=6, step=10)" and f"{float(w[0]):.4f}" not in repr(a)
    for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="must not be copied"):
            attempt(a)


# ----------------------------------------------------------------------------- accounting


def test_event_is_one_gaussian_at_the_minsep_sensitivity():
    params = [0.9, 0.4]
    n, m, T = 1000, 100, 35  # b = 10 partitions, k = 4 participations
    ev = blt.blt_event(2.0, params, m, n, T)
    sens = blt.minsep_sensitivity(blt.blt_coefficients([0.9], [0.4], T), T, 10)
    assert ev == gaussian_event(2.0 / sens) and sens == blt.blt_sensitivity(params, m, n, T)
    assert blt.blt_epsilon(2.0, params, m, n, T, 1e-5) == compute_epsilon(gaussian_event(2.0 / sens), 1e-5)
    # C = I within one epoch: one Gaussian at σ (each record in one step); over 3 epochs: sqrt(3) more sensitive.
    assert blt.blt_event(2.0, [], m, n, 10) == gaussian_event(2.0)
    assert blt.blt_event(2.0, [], m, n, 30) == gaussian_event(2.0 / math.sqrt(3))


@pytest.mark.parametrize("target", [0.5, 2.0, 8.0])
@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_calibration_never_overshoots(target, relation):
    params = (0.95, 0.5, 0.3, 0.2)
    sigma = blt.calibrate_blt_noise(target, 1e-5, params, 512, 60000, 300, relation=relation)
    eps = blt.blt_epsilon(sigma, params, 512, 60000, 300, 1e-5, relation=relation)
    assert 0.99 * target <= eps <= target
    with pytest.raises(UnreachableTargetError):
        blt.calibrate_blt_noise(1e-9, 1e-5, params, 512, 60000, 300)


def test_relative_rmse_trades_amplification_for_correlation():
    # The image preset (60,000 images, m = 512, one epoch): without amplification BLT loses to DP-SGD at small ε
    # and wins at large ε, where correlation matters more than sampling.
    small, _ = blt.blt_relative_rmse(0.1, 1e-5, 60_000, 512, 117)
    large, params = blt.blt_relative_rmse(8.0, 1e-5, 60_000, 512, 117)
    assert small > 1.5 and large < 0.6
    assert blt.blt_relative_rmse(8.0, 1e-5, 60_000, 512, 117, params=params)[0] == large

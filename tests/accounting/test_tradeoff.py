"""f-DP trade-off curves, conversions and Theorem 4's attribute-inference bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from featuredp.accounting import (
    attribute_inference_bound,
    attribute_inference_bound_eps_delta,
    delta_from_tradeoff,
    dpsgd_event,
    epsilon_delta_tradeoff,
    epsilon_for,
    epsilon_from_tradeoff,
    gaussian_tradeoff,
    plot_tradeoff,
    tradeoff_curve,
    tradeoff_from_profile,
)


def g_mu(alpha, mu):
    return norm.cdf(norm.ppf(1 - np.asarray(alpha)) - mu)


def test_gaussian_run_recovers_gdp_curve():
    # 4 full-batch steps at σ = 2 are 1-GDP: f = G_1. The profile-derived curve must be a lower bound, and close.
    alphas = np.array([1e-4, 1e-3, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9])
    _, f = tradeoff_curve((2.0, 1.0, 4), alphas)
    exact = g_mu(alphas, 1.0)
    assert np.all(f <= exact + 1e-9)
    assert np.all(f >= exact - 2e-3)
    np.testing.assert_allclose(gaussian_tradeoff(alphas, 1.0), exact, rtol=1e-10)


def test_curve_is_a_tradeoff_function():
    alphas, f = tradeoff_curve(dpsgd_event(1.0, 0.05, 500))
    assert alphas[0] == 0 and alphas[-1] == 1
    assert np.all(np.diff(f) <= 1e-12)  # non-increasing
    assert np.all(f <= 1 - alphas + 1e-12)  # below the perfect-privacy line
    assert np.all(f >= 0)
    # convex: second differences of f on the uniform part of the grid are >= 0 (up to rounding)
    uniform = np.linspace(0, 1, 101)
    _, fu = tradeoff_curve(dpsgd_event(1.0, 0.05, 500), uniform)
    assert np.all(np.diff(fu, 2) >= -1e-9)


def test_more_noise_means_a_higher_curve():
    a = np.linspace(0.001, 0.999, 50)
    _, f_lo = tradeoff_curve((0.8, 0.1, 200), a)
    _, f_hi = tradeoff_curve((1.6, 0.1, 200), a)
    assert np.all(f_hi >= f_lo - 1e-12)
    assert np.any(f_hi > f_lo + 0.01)


def test_epsilon_delta_round_trip():
    # (ε, δ) → f → (ε, δ): the conversion of f_{ε,δ} back at δ gives ε.
    a, f = epsilon_delta_tradeoff(1.5, 1e-5)
    assert epsilon_from_tradeoff(a, f, 1e-5) == pytest.approx(1.5, rel=1e-6)
    assert delta_from_tradeoff(a, f, 1.5) == pytest.approx(1e-5, abs=1e-9)


def test_run_curve_back_to_epsilon():
    sigma, p, steps, delta = 1.0, 0.0625, 200, 1e-5
    a, f = tradeoff_curve((sigma, p, steps))
    eps = epsilon_for(sigma, p, steps, delta)
    back = epsilon_from_tradeoff(a, f, delta)
    # the curve comes from a finite ε grid (a lower bound of f), so going back can only lose a little
    assert back == pytest.approx(eps, rel=0.02)


def test_tradeoff_from_profile_rejects_bad_input():
    with pytest.raises(ValueError, match="same"):
        tradeoff_from_profile(np.array([0.0, 1.0]), np.array([0.1]))
    with pytest.raises(ValueError, match="alphas"):
        epsilon_delta_tradeoff(1.0, 1e-5, alphas=[1.5])


def test_attribute_inference_bound_gaussian_closed_form():
    # 1 − G_μ(Ball) is the exact Theorem-4 bound for a μ-GDP run; ours must be >= it (sound) and close.
    ball = np.array([0.01, 0.1, 0.5])
    bound = attribute_inference_bound((2.0, 1.0, 4), ball)
    exact = 1 - g_mu(ball, 1.0)
    assert np.all(bound >= exact - 1e-12)
    assert np.all(bound <= exact + 2e-3)
    assert np.all(bound >= ball)  # the model never makes the attacker worse off than the baseline


def test_attribute_inference_bound_tighter_than_eps_delta_form():
    sigma, p, steps, delta = 1.0, 0.0625, 300, 1e-5
    eps = epsilon_for(sigma, p, steps, delta)
    for ball in (0.01, 0.05, 0.2):
        f_bound = attribute_inference_bound((sigma, p, steps), ball)
        ed_bound = attribute_inference_bound_eps_delta(eps, delta, ball)
        assert ball <= f_bound <= ed_bound + 1e-9


def test_eps_delta_form():
    assert attribute_inference_bound_eps_delta(1.0, 1e-5, 0.1) == pytest.approx(math.e * 0.1 + 1e-5)
    assert attribute_inference_bound_eps_delta(10.0, 1e-5, 0.1) == 1.0
    out = attribute_inference_bound_eps_delta(0.0, 0.0, np.array([0.2, 0.4]))
    np.testing.assert_allclose(out, [0.2, 0.4])
    # also reachable through attribute_inference_bound with a dict
    assert attribute_inference_bound({"epsilon": 1.0, "delta": 1e-5}, 0.1) <= math.e * 0.1 + 1e-5 + 1e-12
    with pytest.raises(ValueError, match="ball"):
        attribute_inference_bound_eps_delta(1.0, 1e-5, 1.5)
    with pytest.raises(TypeError, match="event_or_params"):
        attribute_inference_bound("run", 0.1)


def test_plot_is_written(tmp_path):
    a, f = tradeoff_curve((2.0, 1.0, 4))
    out = tmp_path / "sub" / "f.png"
    plot_tradeoff(str(out), a, f, epsilon=1.0, delta=1e-5)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.parent.glob(".*tmp"))  # no temporary left behind

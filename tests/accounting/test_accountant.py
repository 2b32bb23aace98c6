"""Contract and correctness tests of featuredp.accounting's ε/δ computations."""

from __future__ import annotations

import math
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from featuredp.accounting import (
    compose_events,
    compute_delta,
    compute_epsilon,
    dpsgd_event,
    epsilon_for,
    event_from_dict,
    event_to_dict,
)


def exact_gaussian_delta(eps: float, mu: float) -> float:
    # Written independently of the package (scipy.stats, no log-space tricks) on purpose.
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_accounting_does_not_import_torch():
    code = "import sys, featuredp.accounting; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_contract_no_events_is_free(accountant, relation):
    event = compose_events()
    assert compute_epsilon(event, 1e-5, relation=relation, accountant=accountant) == 0.0
    assert compute_delta(event, 1.0, relation=relation, accountant=accountant) == 0.0


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_contract_unsupported_event_raises(accountant):
    with pytest.raises(ValueError, match="not supported"):
        compute_epsilon(dp_accounting.UnsupportedDpEvent(), 1e-5, accountant=accountant)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_contract_non_private_event(accountant):
    assert compute_epsilon(dp_accounting.NonPrivateDpEvent(), 1e-5, accountant=accountant) == math.inf


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_contract_rejects_bad_arguments(accountant):
    event = dpsgd_event(1.0, 0.01, 10)
    with pytest.raises(ValueError, match="delta"):
        compute_epsilon(event, 0.0, accountant=accountant)
    with pytest.raises(ValueError, match="delta"):
        compute_epsilon(event, 1.5, accountant=accountant)
    with pytest.raises(ValueError, match="relation"):
        compute_epsilon(event, 1e-5, relation="swap", accountant=accountant)
    with pytest.raises(ValueError, match="epsilon"):
        compute_delta(event, -1.0, accountant=accountant)
    with pytest.raises(TypeError, match="event"):
        compute_epsilon("dpsgd", 1e-5, accountant=accountant)


def test_rejects_bad_accountant_and_settings():
    with pytest.raises(ValueError, match="accountant"):
        epsilon_for(1.0, 0.1, 10, 1e-5, accountant="moments")
    with pytest.raises(ValueError, match="noise_multiplier"):
        epsilon_for(0.0, 0.1, 10, 1e-5)
    with pytest.raises(ValueError, match="sampling_rate"):
        epsilon_for(1.0, 1.5, 10, 1e-5)
    with pytest.raises(ValueError, match="steps"):
        epsilon_for(1.0, 0.1, 0, 1e-5)


@pytest.mark.parametrize("sigma,steps", [(0.5, 1), (1.0, 1), (1.0, 100), (4.0, 1000), (10.0, 100_000), (2.0, 7)])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_exact_gaussian_at_full_batch(sigma, steps, delta):
    mu = math.sqrt(steps) / sigma
    eps = epsilon_for(sigma, 1.0, steps, delta)
    # ε is the exact one: δ(ε) hits delta, and a slightly smaller ε would not satisfy it.
    assert exact_gaussian_delta(eps, mu) <= delta * (1 + 1e-9)
    if eps > 0:
        assert exact_gaussian_delta(eps * (1 - 1e-6) - 1e-12, mu) > delta
    # and δ(ε) is the closed form
    assert compute_delta(dpsgd_event(sigma, 1.0, steps), 1.0) == pytest.approx(exact_gaussian_delta(1.0, mu), rel=1e-9)


def test_replace_one_at_full_batch_is_sensitivity_two():
    sigma, steps, delta = 3.0, 20, 1e-6
    mu = 2 * math.sqrt(steps) / sigma
    eps = epsilon_for(sigma, 1.0, steps, delta, relation="replace-one")
    assert exact_gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-6)
    # the RDP backend must account the same doubled sensitivity (dp-accounting alone would ignore it)
    assert epsilon_for(sigma, 1.0, steps, delta, relation="replace-one", accountant="rdp") >= eps


def test_rdp_replace_one_with_sampling_is_a_clear_error():
    with pytest.raises(ValueError, match="accountant='pld'"):
        epsilon_for(1.0, 0.01, 100, 1e-5, relation="replace-one", accountant="rdp")


def test_pld_matches_dp_accounting_default():
    # Our adaptive discretisation must agree with dp-accounting's own PLD at 1e-4 (which is slightly looser).
    sigma, p, steps, delta = 1.0, 0.0625, 300, 1e-5
    ours = epsilon_for(sigma, p, steps, delta)
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(sigma)), steps)
    ref = acc.get_epsilon(delta)
    assert ref * 0.995 <= ours <= ref * 1.0005


@pytest.mark.parametrize("sigma,p,steps", [(1.0, 0.0625, 1000), (2.0, 0.01, 5000), (0.8, 0.2, 50)])
def test_replace_one_is_costlier_than_add_remove(sigma, p, steps):
    ar = epsilon_for(sigma, p, steps, 1e-5)
    ro = epsilon_for(sigma, p, steps, 1e-5, relation="replace-one")
    assert ro > ar


@pytest.mark.parametrize("sigma,p,steps", [(1.0, 0.0625, 1000), (2.0, 0.01, 5000), (0.6, 0.004, 20000), (4.0, 1.0, 10)])
def test_rdp_is_looser_than_pld(sigma, p, steps):
    pld = epsilon_for(sigma, p, steps, 1e-5)
    rdp = epsilon_for(sigma, p, steps, 1e-5, accountant="rdp")
    assert rdp >= pld
    assert rdp <= 3 * pld + 1  # same ballpark: guards against a wildly wrong backend


def test_composition_of_phases():
    a, b = dpsgd_event(1.0, 0.05, 200), dpsgd_event(2.0, 0.01, 1000)
    ea, eb = compute_epsilon(a, 1e-5), compute_epsilon(b, 1e-5)
    eab = compute_epsilon(compose_events(a, b), 1e-5)
    assert max(ea, eb) < eab < ea + eb
    # two identical halves compose to the whole run
    half = dpsgd_event(1.0, 0.05, 100)
    assert compute_epsilon(compose_events(half, half), 1e-5) == pytest.approx(ea, rel=3e-3)
    # full-batch Gaussians compose exactly: σ1, σ2 → μ² = 1/σ1² + 1/σ2²
    g = compose_events(dpsgd_event(1.0, 1.0, 1), dpsgd_event(2.0, 1.0, 4))
    mu = math.sqrt(1 + 4 / 4)
    assert exact_gaussian_delta(compute_epsilon(g, 1e-5), mu) == pytest.approx(1e-5, rel=1e-6)


def test_delta_and_epsilon_are_inverse():
    event = dpsgd_event(1.2, 0.02, 3000)
    eps = compute_epsilon(event, 1e-6)
    d = compute_delta(event, eps)
    assert d == pytest.approx(1e-6, rel=0.05)
    assert d <= 1e-6 * 1.05


def test_event_round_trip():
    event = compose_events(dpsgd_event(1.0, 0.1, 10), dpsgd_event(2.0, 1.0, 3))
    assert event_from_dict(event_to_dict(event)) == event


# ---------------------------------------------------------------------------------- monotonicity (hypothesis)

_settings = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(
    sigma=st.floats(0.6, 4.0),
    p=st.floats(0.001, 0.5),
    steps=st.integers(1, 1000),
    factor=st.floats(1.05, 2.0),
)
def test_monotone_in_sigma_p_and_steps(sigma, p, steps, factor):
    base = epsilon_for(sigma, p, steps, 1e-5)
    slack = max(1e-3 * base, 2e-5)  # the documented accuracy: 0.2% relative or 1e-5 absolute
    assert epsilon_for(sigma * factor, p, steps, 1e-5) <= base + slack
    assert epsilon_for(sigma, min(1.0, p * factor), steps, 1e-5) >= base - slack
    assert epsilon_for(sigma, p, math.ceil(steps * factor), 1e-5) >= base - slack


# ---------------------------------------------------------------------------------- independent reference

prv_accountant = pytest.importorskip("prv_accountant")


def _prv_bounds(sigma, p, steps, delta, eps_error):
    acc = prv_accountant.Accountant(
        noise_multiplier=sigma, sampling_probability=p, delta=delta, max_compositions=steps, eps_error=eps_error
    )
    lo, _est, hi = acc.compute_epsilon(steps)
    return lo, hi


def _check_against_prv(sigma, p, steps, delta=1e-5):
    ours = epsilon_for(sigma, p, steps, delta)
    lo, hi = _prv_bounds(sigma, p, steps, delta, eps_error=max(0.01, 0.002 * ours))
    # PLD is an upper bound (>= the true ε >= lo) and tight (<= hi).
    assert lo <= ours <= hi, (sigma, p, steps, lo, ours, hi)


@pytest.mark.parametrize("sigma,p,steps", [(4.0, 1.0, 100), (1.0, 0.001, 1000), (2.0, 0.05, 200)])
def test_agrees_with_prv_accountant(sigma, p, steps):
    _check_against_prv(sigma, p, steps)


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("p", [0.001, 0.01, 0.1, 1.0])
@pytest.mark.parametrize("steps", [10, 1000, 100_000])
def test_agrees_with_prv_accountant_full_grid(sigma, p, steps):
    ours = epsilon_for(sigma, p, steps, 1e-5)
    # Beyond ε ≈ 100 prv-accountant is unreliable: at σ=0.5, p=0.1, T=1000 (ε≈126) its eps_error=0.25 bounds
    # exclude dp-accounting's value (stable to 1e-6 over intervals 1e-2..1e-4) and its tighter runs fail
    # ("Discrete mean differs from continuous mean"); above ≈200 it runs out of memory.
    if ours > 100:
        pytest.skip(f"epsilon {ours:.0f} beyond prv-accountant's range")
    try:
        lo, hi = _prv_bounds(sigma, p, steps, 1e-5, eps_error=max(0.01, 0.002 * ours))
    except (ValueError, MemoryError) as exc:  # its own numerical failures (prv issues #591/#601)
        pytest.skip(f"prv-accountant failed: {exc}")
    if ours > 50 and not lo <= ours <= hi:
        # Measured: σ=4, p=0.1, T=1e5 — prv says 63.459 for eps_error 0.5, 0.13 and 0.05 alike, while
        # dp-accounting's pessimistic PLD converges to 65.55 (remove direction; 65.58 at interval 1.8e-3,
        # 65.555 at 1e-3) and the CLT gives 65.70. Pessimistic PLDs are upper bounds at every interval and
        # converge to the exact value, so we read this as prv's bound failing, and record it as such.
        pytest.xfail(f"prv-accountant bounds [{lo:.4g}, {hi:.4g}] exclude the converged PLD {ours:.4g} at large T")
    assert lo <= ours <= hi


def test_pld_grid_is_pessimistic_against_exact():
    # At p = 1 a PLD must be an upper bound of the exact Gaussian: check our snapped PLD path by forcing it
    # through a composition with a negligible subsampled event.
    tiny = dpsgd_event(1000.0, 1e-6, 1)
    g = dpsgd_event(1.5, 1.0, 10)
    eps = compute_epsilon(compose_events(g, tiny), 1e-5)
    exact = epsilon_for(1.5, 1.0, 10, 1e-5)
    assert exact <= eps <= exact * 1.003
    assert np.isfinite(eps)

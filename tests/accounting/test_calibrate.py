"""Calibration never overshoots the target ε and does not waste it."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from featuredp.accounting import calibrate_noise_multiplier, calibrate_steps, epsilon_for
from featuredp.errors import UnreachableTargetError


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    target=st.floats(0.3, 12.0),
    p=st.floats(0.002, 0.3),
    steps=st.integers(1, 2000),
    relation=st.sampled_from(["add-remove", "replace-one"]),
)
def test_noise_calibration_never_overshoots_and_does_not_waste(target, p, steps, relation):
    sigma = calibrate_noise_multiplier(target, 1e-5, p, steps, relation=relation)
    achieved = epsilon_for(sigma, p, steps, 1e-5, relation=relation)
    assert achieved <= target
    assert achieved >= 0.99 * target


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_noise_calibration_both_backends(accountant):
    sigma = calibrate_noise_multiplier(4.0, 1e-5, 0.01, 3000, accountant=accountant)
    achieved = epsilon_for(sigma, 0.01, 3000, 1e-5, accountant=accountant)
    assert 0.99 * 4.0 <= achieved <= 4.0


def test_rdp_needs_more_noise_than_pld():
    s_pld = calibrate_noise_multiplier(2.0, 1e-5, 0.02, 2000)
    s_rdp = calibrate_noise_multiplier(2.0, 1e-5, 0.02, 2000, accountant="rdp")
    assert s_rdp > s_pld


def test_noise_calibration_full_batch_is_exact_gaussian():
    # At p = 1 with T steps the answer is σ = sqrt(T)/μ* with μ* the analytic Gaussian μ for (ε, δ).
    s1 = calibrate_noise_multiplier(1.0, 1e-5, 1.0, 1, tolerance=1e-4)
    s100 = calibrate_noise_multiplier(1.0, 1e-5, 1.0, 100, tolerance=1e-4)
    assert s100 == pytest.approx(10 * s1, rel=1e-3)
    # replace-one doubles the sensitivity, so the noise doubles
    s_ro = calibrate_noise_multiplier(1.0, 1e-5, 1.0, 1, relation="replace-one", tolerance=1e-4)
    assert s_ro == pytest.approx(2 * s1, rel=1e-3)
    # the classic analytic value for ε = 1, δ = 1e-5 (Balle & Wang 2018): σ ≈ 3.73
    assert s1 == pytest.approx(3.73, abs=0.01)


def test_noise_calibration_known_setting():
    # Purchase100-like: ε = 8 after 1000 steps at p = 1/16 (one step costs ≈ 1.23 at σ = 1)
    sigma = calibrate_noise_multiplier(8.0, 1e-5, 0.0625, 1000)
    assert 1.3 < sigma < 1.5


def test_noise_calibration_unreachable_names_the_fix():
    with pytest.raises(UnreachableTargetError, match="steps=100000"):
        calibrate_noise_multiplier(1e-6, 1e-5, 1.0, 100_000)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(target_epsilon=-1.0), "target_epsilon"),
        (dict(delta=1.0), "delta"),
        (dict(sampling_rate=0.0), "sampling_rate"),
        (dict(steps=0), "steps"),
        (dict(relation="swap"), "relation"),
        (dict(accountant="gdp"), "accountant"),
    ],
)
def test_noise_calibration_bad_input(kwargs, name):
    args = dict(target_epsilon=1.0, delta=1e-5, sampling_rate=0.01, steps=100)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        calibrate_noise_multiplier(**args)


@pytest.mark.parametrize("target,p,sigma", [(8.0, 0.0625, 1.0), (1.0, 0.01, 2.0), (3.0, 1.0, 10.0)])
def test_step_calibration_is_the_largest(target, p, sigma):
    steps = calibrate_steps(target, 1e-5, p, sigma)
    assert epsilon_for(sigma, p, steps, 1e-5) <= target
    assert epsilon_for(sigma, p, steps + 1, 1e-5) > target


def test_step_calibration_known_setting():
    # Purchase100 settings (paper §6.2): ε = 8 allows ≈ 21 epochs at p = 1/16, σ = 1
    steps = calibrate_steps(8.0, 1e-5, 0.0625, 1.0)
    assert 20 <= steps * 0.0625 <= 23


def test_step_calibration_unreachable_says_which_noise_would_reach_it():
    with pytest.raises(UnreachableTargetError, match=r"noise_multiplier >= \d"):
        calibrate_steps(1.0, 1e-5, 0.0625, 1.0)


def test_step_calibration_cap():
    assert calibrate_steps(1.0, 1e-5, 0.001, 50.0, max_steps=1000) == 1000


def test_step_calibration_bad_input():
    with pytest.raises(ValueError, match="noise_multiplier"):
        calibrate_steps(1.0, 1e-5, 0.01, -1.0)
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_steps(math.nan, 1e-5, 0.01, 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("target,p,steps", [(8.0, 256 / 60000, 100_000), (1.0, 0.001, 100_000), (3.0, 0.01, 30_000)])
@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_noise_calibration_long_runs(target, p, steps, relation):
    sigma = calibrate_noise_multiplier(target, 1e-5, p, steps, relation=relation)
    achieved = epsilon_for(sigma, p, steps, 1e-5, relation=relation)
    assert 0.99 * target <= achieved <= target


# ---------------------------------------------------------------------------------------------------------
# Issue 17: no silent hours: the PLD step limit, and large ε stays cheap
# ---------------------------------------------------------------------------------------------------------
def test_pld_refuses_more_steps_than_its_limit_and_rdp_takes_them():
    import time

    from featuredp.accounting import epsilon_for
    from featuredp.accounting.accountant import MAX_PLD_STEPS

    t0 = time.process_time()  # CPU time: other jobs on a busy machine do not count
    with pytest.raises(ValueError, match=r"steps=1000000000000 is above the PLD accountant's limit.*accountant='rdp'"):
        epsilon_for(1.0, 0.01, 10**12, 1e-5)
    with pytest.raises(ValueError, match="PLD accountant's limit"):
        calibrate_noise_multiplier(1.0, 1e-5, 0.01, MAX_PLD_STEPS + 1)
    assert time.process_time() - t0 < 5
    assert epsilon_for(1.0, 0.01, 10**12, 1e-5, accountant="rdp") > 0


def test_calibrate_steps_stops_at_the_pld_limit_without_accounting_it():
    import time

    from featuredp.accounting.accountant import MAX_PLD_STEPS

    t0 = time.process_time()  # RDP (an upper bound) already allows the limit: no PLD of 10^7 steps is run
    assert calibrate_steps(100.0, 1e-5, 0.001, 5.0) == MAX_PLD_STEPS
    assert time.process_time() - t0 < 10


def test_a_huge_target_is_calibrated_in_seconds_not_minutes():
    import time

    from featuredp.accounting import epsilon_for

    # 1e6 took 187 s and 10.8 GB before: the PLD interval was capped at 0.05 however large ε was.
    t0 = time.process_time()  # CPU time, not wall: robust to a loaded machine
    sigma = calibrate_noise_multiplier(1e6, 1e-5, 0.0625, 320)
    assert 0.99e6 <= epsilon_for(sigma, 0.0625, 320, 1e-5) <= 1e6
    assert time.process_time() - t0 < 60

"""The record-level backstop's accounting (issue 34 C): the composed ε against dp_accounting built by hand, and the
calibration of σ_pub (never above E, at least 0.99·E)."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting import pld

from featuredp.accounting import calibrate_record_noise, record_epsilon
from featuredp.errors import UnreachableTargetError
from featuredp.plan import PrivacyPlan


def _reference(delta: float, parts: list[tuple[float, float, int]]) -> float:
    """ε of the Poisson-subsampled Gaussians composed, with dp_accounting's PLD accountant directly."""
    events = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), t) for sigma, q, t in parts]
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return float(acc.get_epsilon(delta))


def test_the_plans_record_epsilon_is_the_composition_of_private_pretraining_and_public_steps() -> None:
    plan = PrivacyPlan("fdp", dataset_size=1000, expected_batch_size=50, sampling_rate=0.05, steps=120,
                       pretrain_steps=30, public_batch_size=200, pretrain_batch_size=100, noise_multiplier=1.1,
                       max_grad_norm=1.0, delta=1e-5, record_target_epsilon=10.0, record_noise_multiplier=1.7)
    ref = _reference(1e-5, [(1.1, 0.05, 120), (1.7, 0.1, 30), (1.7, 0.2, 120)])
    assert plan.record_epsilon() == pytest.approx(ref, rel=0.01)
    # a plan that left a group out (e.g. forgot the public batches) is far off: the test can fail
    assert _reference(1e-5, [(1.1, 0.05, 120), (1.7, 0.1, 30)]) < 0.9 * ref
    # steps actually run: fewer public batches, fewer pre-training steps
    ref_run = _reference(1e-5, [(1.1, 0.05, 60), (1.7, 0.1, 10), (1.7, 0.2, 60)])
    assert plan.record_epsilon(60, 10, 60) == pytest.approx(ref_run, rel=0.01)


def test_two_parts_public_method_and_fdp_dpsgd() -> None:
    pub = PrivacyPlan("public", dataset_size=500, expected_batch_size=25, sampling_rate=0.05, steps=80,
                      public_batch_size=25, max_grad_norm=1.0, delta=1e-5, record_target_epsilon=4.0,
                      record_noise_multiplier=1.3)
    assert pub.record_epsilon() == pytest.approx(_reference(1e-5, [(1.3, 0.05, 80)]), rel=0.01)
    assert pub.epsilon() == 0.0  # the FDP ε is unchanged: public steps read Ψ(S) only
    dp = PrivacyPlan("fdp_dpsgd", dataset_size=500, expected_batch_size=25, sampling_rate=0.05, steps=80,
                     pretrain_steps=20, pretrain_batch_size=50, noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5,
                     record_target_epsilon=8.0, record_noise_multiplier=0.9)
    assert dp.record_epsilon() == pytest.approx(_reference(1e-5, [(1.0, 0.05, 80), (0.9, 0.1, 20)]), rel=0.01)


def test_without_a_backstop_the_record_epsilon_is_null_where_the_public_view_was_read_without_noise() -> None:
    base = dict(dataset_size=500, expected_batch_size=25, sampling_rate=0.05, steps=40, noise_multiplier=1.0,
                max_grad_norm=1.0, delta=1e-5)
    assert PrivacyPlan("fdp", public_batch_size=100, **base).record_epsilon() is None  # type: ignore[arg-type]
    assert PrivacyPlan("fdp_dpsgd", pretrain_steps=5, **base).record_epsilon() is None  # type: ignore[arg-type]
    dpsgd = PrivacyPlan("dpsgd", **base)  # type: ignore[arg-type]
    assert dpsgd.record_epsilon() == dpsgd.epsilon()
    # fdp_dpsgd without pre-training never read the public view: clipped ∇ℓ, record-level DP at its ε
    plain = PrivacyPlan("fdp_dpsgd", **base)  # type: ignore[arg-type]
    assert plain.record_epsilon() == plain.epsilon()
    assert PrivacyPlan("nonprivate", 500, 25, 0.05, 40).record_epsilon() is None


_CASES = [
    (2.0, None, (0.05, 50), (0.1, 0)),
    (8.0, (1.0, 0.05, 100), (0.1, 20), (0.2, 100)),
    (4.0, (2.0, 0.02, 200), (0.05, 0), (0.08, 200)),
    (16.0, (0.8, 0.1, 50), (0.2, 40), (0.0, 0)),
]


@pytest.mark.parametrize(("target", "private", "pretrain", "public"), _CASES)
def test_calibration_never_overshoots_and_wastes_at_most_one_percent(target, private, pretrain, public) -> None:
    sigma = calibrate_record_noise(target, 1e-5, private=private, pretrain=pretrain, public=public)
    assert sigma is not None
    eps = record_epsilon(1e-5, private=private, pretrain=pretrain, public=public, noise_multiplier=sigma)
    assert eps is not None and 0.99 * target <= eps <= target
    # checked against dp_accounting itself, not only against the function the search used
    parts = ([] if private is None else [private]) + [(sigma, q, t) for q, t in (pretrain, public) if t]
    assert _reference(1e-5, parts) <= target * 1.002


def test_no_public_step_needs_no_noise_and_private_steps_above_the_target_are_refused() -> None:
    assert calibrate_record_noise(4.0, 1e-5, private=(1.0, 0.05, 100), pretrain=(0.1, 0), public=(0.1, 0)) is None
    with pytest.raises(UnreachableTargetError, match=r"--record-epsilon 0\.5 cannot be met: the private steps alone"):
        calibrate_record_noise(0.5, 1e-5, private=(1.0, 0.05, 100), pretrain=(0.1, 10), public=(0.2, 100))
    with pytest.raises(ValueError, match="record_epsilon must be > 0"):
        calibrate_record_noise(-1.0, 1e-5, private=None, pretrain=(0.1, 10), public=(0.2, 0))

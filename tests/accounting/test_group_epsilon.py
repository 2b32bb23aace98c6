"""Group privacy of the Poisson-subsampled Gaussian (featuredp.accounting.group): checks against independent truths."""

from __future__ import annotations

import itertools
import math

import pytest

from featuredp.accounting import epsilon_for, group_bound, group_epsilon
from featuredp.accounting.group import group_epsilon_lower

SIGMA, Q, T, DELTA = 1.0, 0.05, 20, 1e-5


def test_a_group_of_one_is_the_ordinary_epsilon() -> None:
    """k = 1 goes through the mixture of Gaussians (J ~ Binomial(1, q)): it must agree with the subsampled Gaussian."""
    b = group_bound(SIGMA, Q, T, DELTA, 1)
    assert b.method == "mixture" and b.terms == 2
    assert b.epsilon == pytest.approx(epsilon_for(SIGMA, Q, T, DELTA), rel=0.01)


@pytest.mark.parametrize("k", [2, 3])
def test_at_full_batch_a_group_is_the_gaussian_at_sensitivity_k(k: int) -> None:
    """q = 1: every member is in every step, so the sum moves by exactly k·C: the Gaussian at σ/k (closed form)."""
    assert group_epsilon(SIGMA, 1.0, 3, DELTA, k) == pytest.approx(epsilon_for(SIGMA / k, 1.0, 3, DELTA), rel=0.01)


def test_monotone_in_the_group_size_and_never_below_one_record() -> None:
    eps = [group_epsilon(SIGMA, Q, T, DELTA, k) for k in (1, 2, 3, 5, 8)]
    assert all(a < b for a, b in itertools.pairwise(eps)), eps
    assert min(eps) >= epsilon_for(SIGMA, Q, T, DELTA) * 0.99


@pytest.mark.parametrize(("q", "k"), [(0.05, 3), (0.2, 4), (0.5, 2)])
def test_never_below_the_threshold_test_lower_bound(q: float, k: int) -> None:
    """Any test on the outputs gives a lower bound on every valid ε: a group ε under it would be a false guarantee."""
    lower = group_epsilon_lower(SIGMA, q, 10, DELTA, k)
    assert lower > epsilon_for(SIGMA, q, 10, DELTA) * 0.5  # the test has power: the bound is not vacuous
    assert group_epsilon(SIGMA, q, 10, DELTA, k) >= lower


def test_the_lower_bound_is_tight_at_full_batch() -> None:
    """The threshold test is optimal for one shifted Gaussian: the check is sharp where the answer is known."""
    exact = epsilon_for(SIGMA / 3, 1.0, 1, DELTA)
    assert group_epsilon_lower(SIGMA, 1.0, 1, DELTA, 3) == pytest.approx(exact, rel=0.01)


def test_a_large_group_is_truncated_and_stays_between_the_bounds() -> None:
    """k = 200 at q = 0.002: the mixture is cut where J's tail cannot matter (moved mass charged to δ)."""
    b = group_bound(2.0, 0.002, 10, DELTA, 200)
    assert b.method == "mixture-truncated" and b.terms < 50
    upper = group_bound(2.0, 0.002, 10, DELTA, 200, accountant="rdp")
    assert upper.method == "upper-bound"
    assert group_epsilon_lower(2.0, 0.002, 10, DELTA, 200) <= b.epsilon <= upper.epsilon


def test_the_dominating_upper_bound_is_above_the_mixture() -> None:
    mixture = group_epsilon(SIGMA, Q, T, DELTA, 3)
    upper = group_bound(SIGMA, Q, T, DELTA, 3, accountant="rdp")
    q_group = 1 - (1 - Q) ** 3
    assert upper.method == "upper-bound" and upper.epsilon >= mixture
    assert upper.epsilon == pytest.approx(epsilon_for(SIGMA / 3, q_group, T, DELTA, accountant="rdp"))


def test_no_steps_no_loss_and_bad_arguments_name_the_parameter() -> None:
    assert group_epsilon(SIGMA, Q, 0, DELTA, 5) == 0.0
    for kwargs, name in [({"group_size": 0}, "group_size"), ({"noise_multiplier": 0.0}, "noise_multiplier"),
                         ({"sampling_rate": 1.5}, "sampling_rate"), ({"delta": 1.0}, "delta")]:  # fmt: skip
        args = {"noise_multiplier": SIGMA, "sampling_rate": Q, "steps": T, "delta": DELTA, "group_size": 2, **kwargs}
        with pytest.raises(ValueError, match=name):
            group_epsilon(**args)
    assert math.isfinite(group_epsilon(SIGMA, Q, T, DELTA, 2))

"""The δ of the noise sampler's cut tail (featuredp.accounting.sampler): hand computations, the refusal, and the
old float32 sampler's δ against the new bound at σ ∈ {0.3, 0.5, 1} (issue 23, finding 2)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from scipy import stats

from featuredp.accounting import (
    bounded_sampler_delta,
    check_sampler_tail,
    sampler_max_radius,
    sampler_tail_delta,
    sampler_tail_mass,
)
from featuredp.accounting._gaussian import gaussian_epsilon
from featuredp.accounting.sampler import MAX_TAIL_FRACTION, TAIL_MASS_PER_PAIR

R_FLOAT32 = math.sqrt(-2 * math.log(2.0**-24))


def test_sampler_module_imports_no_torch():
    code = "import sys, featuredp.accounting.sampler; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_tail_mass_is_the_noise_transform_s():
    import featuredp.noise.sources as noise

    assert TAIL_MASS_PER_PAIR == noise.TAIL_MASS_PER_PAIR == 2.0**-126
    assert sampler_max_radius() == noise.MAX_RADIUS


def test_radii_of_known_samplers():
    assert sampler_max_radius(2.0**-24) == pytest.approx(5.76811, abs=1e-5)  # float32 torch.randn
    assert sampler_max_radius(2.0**-53) == pytest.approx(8.57167, abs=1e-5)  # a 53-bit float64 uniform
    assert sampler_max_radius() == pytest.approx(13.21639, abs=1e-5)
    # An ideal pair leaves the disc of radius R with probability e^{−R²/2}: the tail mass itself.
    assert stats.chi2.sf(sampler_max_radius(2.0**-24) ** 2, 2) == pytest.approx(2.0**-24, rel=1e-9)


def test_tail_delta_by_hand():
    # 3 steps of 5 coordinates = 3 pairs each (the last one half used): η = 9·u; δ_tail = (1 + e^ε)·η.
    u = 2.0**-30
    assert sampler_tail_mass(3, 5, u) == 9 * u
    assert sampler_tail_delta(1.0, 3, 5, u) == pytest.approx((1 + math.e) * 9 * u, rel=1e-15)
    assert sampler_tail_delta(0.0, 1, 2, 0.25) == 0.5
    # The default tail: 1000 steps of the Purchase MLP at ε = 10.
    assert sampler_tail_delta(10.0, 1000, 210_400) == pytest.approx((1 + math.exp(10)) * 1000 * 105_200 * 2.0**-126)
    assert sampler_tail_delta(50.0, 0, 10**6) == 0.0 and sampler_tail_delta(math.inf, 3, 0) == 0.0  # no noise drawn
    assert sampler_tail_delta(800.0, 1, 2) == math.inf  # e^ε overflows: vacuous, never silently 0
    assert sampler_tail_mass(10, 10, 0.5) == 1.0  # a probability


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sampler_tail_delta(-1.0, 1, 2), "epsilon must be >= 0"),
        (lambda: sampler_tail_delta(math.nan, 1, 2), "epsilon must be >= 0"),
        (lambda: sampler_tail_mass(-1, 2), "steps must be an integer >= 0, got -1"),
        (lambda: sampler_tail_mass(1, 2.5), "dimension must be an integer >= 0, got 2.5"),  # type: ignore[arg-type]
        (lambda: sampler_tail_mass(1, 2, 0.0), r"tail_mass_per_pair must be in \(0, 1\], got 0.0"),
        (lambda: bounded_sampler_delta(0.0, 5.0), "noise_multiplier must be > 0"),
        (lambda: bounded_sampler_delta(1.0, -1.0), "max_radius must be > 0"),
    ],
)
def test_bad_inputs_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_refusal_at_one_percent_of_delta():
    delta, steps, dim, u = 1e-5, 10, 4, 2.0**-40  # η = 20·u
    allowed = math.log(MAX_TAIL_FRACTION * delta / (20 * u) - 1)  # the ε where δ_tail = 1% of δ
    assert check_sampler_tail(allowed - 1e-6, delta, steps, dim, noise_multiplier=0.7, tail_mass_per_pair=u) <= 1e-7
    with pytest.raises(ValueError, match=r"^noise_multiplier=0.7 with steps=10 \(epsilon=.*over 0.01 x delta=1e-05"):
        check_sampler_tail(allowed + 1e-6, delta, steps, dim, noise_multiplier=0.7, tail_mass_per_pair=u)
    # With the real tail a sane run is far from it: ε = 40 on 10¹² noised coordinates adds 1.4e-9 ≪ 1e-7.
    assert check_sampler_tail(40.0, delta, 10**6, 10**6, noise_multiplier=0.5) < 2e-9


@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0])
def test_old_float32_sampler_delta_against_the_new_bound(sigma):
    # One full-batch step, sensitivity C, claimed (ε(1e-5), 1e-5): the float32 sampler's disc gives an attacker
    # δ ≥ P(‖s + Z‖ > 5.768) − 2⁻²⁴ at every ε (an independent closed form: the Rice distribution), while the new
    # sampler's tail adds at most (1 + e^ε)·2⁻¹²⁶ per pair.
    old = bounded_sampler_delta(sigma, R_FLOAT32)
    assert old == pytest.approx(stats.rice.sf(R_FLOAT32, 1 / sigma) - 2.0**-24, rel=1e-6)
    eps = gaussian_epsilon(1e-5, 1 / sigma)
    new = sampler_tail_delta(eps, steps=1, dimension=2)
    expected_old = {0.3: 1.014e-2, 0.5: 1.44e-4, 1.0: 2.264e-6}[sigma]  # the table in docs/accounting.md
    assert old == pytest.approx(expected_old, rel=0.01)
    assert new < 2e-27 and new < old * 1e-20
    if sigma <= 0.5:
        assert old > 1e-5  # the claimed δ was false

"""Generic (ε, δ) composition rules."""

from __future__ import annotations

import math

import pytest

from featuredp.accounting import (
    advanced_composition,
    amplify_by_subsampling,
    basic_composition,
    parallel_composition,
)


def test_basic():
    assert basic_composition([(1.0, 1e-6), (0.5, 2e-6)]) == pytest.approx((1.5, 3e-6))
    assert basic_composition([]) == (0, 0)


def test_advanced_formula_and_when_it_wins():
    eps, delta, k, dp = 0.1, 1e-7, 100, 1e-6
    e, d = advanced_composition(eps, delta, k, dp)
    assert e == pytest.approx(k * eps * math.expm1(eps) + eps * math.sqrt(2 * k * math.log(1 / dp)))
    assert d == pytest.approx(k * delta + dp)
    assert e < k * eps  # many small steps: advanced beats basic
    # one big step: advanced is worse than basic (and is returned as is)
    e1, _ = advanced_composition(2.0, 0.0, 1, 1e-6)
    assert e1 > 2.0


def test_parallel():
    assert parallel_composition([(1.0, 1e-6), (3.0, 0.0), (2.0, 1e-5)]) == (3.0, 1e-5)
    assert parallel_composition([]) == (0.0, 0.0)


def test_subsampling_amplification():
    e, d = amplify_by_subsampling(1.0, 1e-5, 0.01)
    assert e == pytest.approx(math.log(1 + 0.01 * (math.e - 1)))
    assert d == pytest.approx(1e-7)
    assert amplify_by_subsampling(1.0, 1e-5, 1.0) == pytest.approx((1.0, 1e-5))
    assert e < 0.01 * 2  # ≈ q(e^ε − 1) for small q


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: advanced_composition(-1, 0, 2, 1e-6), "epsilon"),
        (lambda: advanced_composition(1, 0, 0, 1e-6), "k"),
        (lambda: advanced_composition(1, 0, 2, 0.0), "delta_prime"),
        (lambda: amplify_by_subsampling(1, 0, 1.5), "sampling_rate"),
        (lambda: basic_composition([(1.0, 2.0)]), "delta"),
        (lambda: basic_composition([(-1.0, 0.0)]), "epsilon"),
    ],
)
def test_bad_input(call, name):
    with pytest.raises(ValueError, match=name):
        call()
    with pytest.raises(TypeError, match="pair"):
        parallel_composition([1.0])

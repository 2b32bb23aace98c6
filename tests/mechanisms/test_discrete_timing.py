"""The exact discrete samplers' timing side channel (issue 42, item 2): documented, not removed.

The samplers' work grows with the noise they return, so the time of a release tells about |noise| (Jin et al.,
S&P 2022). These tests pin what ``featuredp.mechanisms._discrete`` documents by counting the uniform draws a sample
costs (deterministic, unlike wall time on a shared machine); ``benchmarks/discrete_sampler_timing.py`` measures the
time itself. If the samplers become constant-time, these fail: then drop the warning from the docs as well.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from featuredp.mechanisms import _discrete
from featuredp.mechanisms._discrete import Bits


class CountingBits(Bits):
    """Bits that count the uniform integers drawn: the samplers' work."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self.calls = 0

    def below(self, n: int) -> int:
        self.calls += 1
        return super().below(n)


def _work_by_size(draw, scale: float, n: int, bits: CountingBits) -> tuple[np.ndarray, np.ndarray]:
    sizes, work = np.empty(n), np.empty(n)
    for i in range(n):
        before = bits.calls
        sizes[i] = abs(draw()) / scale
        work[i] = bits.calls - before
    return sizes, work


def test_a_discrete_laplace_draw_costs_more_work_the_larger_the_noise():
    bits, t = CountingBits(np.random.default_rng(42)), Fraction(64)
    sizes, work = _work_by_size(lambda: bits.discrete_laplace(t), 64.0, 4000, bits)
    small, large = work[sizes < 1].mean(), work[sizes >= 3].mean()
    # each further scale of |Y| is one more Bernoulli(e^−1) in the accepted round: about 3 more uniforms (slope)
    assert large - small > 3.0, (small, large)
    slope = np.polyfit(sizes, work, 1)[0]
    assert slope > 1.0, slope  # what an attacker who times a release reads |noise| from


def test_a_discrete_gaussian_draw_costs_more_work_the_larger_the_noise():
    bits, sigma2 = CountingBits(np.random.default_rng(43)), Fraction(100**2)
    sizes, work = _work_by_size(lambda: bits.discrete_gaussian(sigma2), 100.0, 4000, bits)
    small, large = np.median(work[sizes < 0.5]), np.median(work[sizes >= 2])
    assert large > small + 2, (small, large)


def test_the_module_documents_the_timing_side_channel():
    doc = _discrete.__doc__ or ""
    assert "Timing side channel" in doc and "not constant-time" in doc
    assert "benchmarks/discrete_sampler_timing.py" in doc
    assert "not constant-time" in (Bits.discrete_laplace.__doc__ or "").lower()
    assert "not constant-time" in (Bits.discrete_gaussian.__doc__ or "").lower()


@pytest.mark.slow
def test_the_wall_time_grows_with_the_noise():
    """Wall time (slow: a shared machine's load blurs it): a draw of |Y| >= 3t takes longer than one of |Y| < t."""
    import time

    bits, t = Bits(None), Fraction(1024)
    sizes, times = np.empty(20_000), np.empty(20_000)
    for i in range(sizes.size):
        start = time.perf_counter_ns()
        sizes[i] = abs(bits.discrete_laplace(t)) / 1024
        times[i] = time.perf_counter_ns() - start
    assert np.median(times[sizes >= 3]) > 1.3 * np.median(times[sizes < 1])

"""The δ that a Gaussian noise sampler's cut tail adds to a guarantee (numpy / scipy only).

A floating-point Gaussian sampler cannot produce every value. featuredp's samplers
(:mod:`featuredp.noise`) draw coordinates in pairs with the Box–Muller transform, whose pair
radius is √(−2 ln u) for a radius uniform u; the smallest u the sampler can produce,
``tail_mass_per_pair`` = u_min, caps the radius at R = √(−2 ln u_min), and an ideal pair of
N(0, 1) coordinates leaves that disc with probability exactly e^{−R²/2} = u_min.

**The bound.** Draw the ideal Gaussians and the real sampler from the same uniforms: a real
pair equals the ideal one unless the ideal radius exceeds R (the real one is then R). That
event depends on the noise alone, never on the data, so over a run that draws P pairs in all
the real run's whole transcript (adaptive steps included) equals the ideal one outside an
event of probability η ≤ P·u_min, for every dataset. For any set S of outcomes and neighbours D, D′:
P[real(D) ∈ S] ≤ P[ideal(D) ∈ S] + η ≤ e^ε P[ideal(D′) ∈ S] + δ + η ≤ e^ε P[real(D′) ∈ S] + δ + (1 + e^ε)·η.
So a run whose ideal version is (ε, δ)-DP is (ε, δ + (1 + e^ε)·η)-DP as sampled:
:func:`sampler_tail_delta`. The factor e^ε is real: an attacker who sees a value the sampler
cannot produce without the record wins outright (the old float32 sampler, :func:`bounded_sampler_delta`).

**What it does not cover.** The floating-point granularity of the noise (Mironov, CCS 2012;
Jin et al., S&P 2022): the real uniforms lie on a 2⁻⁵³ grid and the normals are rounded, so the
real noise is a discrete distribution, not the ideal one with a cut tail. The bound treats the
uniforms as exact; :mod:`featuredp.noise` says what drawing and adding in float64 does about the rest.

>>> round(sampler_max_radius(TAIL_MASS_PER_PAIR), 2)
13.22
>>> sampler_tail_delta(0.0, steps=1, dimension=4, tail_mass_per_pair=0.25)  # 2 pairs: η = 0.5, (1 + 1)·η
1.0
"""

from __future__ import annotations

import math

from scipy import stats

__all__ = [
    "MAX_TAIL_FRACTION",
    "TAIL_MASS_PER_PAIR",
    "bounded_sampler_delta",
    "check_sampler_tail",
    "sampler_max_radius",
    "sampler_tail_delta",
    "sampler_tail_mass",
]

#: The cut tail per pair of featuredp's noise transform (:data:`featuredp.noise.TAIL_MASS_PER_PAIR`, which
#: imports torch, hence the copy; a test keeps the two equal): its smallest radius uniform, 2⁻¹²⁶.
TAIL_MASS_PER_PAIR = 2.0**-126

#: The largest share of the user's δ that the sampler's tail may take before a run is refused.
MAX_TAIL_FRACTION = 0.01


def _check_mass(tail_mass_per_pair: float) -> float:
    u = float(tail_mass_per_pair)
    if not 0.0 < u <= 1.0:
        raise ValueError(f"tail_mass_per_pair must be in (0, 1], got {tail_mass_per_pair!r}")
    return u


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def sampler_max_radius(tail_mass_per_pair: float = TAIL_MASS_PER_PAIR) -> float:
    """The largest pair radius (in noise standard deviations) of a Box–Muller sampler whose smallest
    radius uniform is ``tail_mass_per_pair``: √(−2 ln u_min).

    >>> round(sampler_max_radius(2.0**-24), 3)  # CPU torch.randn in float32 (24-bit uniforms)
    5.768
    """
    return math.sqrt(-2.0 * math.log(_check_mass(tail_mass_per_pair)))


def sampler_tail_mass(steps: int, dimension: int, tail_mass_per_pair: float = TAIL_MASS_PER_PAIR) -> float:
    """η: the probability that any of the run's noise pairs falls in the sampler's cut tail, bounded by
    ``steps`` · ⌈``dimension``/2⌉ · ``tail_mass_per_pair`` (``dimension`` = noised coordinates per step).

    >>> sampler_tail_mass(10, 5, 0.001)  # 10 steps of 3 pairs
    0.03
    """
    pairs = _check_count("steps", steps) * -(-_check_count("dimension", dimension) // 2)
    return min(1.0, pairs * _check_mass(tail_mass_per_pair))


def sampler_tail_delta(
    epsilon: float, steps: int, dimension: int, tail_mass_per_pair: float = TAIL_MASS_PER_PAIR
) -> float:
    """The δ the sampler's cut tail adds to an (ε, δ) guarantee: (1 + e^ε)·η (module docstring), ∞ on overflow.

    ``epsilon`` is the ε of the guarantee (the ideal run's); ``steps`` the private steps that drew noise;
    ``dimension`` the coordinates noised per step. No noise drawn (0 steps or 0 coordinates): 0.

    >>> f"{sampler_tail_delta(10.0, steps=1000, dimension=210_400):.2g}"
    '2.7e-26'
    """
    eta = sampler_tail_mass(steps, dimension, tail_mass_per_pair)
    if eta == 0.0:
        return 0.0
    eps = float(epsilon)
    if math.isnan(eps) or eps < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    if eps > 700.0:  # e^ε overflows a float: the bound is vacuous
        return math.inf
    return (1.0 + math.exp(eps)) * eta


def check_sampler_tail(
    epsilon: float,
    delta: float,
    steps: int,
    dimension: int,
    *,
    noise_multiplier: float,
    tail_mass_per_pair: float = TAIL_MASS_PER_PAIR,
    max_fraction: float = MAX_TAIL_FRACTION,
) -> float:
    """:func:`sampler_tail_delta`, refused (ValueError) when it exceeds ``max_fraction`` of ``delta``.

    Raised for a run whose ε is so large (σ so small, or so many steps) that an attacker could win on the
    sampler's cut tail alone; the message names ``noise_multiplier`` and ``steps``.

    >>> check_sampler_tail(2.0, 1e-5, steps=1000, dimension=10**6, noise_multiplier=1.0) < 1e-20
    True
    """
    extra = sampler_tail_delta(epsilon, steps, dimension, tail_mass_per_pair)
    if extra > max_fraction * delta:
        raise ValueError(
            f"noise_multiplier={noise_multiplier:g} with steps={steps} (epsilon={epsilon:.4g}) would let the noise "
            f"sampler's cut tail (pairs beyond {sampler_max_radius(tail_mass_per_pair):.3g} standard deviations, "
            f"{steps} steps x {dimension} coordinates) add delta {extra:.3g}, over {max_fraction:g} x delta={delta:g}: "
            "raise noise_multiplier (lower target_epsilon) or lower steps (docs/accounting.md, the sampler's tail)"
        )
    return extra


def bounded_sampler_delta(noise_multiplier: float, max_radius: float) -> float:
    """A lower bound on δ, at every ε, of one full-batch Gaussian step whose noise pairs never leave the disc of
    radius ``max_radius`` (in noise standard deviations), e.g. a float32 Box–Muller sampler.

    The neighbour's clipped gradient (norm C, in one pair of coordinates) shifts the release by 1/σ noise
    standard deviations; a release outside the disc around the other neighbour's sum is impossible without the
    record, so δ(ε) ≥ P(‖Z + s‖ > R) − P(‖Z‖ > R) for Z ~ N(0, I₂), ‖s‖ = 1/σ (a noncentral χ² tail; the
    subtracted term covers the ideal mass the sampler moves inside the disc).

    >>> f"{bounded_sampler_delta(0.5, sampler_max_radius(2.0**-24)):.2g}"  # claimed (10, 1e-5) at σ = 0.5
    '0.00014'
    """
    sigma = float(noise_multiplier)
    radius = float(max_radius)
    if not sigma > 0 or math.isinf(sigma):
        raise ValueError(f"noise_multiplier must be > 0 and finite, got {noise_multiplier!r}")
    if not radius > 0:
        raise ValueError(f"max_radius must be > 0, got {max_radius!r}")
    outside = float(stats.ncx2.sf(radius**2, 2, 1.0 / sigma**2))
    return max(0.0, outside - math.exp(-(radius**2) / 2))

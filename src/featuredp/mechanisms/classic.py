"""Classic differentially private mechanisms (numpy only).

Each mechanism is built from (ε, δ, sensitivity), validates them before doing any work,
and takes an explicit random source ``rng``: ``None`` (the default: fresh OS entropy — what a
real release must use), a ``numpy.random.Generator``, or an integer seed. A seed makes the
noise reproducible, so anyone who learns or guesses it subtracts the noise and gets the exact
value back: it is for tests only and warns (``PrivacyRiskWarning``).

* :class:`CoinFlipSurvey` — binary randomized response by coin flips (ε = ln 3 for a fair coin).
* :class:`RandomizedResponse` — k-ary randomized response, keep probability e^ε/(e^ε + k − 1).
* :class:`LaplaceMechanism` — the discrete Laplace on a grid, scale Δ₁/ε (pure ε-DP, exactly).
* :class:`GaussianMechanism` — the discrete Gaussian on a grid, σ from ``method="analytic"`` (Balle & Wang 2018, any
  ε) or ``"classic"`` (σ = Δ₂·sqrt(2 ln(1.25/δ))/ε, valid only for ε < 1), δ the discrete Gaussian's own.

The two additive mechanisms release multiples of a power-of-two grid with noise drawn exactly (integer arithmetic,
:mod:`featuredp.mechanisms._discrete`): the floating-point result fl(value + noise) of the textbook versions leaks the
value through its low bits (Mironov 2012).

* :class:`VectorMechanism` — pure ε-DP for L2 sensitivity Δ₂, released the same way (the discrete Laplace on a grid
  at the L1 sensitivity √d·Δ₂); its ``noise`` is Chaudhuri et al.'s (2011) continuous exp(−β‖b‖₂), β = ε/Δ₂, for
  objective perturbation only.

The exact samplers' running time grows with the noise they draw (a timing side channel: see
:mod:`featuredp.mechanisms._discrete`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import optimize

from featuredp._validate import check_int, check_nonnegative, check_open_unit, check_positive, warn_private_seed
from featuredp.accounting._gaussian import gaussian_delta
from featuredp.mechanisms._discrete import Bits, discrete_gaussian_delta, round_up, zcdp_delta

__all__ = [
    "CoinFlipSurvey",
    "GaussianMechanism",
    "LaplaceMechanism",
    "RandomizedResponse",
    "VectorMechanism",
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
]

RngLike = np.random.Generator | int | None


def _rng(rng: RngLike, *, stacklevel: int = 4) -> np.random.Generator:
    """The generator for ``rng``; an integer seed warns. ``stacklevel`` 4 points at the caller of a public method."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        seed = check_int("rng", rng, minimum=0)
        warn_private_seed("rng", seed, stacklevel=stacklevel)
        return np.random.default_rng(seed)
    raise TypeError(f"rng must be a numpy.random.Generator, an integer seed or None, got {rng!r}")


def _check_pure_delta(delta: object) -> float:
    # A pure ε-DP mechanism satisfies (ε, δ)-DP for every δ >= 0; δ is accepted and recorded only.
    d = check_nonnegative("delta", delta)
    if d >= 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return d


def _values(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return arr


# ------------------------------------------------------------------------------------------ randomized response


@dataclass(frozen=True)
class CoinFlipSurvey:
    """Binary randomized response by coins (Warner 1965): the classic sensitive-survey mechanism.

    Each respondent flips a coin that lands heads with probability ``truth_prob``: on heads
    they answer truthfully; on tails they flip a fair coin and answer "yes" on heads. So
    P(yes | yes) = t + (1 − t)/2 and P(yes | no) = (1 − t)/2, and ε = ln((1 + t)/(1 − t))
    (ln 3 for a fair first coin). The unbiased estimate of the true "yes" rate is
    (p_obs − (1 − t)/2)/t, i.e. 2·p_obs − 1/2 for a fair coin.

    >>> survey = CoinFlipSurvey()  # fair first coin
    >>> round(survey.epsilon, 4)  # ln 3
    1.0986
    >>> survey.estimate([1, 1, 1, 0])  # 75% "yes" observed: 2·0.75 − 1/2
    1.0
    """

    truth_prob: float = 0.5

    def __post_init__(self) -> None:
        check_open_unit("truth_prob", self.truth_prob)

    @classmethod
    def from_epsilon(cls, epsilon: float, delta: float = 0.0, sensitivity: float = 1.0) -> CoinFlipSurvey:
        """The survey with the given ε (truth_prob = (e^ε − 1)/(e^ε + 1)); δ and sensitivity are trivial here."""
        epsilon = check_positive("epsilon", epsilon)
        _check_pure_delta(delta)
        if check_positive("sensitivity", sensitivity) != 1.0:
            raise ValueError(f"sensitivity of a yes/no answer is 1, got sensitivity={sensitivity!r}")
        return cls(truth_prob=math.tanh(epsilon / 2))

    @property
    def epsilon(self) -> float:
        """ε = ln(P(yes | yes)/P(yes | no))."""
        t = self.truth_prob
        return math.log((1 + t) / (1 - t))

    def randomize(self, answers: Any, rng: RngLike = None) -> np.ndarray:
        """Randomised yes/no answers (bool array) for the true ``answers`` (bool array)."""
        a = np.asarray(answers)
        if a.dtype != bool:
            if not np.all(np.isin(a, (0, 1))):
                raise ValueError("answers must be booleans or 0/1 values")
            a = a.astype(bool)
        g = _rng(rng)
        truthful = g.random(a.shape) < self.truth_prob
        coin = g.random(a.shape) < 0.5
        return np.where(truthful, a, coin)

    def estimate(self, responses: Any) -> float:
        """Unbiased estimate of the true "yes" rate from the randomised responses."""
        r = np.asarray(responses, dtype=float)
        if r.size == 0:
            raise ValueError("responses must not be empty")
        t = self.truth_prob
        return float((r.mean() - (1 - t) / 2) / t)


@dataclass(frozen=True)
class RandomizedResponse:
    """k-ary randomized response: keep the true value w.p. e^ε/(e^ε + k − 1), else report one of the other k − 1.

    >>> import math
    >>> RandomizedResponse(epsilon=math.log(3), k=2).keep_prob
    0.75
    >>> RandomizedResponse(epsilon=1.0, k=4).randomize([0, 1, 2, 3]).shape
    (4,)
    """

    epsilon: float
    k: int
    delta: float = 0.0
    keep_prob: float = field(init=False)

    def __post_init__(self) -> None:
        eps = check_positive("epsilon", self.epsilon)
        k = check_int("k", self.k, minimum=2)
        _check_pure_delta(self.delta)
        object.__setattr__(self, "keep_prob", 1.0 / (1.0 + (k - 1) * math.exp(-eps)))

    def randomize(self, values: Any, rng: RngLike = None) -> np.ndarray:
        """Randomised reports (int array) for true ``values`` in {0, ..., k − 1}."""
        v = np.asarray(values)
        if v.size and (not np.issubdtype(v.dtype, np.integer) or v.min() < 0 or v.max() >= self.k):
            raise ValueError(f"values must be integers in [0, {self.k - 1}]")
        g = _rng(rng)
        keep = g.random(v.shape) < self.keep_prob
        # a uniform *other* value: shift by 1..k-1 modulo k
        other = (v + g.integers(1, self.k, size=v.shape)) % self.k
        return np.where(keep, v, other).astype(np.int64)

    def estimate_frequencies(self, reports: Any) -> np.ndarray:
        """Unbiased estimates of the true frequencies of each value (may fall outside [0, 1])."""
        r = np.asarray(reports)
        if r.size == 0:
            raise ValueError("reports must not be empty")
        observed = np.bincount(r.astype(np.int64).ravel(), minlength=self.k)[: self.k] / r.size
        p = self.keep_prob
        q = (1 - p) / (self.k - 1)
        return (observed - q) / (p - q)


# ------------------------------------------------------------------------------------------ additive noise


#: outputs are multiples of a grid Λ, a power of two about 2^-GRID_BITS of the noise scale: rounding costs ~0.1 %
GRID_BITS = 10
#: values are clamped to ±2^CLAMP_BITS grid steps (1-Lipschitz: the sensitivity holds) so that every output,
#: an integer times Λ, is exact in float64
CLAMP_BITS = 50


def _grid(scale: float) -> float:
    """The power of two Λ with 2^GRID_BITS <= scale/Λ < 2^(GRID_BITS+1)."""
    return math.ldexp(1.0, math.floor(math.log2(scale)) - GRID_BITS)


def _on_grid(v: np.ndarray, grid: float) -> list[int]:
    """Each value's nearest multiple of ``grid`` (ties up), in grid units, clamped to ±2^CLAMP_BITS.

    v/Λ is exact (Λ is a power of two) and so is x − floor(x): |r(a) − r(b)| <= ⌈|a − b|/Λ⌉ for every a, b.
    """
    x = np.clip(v / grid, -(2.0**CLAMP_BITS), 2.0**CLAMP_BITS)
    low = np.floor(x)
    return [int(lo) + int(frac >= 0.5) for lo, frac in zip(low.ravel(), (x - low).ravel())]


def _bits(rng: RngLike) -> Bits:
    """OS entropy (``secrets``) for rng None; a given Generator or seed (warned) for reproducible tests."""
    return Bits(None if rng is None else _rng(rng, stacklevel=5))


def _out(units: list[int], grid: float, shape: tuple[int, ...]) -> Any:
    out = (np.array(units, dtype=np.float64) * grid).reshape(shape)  # |units| < 2^53: exact
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class LaplaceMechanism:
    """Discrete Laplace noise on a grid: ε-DP for queries with L1 sensitivity Δ₁, with no floating-point leak.

    The textbook fl(value + Laplace(Δ₁/ε)) is porous: its low bits depend on the value (Mironov 2012). Here each
    coordinate is rounded to the nearest multiple of the grid Λ (:attr:`grid`, a power of two near Δ₁/(ε·1024)),
    clamped to ±2^50·Λ, and given discrete Laplace noise Λ·Y, P(Y = y) ∝ exp(−|y|/t), drawn exactly with integer
    arithmetic from OS entropy (Canonne, Kamath & Steinke 2020). On the grid the L1 sensitivity is at most
    K = ⌈Δ₁/Λ⌉ + d − 1 for d coordinates, and t = ⌈K/ε⌉ (an integer), so the release is K/t <= ε-DP, i.e.
    ε-DP exactly (the guarantee is ``epsilon``, never more). d > 1 coordinates use the finer grid Λ_d =
    :meth:`grid_for` (d) in place of Λ. Every output is a multiple of Λ (Λ_d); the noise's sd is about √2·Δ₁/ε,
    larger by the factor t·Λ_d·ε/Δ₁ <= 1 + (1 + 1/ε)/1024 (the rounding of K and of t).

    >>> LaplaceMechanism(epsilon=0.5, sensitivity=1.0).scale
    2.0
    >>> LaplaceMechanism(epsilon=0.5, sensitivity=1.0).grid
    0.001953125
    """

    epsilon: float
    sensitivity: float = 1.0
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_positive("sensitivity", self.sensitivity)
        _check_pure_delta(self.delta)

    @property
    def scale(self) -> float:
        """The Laplace scale b = Δ₁/ε (the discrete noise's, in value units, up to the grid's rounding)."""
        return self.sensitivity / self.epsilon

    @property
    def grid(self) -> float:
        """Λ: every output is a multiple of it."""
        return _grid(self.scale)

    def grid_for(self, size: int = 1) -> float:
        """The grid of a release of ``size`` coordinates: Λ/2^⌈log₂ size⌉, so that rounding d coordinates adds at
        most about Λ to the L1 sensitivity (Λ itself for a scalar)."""
        return math.ldexp(self.grid, -math.ceil(math.log2(max(1, int(size)))))

    def grid_scale(self, size: int = 1) -> Fraction:
        """t, the discrete Laplace parameter in grid units for ``size`` coordinates: >= (⌈Δ₁/Λ_d⌉ + size − 1)/ε."""
        k = math.ceil(self.sensitivity / self.grid_for(size)) + int(size) - 1
        return Fraction(math.ceil(Fraction(k) / Fraction(self.epsilon)))  # an integer t: ε·(1 − O(1/t)) at most

    def release(self, value: Any, rng: RngLike = None) -> Any:
        """``value`` (scalar or array) on the grid plus independent discrete Laplace noise per coordinate."""
        v = _values("value", value)
        size = max(1, v.size)
        bits, t, grid = _bits(rng), self.grid_scale(size), self.grid_for(size)
        return _out([r + bits.discrete_laplace(t) for r in _on_grid(v, grid)], grid, v.shape)


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """σ = Δ₂·sqrt(2 ln(1.25/δ))/ε (Dwork & Roth, Thm A.1) — valid only for ε < 1.

    >>> round(classic_gaussian_sigma(0.5, 1e-5), 3)
    9.69
    """
    epsilon = check_positive("epsilon", epsilon)
    delta = check_open_unit("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    if epsilon >= 1:
        raise ValueError(
            f"the classic Gaussian calibration holds only for epsilon < 1, got epsilon={epsilon!r}; "
            "use method='analytic' (Balle & Wang 2018), which is valid for every epsilon and needs less noise"
        )
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest σ with δ(ε) = Φ(−εσ/Δ + Δ/2σ) − e^ε Φ(−εσ/Δ − Δ/2σ) <= δ (Balle & Wang 2018).

    >>> round(analytic_gaussian_sigma(1.0, 1e-5), 3)  # any ε; the classic formula needs ε < 1
    3.731
    """
    epsilon = check_positive("epsilon", epsilon)
    delta = check_open_unit("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)

    def excess(mu: float) -> float:  # δ(ε) at μ = Δ/σ minus the target; increasing in μ
        return gaussian_delta(epsilon, mu) - delta

    lo, hi = 1e-8, 1.0
    while excess(hi) < 0:
        hi *= 2
    mu = optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=1e-14)
    # μ must not exceed the root (σ never too small): shrink until the guarantee holds exactly.
    while excess(mu) > 0:
        mu *= 1 - 1e-12
    return sensitivity / mu


@dataclass(frozen=True)
class GaussianMechanism:
    """Discrete Gaussian noise on a grid: (ε, δ)-DP for queries with L2 sensitivity Δ₂, with no floating-point leak.

    ``method="analytic"`` (default; Balle & Wang 2018) or ``"classic"`` (the textbook σ, refuses ε >= 1) gives the
    continuous σ; the grid Λ (:attr:`grid`) is a power of two near σ/1024. Each coordinate is rounded to the nearest
    multiple of Λ, clamped to ±2^50·Λ, and given noise Λ·Y with Y ~ N_Z(0, σ_Z²), the discrete Gaussian, drawn
    exactly with integer arithmetic from OS entropy (Canonne, Kamath & Steinke 2020). The guarantee:

    * a scalar: the grid sensitivity is the integer ⌈Δ₂/Λ⌉ and δ(ε) is the discrete Gaussian's own (CKS Theorem 7:
      P[Y > εσ_Z²/Δ − Δ/2] − e^ε P[Y > εσ_Z²/Δ + Δ/2], summed over |y| <= εσ_Z²/Δ + Δ + 40σ_Z); σ_Z is the
      smallest (up to 1e-6) with δ(ε) <= ``delta``, so :attr:`sigma` = Λ·σ_Z is the analytic σ for the sensitivity
      Λ·⌈Δ₂/Λ⌉ (at most a factor 1 + Λ/Δ₂ above the analytic σ, under 1 % at every ε);
    * d > 1 coordinates, on the finer grid Λ_d = :meth:`grid_for` (d): the grid L2 sensitivity is at most
      Δ₂/Λ_d + √d, the discrete Gaussian is ρ-zCDP with
      ρ = Δ²/(2σ_Z²) (CKS Theorem 14) and δ(ε) is bounded by the zCDP conversion (CKS Corollary 13): a stated upper
      bound, so :meth:`sigma_for` (d) is somewhat larger than :attr:`sigma`.

    Every output is a multiple of Λ (of Λ_d for d coordinates).

    >>> mech = GaussianMechanism(epsilon=1.0, delta=1e-5)
    >>> round(mech.sigma, 3)
    3.731
    """

    epsilon: float
    delta: float
    sensitivity: float = 1.0
    method: str = "analytic"
    sigma: float = field(init=False)
    grid: float = field(init=False)

    def __post_init__(self) -> None:
        if self.method not in ("analytic", "classic"):
            raise ValueError(f"method must be 'analytic' or 'classic', got {self.method!r}")
        f = analytic_gaussian_sigma if self.method == "analytic" else classic_gaussian_sigma
        continuous = f(self.epsilon, self.delta, self.sensitivity)
        object.__setattr__(self, "grid", _grid(continuous))
        object.__setattr__(self, "sigma", self.sigma_for(1, start=continuous))

    @property
    def noise_multiplier(self) -> float:
        """σ/Δ₂: the ``GaussianDpEvent`` noise multiplier of one (scalar) release."""
        return self.sigma / self.sensitivity

    def grid_for(self, size: int = 1) -> float:
        """The grid of a release of ``size`` coordinates: Λ/2^⌈log₂ √size⌉, so that rounding d coordinates adds at
        most about Λ to the L2 sensitivity (Λ itself for a scalar)."""
        return math.ldexp(self.grid, -math.ceil(math.log2(math.sqrt(max(1, int(size))))))

    def sigma_for(self, size: int, *, start: float | None = None) -> float:
        """The σ (value units, Λ_d·σ_Z) that a release of ``size`` coordinates uses for (ε, δ) (see the class)."""
        return _discrete_sigma(self.epsilon, self.delta, self.sensitivity, self.grid_for(size), int(size),
                               start or getattr(self, "sigma", None) or self.grid)  # fmt: skip

    def release(self, value: Any, rng: RngLike = None) -> Any:
        """``value`` (scalar or array) on the grid plus independent discrete Gaussian noise per coordinate."""
        v = _values("value", value)
        size = max(1, v.size)
        bits, grid = _bits(rng), self.grid_for(size)
        sigma2 = round_up((self.sigma_for(size) / grid) ** 2)
        return _out([r + bits.discrete_gaussian(sigma2) for r in _on_grid(v, grid)], grid, v.shape)


@functools.lru_cache(maxsize=256)
def _discrete_sigma(epsilon: float, delta: float, sensitivity: float, grid: float, size: int, start: float) -> float:
    """The smallest σ = Λ·σ_Z (relative precision 1e-6) whose discrete Gaussian release of ``size`` grid-rounded
    coordinates is (ε, δ)-DP; bisection between a σ that fails and one that meets it."""
    if size == 1:
        sens = math.ceil(sensitivity / grid)

        def excess(s: float) -> float:
            return discrete_gaussian_delta(epsilon, s, sens) - delta
    else:
        l2 = sensitivity / grid + math.sqrt(size)

        def excess(s: float) -> float:
            return zcdp_delta(epsilon, l2**2 / (2 * s**2)) - delta

    lo = hi = start / grid
    while excess(hi) > 0:
        hi *= 1.01
    while excess(lo) <= 0 and lo > 1:
        lo /= 1.01
    if excess(lo) <= 0:
        return lo * grid
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if excess(mid) <= 0 else (mid, hi)
    return hi * grid


def _ceil_sqrt_times(dim: int, ratio: Fraction) -> int:
    """⌈√dim·ratio⌉ exactly (ratio >= 0): the smallest k with k² >= dim·ratio², in integers."""
    need = math.ceil(dim * ratio * ratio)
    return 0 if need <= 0 else math.isqrt(need - 1) + 1


@dataclass(frozen=True)
class VectorMechanism:
    """Pure ε-DP release of vector queries with L2 sensitivity Δ₂: discrete Laplace noise on a grid, sampled exactly.

    :meth:`release` of a d-vector rounds each coordinate to the nearest multiple of the grid Λ_d (:meth:`grid_for`,
    a power of two near √d·Δ₂/(ε·1024·d)), clamps it to ±2^50·Λ_d and adds independent discrete Laplace noise Λ_d·Y,
    P(Y = y) ∝ exp(−|y|/t), drawn exactly with integer arithmetic from OS entropy, as :class:`LaplaceMechanism`
    does. On the grid the L1 sensitivity is at most K = ⌈√d·Δ₂/Λ_d⌉ + d − 1 (‖x‖₁ <= √d·‖x‖₂; rounding adds less
    than one step per coordinate) and t = ⌈K/ε⌉ (:meth:`grid_scale`), so the release is K/t <= ε-DP exactly, with no
    δ and no floating-point leak: every output is a multiple of Λ_d.

    The noise is not Chaudhuri, Monteleoni & Sarwate's (2011) density ∝ exp(−β‖b‖₂), β = ε/Δ₂: their continuous
    noise added in floating point is porous (Mironov 2012; ε = 1 does not hold), and we have no exact sampler of its
    lattice version. The price: E‖noise‖₂² ≈ 2d²(Δ₂/ε)² against d(d + 1)(Δ₂/ε)², a noise norm √(2d/(d + 1)) times
    larger (1 for d = 1, under √2 for every d), times the grid's factor <= 1 + (1 + 1/ε)/1024.

    :meth:`noise` still draws the continuous exp(−β‖b‖₂) noise in float64, for objective perturbation
    (:mod:`featuredp.erm`), where it is a term of the objective. It is not a release: fl(value + noise) is not
    ε-DP.

    >>> VectorMechanism(epsilon=1.0).noise(3, size=2).shape
    (2, 3)
    >>> VectorMechanism(epsilon=1.0).grid_for(4)  # the grid of a Laplace scale 2 (2^-9), over 4
    0.00048828125
    """

    epsilon: float
    sensitivity: float = 1.0
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_positive("sensitivity", self.sensitivity)
        _check_pure_delta(self.delta)

    @property
    def beta(self) -> float:
        """The rate β = ε/Δ₂ of the continuous noise density of :meth:`noise`."""
        return self.epsilon / self.sensitivity

    def grid_for(self, dim: int) -> float:
        """Λ_d, the grid of a release of ``dim`` coordinates: the grid of a Laplace scale √d·Δ₂/ε, over 2^⌈log₂ d⌉."""
        dim = check_int("dim", dim, minimum=1)
        return math.ldexp(_grid(math.sqrt(dim) * self.sensitivity / self.epsilon), -math.ceil(math.log2(dim)))

    def grid_scale(self, dim: int) -> Fraction:
        """t, the discrete Laplace parameter in grid units for ``dim`` coordinates: ⌈K/ε⌉, K = ⌈√d·Δ₂/Λ_d⌉ + d − 1."""
        dim = check_int("dim", dim, minimum=1)
        k = _ceil_sqrt_times(dim, Fraction(self.sensitivity) / Fraction(self.grid_for(dim))) + dim - 1
        return Fraction(math.ceil(Fraction(k) / Fraction(self.epsilon)))

    def noise(self, dim: int, size: int | None = None, rng: RngLike = None) -> np.ndarray:
        """Continuous noise vectors in float64 with density ∝ exp(−β‖b‖₂): shape (dim,) or (size, dim).

        ‖b‖ ~ Gamma(shape d, scale 1/β) and b/‖b‖ is uniform on the sphere. For objective perturbation only: adding
        these to a value in floating point leaks the value through the low bits (Mironov 2012); use :meth:`release`.
        """
        dim = check_int("dim", dim, minimum=1)
        n = 1 if size is None else check_int("size", size, minimum=1)
        g = _rng(rng)
        direction = g.standard_normal((n, dim))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        norms = g.gamma(shape=dim, scale=1.0 / self.beta, size=(n, 1))
        b = direction * norms
        return b[0] if size is None else b

    def release(self, value: Any, rng: RngLike = None) -> np.ndarray:
        """``value`` (a 1-d vector) on the grid Λ_d plus independent exact discrete Laplace noise per coordinate."""
        v = _values("value", value)
        if v.ndim != 1 or v.size == 0:
            raise ValueError(f"value must be a non-empty 1-d vector, got shape {v.shape}")
        dim = v.shape[0]
        bits, t, grid = _bits(rng), self.grid_scale(dim), self.grid_for(dim)
        return np.asarray(_out([r + bits.discrete_laplace(t) for r in _on_grid(v, grid)], grid, v.shape))

"""Calibration: the noise multiplier or the number of steps for a target (ε, δ).

Guarantees (checked against the same accountant the user would call afterwards):
the returned setting never exceeds the target ε, and does not waste it — the
achieved ε is at least ``(1 − tolerance)·target`` (default tolerance 1%).

Speed: with the PLD backend the search first runs on a coarse (cheap, still
pessimistic) discretisation to land near the answer, then finishes with the
accountant's full precision; a secant step in log–log space converges in a few
evaluations because log ε is nearly linear in log σ and in log T.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from featuredp._validate import (
    check_int,
    check_open_unit,
    check_positive,
    check_sampling_rate,
)
from featuredp.accounting._gaussian import gaussian_epsilon
from featuredp.accounting.accountant import (
    DEFAULT_RTOL,
    MAX_PLD_STEPS,
    _Atom,
    _pld_epsilon_fixed,
    _rdp_estimate,
    compute_epsilon,
    pld_refusal,
)
from featuredp.accounting.events import check_accountant, check_relation, dpsgd_event
from featuredp.errors import UnreachableTargetError

_SIGMA_MIN = 1e-3
_SIGMA_MAX = 1e4
_MAX_EVALS = 60


def _coarse_relative(steps: int) -> float:
    """Coarse-phase interval relative to the target ε: ≈ 1–3% pessimistic and cheap (cf. relative_interval)."""
    return min(1e-2, 0.1 / math.sqrt(max(1, steps)))


def _epsilon(sigma: float, p: float, steps: int, delta: float, relation: str, accountant: str, rtol: float) -> float:
    return compute_epsilon(dpsgd_event(sigma, p, steps), delta, relation=relation, accountant=accountant, rtol=rtol)


def _secant_sigma(
    f: Callable[[float], float],
    target: float,
    aim: float,
    start: float,
    tolerance: float,
    slope: float = -1.0,
) -> tuple[float, float] | None:
    """Find σ with (1 − tolerance)·target <= f(σ) <= target for a decreasing f.

    Secant steps in (log σ, log ε) aimed at ``aim``; before a bracket exists the step
    uses the last secant slope (or ``slope``), clamped to a factor 2. Returns the
    smallest feasible (σ, f(σ)) seen, or None if σ would have to exceed _SIGMA_MAX.
    """
    lo: tuple[float, float] | None = None  # infeasible: ε > target
    hi: tuple[float, float] | None = None  # feasible: ε <= target
    last: tuple[float, float] | None = None
    x = min(_SIGMA_MAX, max(_SIGMA_MIN, start))
    for _ in range(_MAX_EVALS):
        e = f(x)
        if e <= target:
            if hi is None or x < hi[0]:
                hi = (x, e)
            if e >= (1 - tolerance) * target:
                return hi
        elif lo is None or x > lo[0]:
            lo = (x, e)
        if last is not None and e > 0 and last[1] > 0 and last[1] != e and last[0] != x and math.isfinite(e):
            s = (math.log(e) - math.log(last[1])) / (math.log(x) - math.log(last[0]))
            if s < 0:
                slope = s
        last = (x, e)
        if lo is not None and hi is not None:
            if hi[0] - lo[0] <= 1e-9 * hi[0]:
                return hi
            (x0, e0), (x1, e1) = lo, hi
            if math.isfinite(e0) and e0 > e1 > 0:
                s = (math.log(e1) - math.log(e0)) / (math.log(x1) - math.log(x0))
                nx = math.exp(math.log(x1) + (math.log(aim) - math.log(e1)) / s)
            else:
                nx = math.sqrt(x0 * x1)
            # stay strictly inside the bracket, away from its ends (guards against slow one-sided convergence)
            span = math.log(x1 / x0)
            x = x0 * math.exp(min(max(math.log(nx / x0), 0.05 * span), 0.95 * span))
        else:
            if not math.isfinite(e):
                x = x * 4
            else:
                step = (math.log(aim) - math.log(max(e, 1e-300))) / slope
                x = x * math.exp(min(max(step, -math.log(2)), math.log(2)))
            if x > _SIGMA_MAX:
                if last[0] >= _SIGMA_MAX:
                    return None
                x = _SIGMA_MAX
            x = max(x, _SIGMA_MIN)
            if lo is None and last[0] <= _SIGMA_MIN:
                return hi
    return hi


def _clt_start(target: float, delta: float, p: float, steps: int, sensitivity: float) -> float:
    """A first guess of σ from the CLT (μ-GDP) approximation μ ≈ p·sqrt(T·(e^{(Δ/σ)²} − 1))."""
    lo, hi = 1e-6, 1e3
    for _ in range(100):  # bisection on μ: gaussian_epsilon is decreasing in 1/μ
        mu = math.sqrt(lo * hi)
        if gaussian_epsilon(delta, mu) > target:
            hi = mu
        else:
            lo = mu
    mu = lo
    x = (mu / (p * math.sqrt(steps))) ** 2
    if x <= 0 or not math.isfinite(x):
        return 1.0
    sigma = sensitivity / math.sqrt(math.log1p(x))
    return min(_SIGMA_MAX, max(_SIGMA_MIN, sigma))


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    tolerance: float = 0.01,
) -> float:
    """The noise multiplier σ at which ``steps`` steps at ``sampling_rate`` give ε <= ``target_epsilon`` at ``delta``.

    The achieved ε (by ``compute_epsilon`` with the same relation/accountant) is in
    ``[(1 − tolerance)·target, target]``. Raises ``UnreachableTargetError`` when even
    σ = 10⁴ does not reach the target, and ``ValueError`` up front for more than
    :data:`~featuredp.accounting.accountant.MAX_PLD_STEPS` Poisson-subsampled steps with the PLD
    backend (use ``accountant="rdp"``).

    >>> from featuredp.accounting import epsilon_for
    >>> sigma = calibrate_noise_multiplier(1.0, 1e-5, 1.0, 1)  # one full-batch release: closed form
    >>> round(sigma, 2)
    3.74
    >>> 0.99 <= epsilon_for(sigma, 1.0, 1, 1e-5) <= 1.0
    True
    """
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_open_unit("delta", delta)
    p = check_sampling_rate("sampling_rate", sampling_rate)
    steps = check_int("steps", steps, minimum=1)
    relation = check_relation(relation)
    accountant = check_accountant(accountant)
    tolerance = check_open_unit("tolerance", tolerance)
    if accountant == "pld" and p < 1 and (reason := pld_refusal((_Atom(1.0, p, steps),))) is not None:
        raise ValueError(reason)  # before the search: each evaluation would take minutes
    aim = target * (1 - tolerance / 3)
    sens = 2.0 if relation == "replace-one" else 1.0

    cache: dict[float, float] = {}

    def fine(s: float) -> float:
        if s not in cache:
            cache[s] = _epsilon(s, p, steps, delta, relation, accountant, DEFAULT_RTOL)
        return cache[s]

    start, slope = _clt_start(target, delta, p, steps, sens), -1.0
    if accountant == "pld" and p < 1:
        # Coarse-to-fine. A pessimistic PLD at one fixed interval is an upper bound at any interval;
        # at the coarse interval (≈ ε·0.1/√T) it is ≈1–3% pessimistic but cheap, and the ratio fine/coarse barely
        # moves with σ. So: solve on coarse, measure the ratio once with the fine accountant, solve
        # coarse·ratio (cheap), and let the fine accountant confirm (usually one evaluation).
        coarse_interval = target * _coarse_relative(steps) * sens

        def coarse(s: float) -> float:
            return _pld_epsilon_fixed((_Atom(s, p, steps),), 0.0, relation, delta, coarse_interval)

        found = _secant_sigma(coarse, target, aim, start, tolerance)
        if found is not None:
            ratio = fine(found[0]) / found[1]
            if ratio > 0 and math.isfinite(ratio):
                found = _secant_sigma(lambda s: coarse(s) * ratio, target, aim, found[0], tolerance / 2)
            if found is not None:
                start = found[0]
    # The last phase runs on exactly the public accountant (compute_epsilon with its default
    # precision), so the returned σ is verified by the function users call: it never overshoots.
    found = _secant_sigma(fine, target, aim, start, tolerance, slope)
    if found is None:
        eps_max = fine(_SIGMA_MAX)
        fix = "fewer"
        if steps > 1:  # say which number of steps would reach the target at the largest noise we consider
            with contextlib.suppress(UnreachableTargetError):
                n = calibrate_steps(target, delta, p, _SIGMA_MAX, relation=relation, accountant=accountant)
                fix = f"at most {n}"
        raise UnreachableTargetError(
            f"target_epsilon={target_epsilon} is not reachable: even noise_multiplier={_SIGMA_MAX:g} gives "
            f"epsilon={eps_max:.4g} for steps={steps}; use "
            + (f"{fix} steps, " if steps > 1 else "")
            + f"a smaller sampling_rate (sampling_rate={p}) or a larger target_epsilon"
        )
    return float(found[0])


def calibrate_steps(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    noise_multiplier: float,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    max_steps: int = 10**8,
) -> int:
    """The largest number of steps T with ε(T) <= ``target_epsilon`` (capped at ``max_steps``).

    With the PLD backend and ``sampling_rate`` < 1 the cap is at most
    :data:`~featuredp.accounting.accountant.MAX_PLD_STEPS` (10⁷): more steps would take minutes to
    account; ``accountant="rdp"`` has no such cap.

    Raises ``UnreachableTargetError`` when even one step exceeds the target; the
    message names the noise multiplier that one step would need.

    >>> calibrate_steps(10.0, 1e-5, 1.0, 5.0)  # full-batch steps at σ = 5
    100
    """
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_open_unit("delta", delta)
    p = check_sampling_rate("sampling_rate", sampling_rate)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    relation = check_relation(relation)
    accountant = check_accountant(accountant)
    max_steps = check_int("max_steps", max_steps, minimum=1)
    if accountant == "pld" and p < 1:
        max_steps = min(max_steps, MAX_PLD_STEPS)
        # RDP bounds ε from above: if it allows max_steps, so does PLD, and no PLD of ~10^7 steps (minutes) is needed.
        if relation == "add-remove" and _rdp_estimate((_Atom(sigma, p, max_steps),), 0.0, delta) <= target:
            return max_steps

    cache: dict[int, float] = {}

    def f(t: int) -> float:
        if t not in cache:
            cache[t] = _epsilon(sigma, p, t, delta, relation, accountant, DEFAULT_RTOL)
        return cache[t]

    if f(1) > target:
        try:
            need = calibrate_noise_multiplier(target, delta, p, 1, relation=relation, accountant=accountant)
            hint = f"noise_multiplier >= {need:.4g} reaches it in one step"
        except UnreachableTargetError:
            hint = "no noise multiplier up to 1e4 reaches it in one step"
        raise UnreachableTargetError(
            f"target_epsilon={target_epsilon} is not reachable: one step with noise_multiplier={sigma} and "
            f"sampling_rate={p} already gives epsilon={f(1):.4g}; {hint} (or lower sampling_rate)"
        )
    guess = 1
    if accountant == "pld" and p < 1:
        # Coarse-to-fine as for σ: a cheap fixed-interval PLD (its one-step PLD is cached across T)
        # locates T, one fine evaluation measures the fine/coarse ratio, and the ratio-corrected
        # coarse curve predicts the boundary to within a few steps.
        sens = 2.0 if relation == "replace-one" else 1.0

        def coarse(t: int) -> float:
            return _pld_epsilon_fixed((_Atom(sigma, p, t),), 0.0, relation, delta, target * _coarse_relative(t) * sens)

        guess = _largest_below(coarse, target, 1, max_steps)
        # The ratio drifts slowly with T; re-measuring it at the corrected guess lands within a step or two.
        for _ in range(3):
            base = coarse(guess)
            ratio = f(guess) / base if base > 0 else 1.0

            def corrected(t: int, r: float = ratio) -> float:
                return coarse(t) * r

            new = _largest_below(corrected, target, guess, max_steps)
            if new == guess:
                break
            guess = new
    return _largest_below(f, target, guess, max_steps)


def _largest_below(f: Callable[[int], float], target: float, start: int, max_steps: int) -> int:
    """The largest integer T in [1, max_steps] with f(T) <= target, for increasing f with f(1) <= target.

    Starts at ``start`` (a good guess makes this a few evaluations): a log–log secant
    brackets the boundary, then interpolation (bisection when it stalls) closes it.
    """
    lo, hi = 1, max_steps + 1  # f(lo) <= target; hi: f(hi) > target (max_steps + 1 = not yet found)
    t = min(max(start, 1), max_steps)
    prev: tuple[int, float] | None = None
    for _ in range(200):
        e = f(t)
        if e <= target:
            lo = max(lo, t)
        else:
            hi = min(hi, t)
        if hi - lo <= 1:
            break
        if lo == max_steps:
            return max_steps
        # next probe: secant through the last two points (or ε ∝ T^0.5 from one), kept inside (lo, hi)
        if prev is not None and prev[0] != t and prev[1] > 0 and e > 0 and prev[1] != e:
            slope = (math.log(e) - math.log(prev[1])) / (math.log(t) - math.log(prev[0]))
            slope = slope if slope > 0 else 0.5
        else:
            slope = 0.5
        prev = (t, e)
        nxt = t * math.exp((math.log(target) - math.log(e)) / slope) if e > 0 else t * 4.0
        if hi > max_steps:
            nxt = min(nxt, t * 1000.0)
        # aim a hair to the inside of the predicted boundary so one probe usually lands on each side
        nt = math.floor(nxt) if e <= target else math.ceil(nxt) - 1
        nt = int(min(max(nt, lo + 1), hi - 1, max_steps))
        if nt == t or not (lo < nt < hi):
            nt = (lo + min(hi, max_steps + 1)) // 2 if hi - lo > 1 else lo
        if nt in (lo, t):
            nt = lo + 1
        t = nt
    return lo


def scaled_noise(noise_multiplier: float, sensitivity: float) -> float:
    """σ = ``noise_multiplier``·``sensitivity``, rounded up so that σ / sensitivity is never below the multiplier.

    For mechanisms accounted as a Gaussian of multiplier σ / Δ (BandMF, BLT): the event divides again, and a
    rounding down of an ulp or two would put ε above the calibrated target.
    """
    sigma = noise_multiplier * sensitivity
    for _ in range(64):
        if sigma / sensitivity >= noise_multiplier:
            break
        sigma = math.nextafter(sigma, math.inf)
    return sigma

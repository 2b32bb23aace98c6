"""Empirical ε lower bounds from canary audits, and the statistical ceiling of a design.

Two designs:

* **Multi-run** (Jagielski et al. 2020; Nasr et al. 2021): many independent trials,
  each with the canary in or out; an attack threshold gives false positives and
  false negatives. If the mechanism is (ε, δ)-DP then every test satisfies
  ``FPR·e^ε + FNR >= 1 − δ`` and ``FNR·e^ε + FPR >= 1 − δ``, hence with
  Clopper–Pearson upper bounds on both rates
  ``ε >= max(log((1 − δ − FNR_ub)/FPR_ub), log((1 − δ − FPR_ub)/FNR_ub))``.
* **One-run** (Steinke, Nasr, Jagielski 2023, "Privacy auditing with one (1)
  training run", Theorem 3): m canaries each included independently with
  probability ½; the attacker guesses r of them (in/out) and v guesses are correct.
  For an (ε, δ)-DP mechanism
  ``P[V >= v] <= f(v) + 2mδ · max_{i=1..v} (f(v−i) − f(v))/i``,
  ``f(v) = P[Binomial(r, e^ε/(1 + e^ε)) >= v]``. The audit reports the largest ε
  whose p-value is still <= β (so the ε is a lower bound at confidence 1 − β).

Neither design can certify more than its *ceiling*, the bound a perfect attack
would reach; a small lower bound from a weak design proves nothing. The ceilings
are reported with every bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from featuredp._validate import check_int, check_nonnegative, check_open_unit

# --- Clopper–Pearson ----------------------------------------------------------------------------


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided exact (Clopper–Pearson) interval for a binomial proportion.

    Each tail has probability ``(1 − confidence)/2``; the lower end is 0 when
    ``successes == 0`` and the upper end 1 when ``successes == trials``.
    """
    n = check_int("trials", trials, minimum=1)
    k = check_int("successes", successes, minimum=0)
    if k > n:
        raise ValueError(f"successes must be <= trials={n}, got {successes!r}")
    alpha = 1.0 - check_open_unit("confidence", confidence)
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _eps_from_rates(fpr_ub: float, fnr_ub: float, delta: float) -> float:
    """max of both tails of the hypothesis-testing inequality; 0 if nothing is certified."""
    best = 0.0
    for a, b in ((fpr_ub, fnr_ub), (fnr_ub, fpr_ub)):
        num = 1.0 - delta - b
        if num > 0 and a > 0:
            best = max(best, math.log(num / a))
    return best


@dataclass(frozen=True)
class MultiRunBound:
    """Result of a multi-run (Clopper–Pearson) audit."""

    epsilon_lower_bound: float
    threshold: float
    fpr_upper: float
    fnr_upper: float
    n_in: int
    n_out: int
    ceiling: float
    selection: str
    confidence: float
    delta: float

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict."""
        return dict(self.__dict__)


def multi_run_ceiling(n_in: int, n_out: int, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The largest ε a multi-run audit with these trial counts can certify (a perfect attack).

    With no error at all the Clopper–Pearson upper bounds are ``1 − (α/2)^(1/n)``.
    """
    n_in = check_int("n_in", n_in, minimum=1)
    n_out = check_int("n_out", n_out, minimum=1)
    d = check_nonnegative("delta", delta)
    fpr_ub = clopper_pearson(0, n_out, confidence)[1]
    fnr_ub = clopper_pearson(0, n_in, confidence)[1]
    return _eps_from_rates(fpr_ub, fnr_ub, d)


def _bound_at(scores_in: np.ndarray, scores_out: np.ndarray, thr: float, delta: float, conf: float) -> tuple:
    fn = int(np.sum(scores_in < thr))
    fp = int(np.sum(scores_out >= thr))
    fnr_ub = clopper_pearson(fn, scores_in.size, conf)[1]
    fpr_ub = clopper_pearson(fp, scores_out.size, conf)[1]
    return _eps_from_rates(fpr_ub, fnr_ub, delta), fpr_ub, fnr_ub


def _point_eps(scores_in: np.ndarray, scores_out: np.ndarray, thr: float, delta: float) -> float:
    # Threshold selection uses point estimates with a +1/2 continuity correction (never log 0).
    fnr = (np.sum(scores_in < thr) + 0.5) / (scores_in.size + 1)
    fpr = (np.sum(scores_out >= thr) + 0.5) / (scores_out.size + 1)
    return _eps_from_rates(fpr, fnr, delta)


def multi_run_epsilon_lower_bound(
    scores_in: object,
    scores_out: object,
    delta: float = 0.0,
    *,
    confidence: float = 0.95,
    selection: str = "split",
    seed: int = 0,
) -> MultiRunBound:
    """Empirical ε lower bound from scores of trials with the canary in / out.

    Parameters
    ----------
    scores_in, scores_out:
        One attack score per trial (larger = "canary in").
    delta:
        The δ of the claim being audited.
    confidence:
        Confidence of each Clopper–Pearson bound (two-sided interval, so each upper
        bound holds with probability ``1 − (1 − confidence)/2``).
    selection:
        How the threshold is chosen. ``"split"`` (valid): the best threshold is chosen
        on a random half of the trials and certified on the other half.
        ``"max"``: the maximum over all thresholds on all trials — the common
        practice in the literature, *optimistic* because the choice is not corrected
        for. A float string such as ``"0.3"`` fixes the threshold in advance.
    """
    s_in = np.asarray(scores_in, dtype=float).ravel()
    s_out = np.asarray(scores_out, dtype=float).ravel()
    if s_in.size < 2 or s_out.size < 2:
        raise ValueError(f"scores_in and scores_out need >= 2 trials each, got {s_in.size} and {s_out.size}")
    if not (np.all(np.isfinite(s_in)) and np.all(np.isfinite(s_out))):
        raise ValueError("scores_in and scores_out must be finite")
    d = check_nonnegative("delta", delta)
    conf = check_open_unit("confidence", confidence)

    def candidates(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        u = np.unique(np.r_[a, b])
        return np.r_[u, u[-1] + 1.0]

    if selection == "max":
        best = (0.0, math.inf, 1.0, 1.0)
        for thr in candidates(s_in, s_out):
            eps, fpr_ub, fnr_ub = _bound_at(s_in, s_out, thr, d, conf)
            if eps > best[0]:
                best = (eps, thr, fpr_ub, fnr_ub)
        eval_in, eval_out = s_in, s_out
    elif selection == "split":
        rng = np.random.default_rng(seed)
        pin, pout = rng.permutation(s_in.size), rng.permutation(s_out.size)
        sel_in, eval_in = s_in[pin[: s_in.size // 2]], s_in[pin[s_in.size // 2 :]]
        sel_out, eval_out = s_out[pout[: s_out.size // 2]], s_out[pout[s_out.size // 2 :]]
        cands = candidates(sel_in, sel_out)
        point = [_point_eps(sel_in, sel_out, t, d) for t in cands]
        thr = float(cands[int(np.argmax(point))])
        eps, fpr_ub, fnr_ub = _bound_at(eval_in, eval_out, thr, d, conf)
        best = (eps, thr, fpr_ub, fnr_ub)
    else:
        try:
            thr = float(selection)
        except ValueError:
            raise ValueError(f"selection must be 'split', 'max' or a threshold number, got {selection!r}") from None
        eps, fpr_ub, fnr_ub = _bound_at(s_in, s_out, thr, d, conf)
        best = (eps, thr, fpr_ub, fnr_ub)
        eval_in, eval_out = s_in, s_out
    return MultiRunBound(
        epsilon_lower_bound=float(best[0]),
        threshold=float(best[1]),
        fpr_upper=float(best[2]),
        fnr_upper=float(best[3]),
        n_in=int(eval_in.size),
        n_out=int(eval_out.size),
        ceiling=multi_run_ceiling(eval_in.size, eval_out.size, d, conf),
        selection=selection,
        confidence=conf,
        delta=d,
    )


# --- one-run audit (Steinke, Nasr, Jagielski 2023) ------------------------------------------------


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """Upper bound on P[V >= v] for an (ε, δ)-DP mechanism (Steinke et al. 2023, Theorem 3).

    ``m`` canaries, ``r`` guesses, ``v`` correct guesses. Returns a value in [0, 1].
    """
    m = check_int("m", m, minimum=1)
    r = check_int("r", r, minimum=0)
    v = check_int("v", v, minimum=0)
    if not v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    eps = check_nonnegative("epsilon", epsilon, allow_inf=True)
    d = check_nonnegative("delta", delta)
    if d > 1:
        raise ValueError(f"delta must be <= 1, got {delta!r}")
    if v == 0:
        return 1.0
    q = 1.0 if math.isinf(eps) else 1.0 / (1.0 + math.exp(-eps))  # accuracy of ε-randomized response
    tail = float(stats.binom.sf(v - 1, r, q))  # f(v) = P[Binomial(r, q) >= v]
    if d == 0:
        return min(1.0, tail)
    # (f(v − i) − f(v))/i = P[v − i <= W < v]/i: a running sum of the pmf below v.
    pmf_below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[W = v−1], P[W = v−2], ...
    ratio = np.max(np.cumsum(pmf_below) / np.arange(1, v + 1))
    return float(min(1.0, tail + 2.0 * m * d * ratio))


def one_run_epsilon_lower_bound(m: int, r: int, v: int, delta: float = 0.0, beta: float = 0.05) -> float:
    """The largest ε with ``one_run_p_value(m, r, v, ε, δ) <= β`` (0 if even ε = 0 is not rejected).

    The p-value increases with ε (to 1 as ε → ∞), so bisection finds the boundary (to 1e-7
    relative).
    """
    b = check_open_unit("beta", beta)
    if one_run_p_value(m, r, v, 0.0, delta) > b:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) <= b:
        lo, hi = hi, 2 * hi
        if hi > 1e4:  # pragma: no cover - cannot happen for finite inputs
            return math.inf
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) <= b:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-7 * max(1.0, hi):
            break
    return lo


def one_run_ceiling(m: int, r: int | None = None, delta: float = 0.0, beta: float = 0.05) -> float:
    """The largest ε a one-run audit with m canaries and r guesses can certify (all guesses right)."""
    m = check_int("m", m, minimum=1)
    r = m if r is None else check_int("r", r, minimum=1)
    return one_run_epsilon_lower_bound(m, r, r, delta, beta)


@dataclass(frozen=True)
class OneRunBound:
    """Result of a one-run audit: the best guess count and the certified ε."""

    epsilon_lower_bound: float
    m: int
    r: int
    v: int
    beta: float
    delta: float
    ceiling: float
    grid: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict."""
        return dict(self.__dict__)


def one_run_audit(
    scores: object,
    included: object,
    delta: float = 0.0,
    *,
    beta: float = 0.05,
    guesses: tuple[int, ...] | None = None,
) -> OneRunBound:
    """One-run audit from canary scores (larger = "included") and the true inclusion bits.

    For each guess count r in ``guesses`` the attacker guesses "in" for the r/2 highest
    and "out" for the r/2 lowest scores (abstaining on the rest). Choosing the best r
    after looking is a multiple test, so each r is tested at level β/len(guesses)
    (Bonferroni): the reported ε holds at confidence 1 − β. Default grid: r ∈
    {m, m/2, m/5, m/10, m/20, m/50, m/100} (even, >= 2).
    """
    s = np.asarray(scores, dtype=float).ravel()
    inc = np.asarray(included).ravel().astype(bool)
    if s.size != inc.size:
        raise ValueError(f"included must have one entry per score ({s.size}), got {inc.size}")
    if s.size < 2 or not np.all(np.isfinite(s)):
        raise ValueError(f"scores must hold >= 2 finite values, got {s.size} values")
    m = s.size
    b = check_open_unit("beta", beta)
    if guesses is None:
        guesses = tuple(sorted({max(2, (m // k) // 2 * 2) for k in (1, 2, 5, 10, 20, 50, 100)}, reverse=True))
    guesses = tuple(check_int("guesses", g, minimum=1) for g in guesses)
    if not guesses:
        raise ValueError("guesses must list at least one guess count, got ()")
    if any(g > m for g in guesses):
        raise ValueError(f"every guess count must be <= m={m}, got {guesses}")
    level = b / len(guesses)
    order = np.argsort(-s, kind="mergesort")
    grid: list[dict[str, float]] = []
    best = (-1.0, 0, 0)  # every ε >= 0 beats it: the first grid entry is the default
    for r in guesses:
        k_in = r // 2 + r % 2
        k_out = r // 2
        v = int(inc[order[:k_in]].sum()) + (int((~inc[order[m - k_out :]]).sum()) if k_out else 0)
        eps = one_run_epsilon_lower_bound(m, r, v, delta, level)
        grid.append({"r": r, "v": v, "epsilon_lower_bound": eps})
        if eps > best[0]:  # ties keep the first (largest) guess count
            best = (eps, r, v)
    return OneRunBound(
        epsilon_lower_bound=float(best[0]),
        m=m,
        r=int(best[1]),
        v=int(best[2]),
        beta=b,
        delta=float(delta),
        ceiling=one_run_ceiling(m, max(guesses), delta, level),
        grid=grid,
    )

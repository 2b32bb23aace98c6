"""Metrics for attacks: ROC curves, TPR at low FPR, advantage, and classification scores.

Everything works on plain arrays (numpy/scipy only). Convention: a *score* is
larger when the attack believes "member" (or "canary included").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from featuredp._validate import check_open_unit

FPR_LEVELS: tuple[float, ...] = (1e-1, 1e-2, 1e-3)


def _as_scores(name: str, values: object) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty, got an array of size 0")
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)][0]
        raise ValueError(f"{name} must be finite, got a value {bad!r}")
    return arr


def _as_labels(name: str, values: object, n: int) -> np.ndarray:
    arr = np.asarray(values).ravel()
    if arr.shape[0] != n:
        raise ValueError(f"{name} must have {n} entries (one per score), got {arr.shape[0]}")
    uniq = np.unique(arr)
    if not np.all(np.isin(uniq, [0, 1, False, True])):
        raise ValueError(f"{name} must be 0/1 (or bool), got values {uniq[:5].tolist()}")
    arr = arr.astype(bool)
    if arr.all() or not arr.any():
        raise ValueError(f"{name} must contain both members (1) and non-members (0), got only {int(arr[0])}")
    return arr


def roc_curve(scores: object, labels: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve of ``scores`` for binary ``labels`` (1 = member).

    Returns ``(fpr, tpr, thresholds)``: predicting "member" when ``score >= thresholds[i]``
    gives ``(fpr[i], tpr[i])``. Starts at (0, 0) with threshold +inf; ties are handled
    by putting all tied scores on the same side.
    """
    s = _as_scores("scores", scores)
    y = _as_labels("labels", labels, s.size)
    order = np.argsort(-s, kind="mergesort")
    s_sorted, y_sorted = s[order], y[order]
    # One ROC point per distinct score (the last index of each run of ties).
    distinct = np.r_[np.nonzero(np.diff(s_sorted))[0], s.size - 1]
    tp = np.cumsum(y_sorted)[distinct]
    fp = np.cumsum(~y_sorted)[distinct]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    tpr = np.r_[0.0, tp / n_pos]
    fpr = np.r_[0.0, fp / n_neg]
    thr = np.r_[np.inf, s_sorted[distinct]]
    return fpr, tpr, thr


def roc_auc(scores: object, labels: object) -> float:
    """Area under the ROC curve (= P[score_member > score_nonmember] + ½·P[tie])."""
    s = _as_scores("scores", scores)
    y = _as_labels("labels", labels, s.size)
    # Mann–Whitney U via average ranks: exact, handles ties, O(n log n).
    ranks = stats.rankdata(s)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def tpr_at_fpr(scores: object, labels: object, fpr_level: float) -> float:
    """The largest TPR reachable with FPR <= ``fpr_level`` (a threshold on the scores)."""
    level = check_open_unit("fpr_level", fpr_level)
    fpr, tpr, _ = roc_curve(scores, labels)
    ok = fpr <= level + 1e-15
    return float(tpr[ok].max())


def membership_advantage(scores: object, labels: object) -> float:
    """max over thresholds of TPR − FPR (Yeom et al.'s membership advantage, best threshold)."""
    fpr, tpr, _ = roc_curve(scores, labels)
    return float(np.max(tpr - fpr))


@dataclass(frozen=True)
class MembershipMetrics:
    """Summary of a membership (or canary) score vector."""

    auc: float
    advantage: float
    tpr_at_fpr: dict[float, float]
    n_members: int
    n_nonmembers: int

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict (keys of ``tpr_at_fpr`` become strings like ``"0.001"``)."""
        return {
            "auc": self.auc,
            "advantage": self.advantage,
            "tpr_at_fpr": {f"{k:g}": v for k, v in self.tpr_at_fpr.items()},
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
        }


def membership_metrics(scores: object, labels: object, fpr_levels: tuple[float, ...] = FPR_LEVELS) -> MembershipMetrics:
    """AUC, best-threshold advantage and TPR at each FPR level.

    TPR at an FPR below 1/n_nonmembers cannot be measured; it is reported from the
    (0, ·) point of the curve, i.e. the TPR with no false positive at all.
    """
    s = _as_scores("scores", scores)
    y = _as_labels("labels", labels, s.size)
    fpr, tpr, _ = roc_curve(s, y)
    tprs = {}
    for level in fpr_levels:
        check_open_unit("fpr_level", level)
        tprs[float(level)] = float(tpr[fpr <= level + 1e-15].max())
    return MembershipMetrics(
        auc=roc_auc(s, y),
        advantage=float(np.max(tpr - fpr)),
        tpr_at_fpr=tprs,
        n_members=int(y.sum()),
        n_nonmembers=int((~y).sum()),
    )


# --- classification metrics for attribute inference -------------------------------------------


def _pair(y_true: object, y_pred: object) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(y_true).ravel()
    p = np.asarray(y_pred).ravel()
    if t.shape != p.shape:
        raise ValueError(f"y_pred must have the shape of y_true {t.shape}, got {p.shape}")
    if t.size == 0:
        raise ValueError("y_true must not be empty, got an array of size 0")
    return t, p


def accuracy(y_true: object, y_pred: object) -> float:
    """Fraction of exact matches."""
    t, p = _pair(y_true, y_pred)
    return float(np.mean(t == p))


def balanced_accuracy(y_true: object, y_pred: object) -> float:
    """Mean per-class recall over the classes present in ``y_true`` (chance = 1/K)."""
    t, p = _pair(y_true, y_pred)
    return float(np.mean([np.mean(p[t == c] == c) for c in np.unique(t)]))


def matthews_corrcoef(y_true: object, y_pred: object) -> float:
    """Multiclass Matthews correlation coefficient (Gorodkin's R_K); 0 when undefined."""
    t, p = _pair(y_true, y_pred)
    classes = np.unique(np.r_[t, p])
    ti = np.searchsorted(classes, t)
    pi = np.searchsorted(classes, p)
    k = classes.size
    cm = np.zeros((k, k), dtype=float)
    np.add.at(cm, (ti, pi), 1.0)
    n = cm.sum()
    correct = np.trace(cm)
    t_sum = cm.sum(axis=1)
    p_sum = cm.sum(axis=0)
    cov_tp = correct * n - t_sum @ p_sum
    cov_tt = n * n - t_sum @ t_sum
    cov_pp = n * n - p_sum @ p_sum
    denom = np.sqrt(cov_tt * cov_pp)
    return float(cov_tp / denom) if denom > 0 else 0.0


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (used for attack accuracies)."""
    if trials <= 0:
        raise ValueError(f"trials must be >= 1, got {trials!r}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, trials={trials}], got {successes!r}")
    check_open_unit("confidence", confidence)
    z = stats.norm.ppf(0.5 + confidence / 2)
    phat = successes / trials
    denom = 1 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * np.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials * trials)) / denom
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))

"""Membership inference on arrays of per-example scores (numpy/scipy/scikit-learn only).

* :func:`loss_threshold_scores` — Yeom et al. 2018: low loss ⇒ member.
* :func:`yeom_attack` — the same with Yeom's fixed threshold (the mean training loss).
* :class:`ShadowModelAttack` — Shokri et al. 2017: an attack classifier trained
  on the outputs of shadow models on their own members and non-members, one per class.
* :func:`lira_scores` — Carlini et al. 2022 (LiRA): a likelihood-ratio test on logit-scaled
  confidences, with shadow models trained with ("in") and without ("out") each example;
  online (in and out) or offline (out only), per-example or global ("fixed") variance.

Model-specific work (running a network, computing losses or logit-scaled confidences) lives
in :mod:`featuredp.attacks.torch_adapter`; everything here takes arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from featuredp._validate import check_choice, check_int


def _finite(name: str, values: object, ndim: int | None = None) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got a non-finite value")
    return arr


def loss_threshold_scores(losses: object) -> np.ndarray:
    """Membership scores of the loss attack: ``-loss`` (larger = more likely a member)."""
    return -_finite("losses", losses).ravel()


@dataclass(frozen=True)
class ThresholdResult:
    """Yeom's attack with a fixed threshold: predictions and its advantage TPR − FPR."""

    threshold: float
    predictions: np.ndarray
    tpr: float
    fpr: float

    @property
    def advantage(self) -> float:
        """TPR − FPR at the fixed threshold."""
        return self.tpr - self.fpr


def yeom_attack(losses: object, labels: object, train_loss_mean: float) -> ThresholdResult:
    """Predict "member" when the loss is below the model's mean training loss (Yeom et al.).

    ``train_loss_mean`` is what the adversary is assumed to know (e.g. published training
    loss); ``labels`` (1 = member) are used only to measure the attack.
    """
    loss = _finite("losses", losses).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    if y.size != loss.size:
        raise ValueError(f"labels must have {loss.size} entries, got {y.size}")
    if y.all() or not y.any():
        raise ValueError("labels must contain both members (1) and non-members (0)")
    pred = loss <= float(train_loss_mean)
    return ThresholdResult(
        threshold=float(train_loss_mean),
        predictions=pred,
        tpr=float(pred[y].mean()),
        fpr=float(pred[~y].mean()),
    )


# --- LiRA -------------------------------------------------------------------------------------------


def logit_confidence(probs_true_class: object, eps: float = 1e-12) -> np.ndarray:
    """φ(p) = log(p / (1 − p)) of the probability of the true class (LiRA's scaling).

    Prefer computing φ from logits (``torch_adapter.logit_scaled_confidence``), which is
    exact where p rounds to 1; this helper clips p to [eps, 1 − eps].
    """
    p = np.clip(_finite("probs_true_class", probs_true_class), eps, 1 - eps)
    return np.log(p) - np.log1p(-p)


def lira_scores(
    target: object,
    shadow: object,
    shadow_in: object,
    *,
    mode: str = "online",
    variance: str = "per-example",
    min_std: float = 1e-3,
) -> np.ndarray:
    """LiRA membership scores (larger = more likely a member).

    Parameters
    ----------
    target:
        (n,) logit-scaled confidence φ of the target model on each example (one query per
        example; average over augmentations beforehand if you use them).
    shadow:
        (k, n) φ of k shadow models on the same examples.
    shadow_in:
        (k, n) bool, whether example j was in shadow model i's training set.
    mode:
        ``"online"``: Λ = log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²).
        ``"offline"``: only out-models; the one-sided test score
        ``log Φ((φ − μ_out)/σ_out)`` (large when φ is far above the out distribution).
    variance:
        ``"per-example"`` (σ estimated per example) or ``"fixed"`` (one global σ per side,
        pooled over examples; Carlini et al. recommend it when there are few shadows).
    min_std:
        Floor on the standard deviations (a single shadow gives σ = 0).
    """
    mode = check_choice("mode", mode, ("online", "offline"))
    variance = check_choice("variance", variance, ("per-example", "fixed"))
    phi = _finite("target", target, ndim=1)
    sh = _finite("shadow", shadow, ndim=2)
    mask = np.asarray(shadow_in).astype(bool)
    if sh.shape[1] != phi.size or mask.shape != sh.shape:
        raise ValueError(
            f"shadow and shadow_in must have shape (k, {phi.size}); got {sh.shape} and {mask.shape}"
        )
    out = ~mask
    if mode == "online" and not mask.any(axis=0).all():
        missing = int(np.sum(~mask.any(axis=0)))
        raise ValueError(f"online LiRA needs >= 1 in-model per example; {missing} examples have none (use offline)")
    if not out.any(axis=0).all():
        missing = int(np.sum(~out.any(axis=0)))
        raise ValueError(f"LiRA needs >= 1 out-model per example; {missing} examples have none")

    def moments(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cnt = sel.sum(axis=0)
        mu = np.where(sel, sh, 0.0).sum(axis=0) / cnt
        dev = np.where(sel, (sh - mu) ** 2, 0.0)
        if variance == "fixed":
            # pooled within-example variance over all examples
            sd = np.full(phi.size, np.sqrt(dev.sum() / max(1, int(cnt.sum() - cnt.size))))
        else:
            sd = np.sqrt(dev.sum(axis=0) / np.maximum(cnt - 1, 1))
        return mu, np.maximum(sd, min_std)

    mu_out, sd_out = moments(out)
    if mode == "offline":
        return stats.norm.logcdf((phi - mu_out) / sd_out)
    mu_in, sd_in = moments(mask)
    return stats.norm.logpdf(phi, mu_in, sd_in) - stats.norm.logpdf(phi, mu_out, sd_out)


# --- Shokri shadow-model attack -------------------------------------------------------------------------


def _attack_features(probs: np.ndarray) -> np.ndarray:
    # Sorted probability vector (label-invariant) plus log of the top probability and the
    # entropy: the classic inputs of the attack model, made numerically robust.
    p = np.clip(probs, 1e-12, 1.0)
    srt = -np.sort(-p, axis=1)
    ent = -(p * np.log(p)).sum(axis=1, keepdims=True)
    return np.hstack([srt, np.log(srt[:, :1]), ent])


class ShadowModelAttack:
    """Shokri et al.'s attack model: per-class binary classifiers on shadow outputs.

    Fit with the probability vectors that shadow models output on their own training
    records ("in") and on disjoint records ("out"), with the true labels; then score the
    target model's probability vectors. A class with too few shadow records of either kind
    falls back to a classifier trained on all classes.
    """

    def __init__(self, min_per_class: int = 20, seed: int = 0) -> None:
        self.min_per_class = check_int("min_per_class", min_per_class, minimum=2)
        self.seed = int(seed)

    def _new(self):
        # Gradient boosting captures the non-linear "confidence gap" without tuning.
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(max_iter=100, random_state=self.seed)

    def fit(self, probs: object, labels: object, member: object) -> ShadowModelAttack:
        """Train on shadow outputs ``probs`` (n, K), true ``labels`` (n,), ``member`` (n,) 0/1."""
        p = _finite("probs", probs, ndim=2)
        y = np.asarray(labels).ravel().astype(int)
        mem = np.asarray(member).ravel().astype(bool)
        if y.size != p.shape[0] or mem.size != p.shape[0]:
            raise ValueError(f"labels and member must have {p.shape[0]} entries, got {y.size} and {mem.size}")
        if mem.all() or not mem.any():
            raise ValueError("member must contain both shadow members (1) and non-members (0)")
        feats = _attack_features(p)
        self.n_classes_ = p.shape[1]
        self.global_ = self._new().fit(feats, mem)
        self.per_class_ = {}
        for c in np.unique(y):
            sel = y == c
            if min(mem[sel].sum(), (~mem[sel]).sum()) >= self.min_per_class:
                self.per_class_[int(c)] = self._new().fit(feats[sel], mem[sel])
        return self

    def score(self, probs: object, labels: object) -> np.ndarray:
        """Membership probability of each target record (larger = member)."""
        if not hasattr(self, "global_"):
            raise RuntimeError("ShadowModelAttack.score called before fit")
        p = _finite("probs", probs, ndim=2)
        if p.shape[1] != self.n_classes_:
            raise ValueError(f"probs must have {self.n_classes_} columns like the shadow outputs, got {p.shape[1]}")
        y = np.asarray(labels).ravel().astype(int)
        feats = _attack_features(p)
        out = self.global_.predict_proba(feats)[:, 1]
        for c, clf in self.per_class_.items():
            sel = y == c
            if sel.any():
                out[sel] = clf.predict_proba(feats[sel])[:, 1]
        return out

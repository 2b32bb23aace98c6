"""Convex losses of the DP-ERM estimators, written for the normalised data ‖z‖ <= 1.

Binary losses are margin losses l(m) with m = y·wᵀz and y ∈ {−1, +1}. The privacy
analyses need |l'| <= 1 (so a per-example gradient has norm <= ‖z‖ <= 1: output
perturbation's sensitivity 2/(nλ), noisy SGD's clipping bound) and, for objective
perturbation, |l''| <= c (logistic c = 1/4; Huber SVM c = 1/(2h)). The hinge loss
has no bounded second derivative, hence the Huber SVM (CMS11 §3.4.2).

The multinomial (softmax) loss is used by noisy SGD only: ℓ = LSE(Wᵀz) − Wᵀz·y
with W of shape (d, K). Its per-example gradient z(p − y)ᵀ has Frobenius norm
<= √2‖z‖; the label-private part −z yᵀ has norm ‖z‖ (the paper's label-DP case study, §5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special


@dataclass(frozen=True)
class MarginLoss:
    """A convex margin loss with |l'| <= 1 and |l''| <= ``smoothness``."""

    name: str
    smoothness: float  # c in CMS11: a bound on |l''|
    huber_h: float = 0.5

    def value(self, m: np.ndarray) -> np.ndarray:
        """l(m) elementwise."""
        if self.name == "logistic":
            return np.logaddexp(0.0, -m)
        h = self.huber_h
        out = np.where(m > 1 + h, 0.0, 1.0 - m)
        mid = np.abs(1.0 - m) <= h
        return np.where(mid, (1 + h - m) ** 2 / (4 * h), out)

    def derivative(self, m: np.ndarray) -> np.ndarray:
        """l'(m) elementwise, in [−1, 0]."""
        if self.name == "logistic":
            return -special.expit(-m)
        h = self.huber_h
        out = np.where(m > 1 + h, 0.0, -1.0)
        mid = np.abs(1.0 - m) <= h
        return np.where(mid, -(1 + h - m) / (2 * h), out)


    def second_derivative(self, m: np.ndarray) -> np.ndarray:
        """l''(m) elementwise, in [0, smoothness] (Huber: the one-sided value at the kinks)."""
        if self.name == "logistic":
            s = special.expit(m)
            return s * (1.0 - s)
        h = self.huber_h
        return np.where(np.abs(1.0 - m) <= h, 1.0 / (2 * h), 0.0)


def make_loss(name: str, huber_h: float = 0.5) -> MarginLoss:
    """The margin loss called ``name`` ('logistic' or 'huber')."""
    if name == "logistic":
        return MarginLoss("logistic", 0.25)
    return MarginLoss("huber", 1.0 / (2.0 * huber_h), huber_h)


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, stable for large logits."""
    return special.softmax(logits, axis=1)


def multinomial_loss(W: np.ndarray, Z: np.ndarray, y_idx: np.ndarray) -> np.ndarray:
    """Per-example cross-entropy LSE(Wᵀz) − (Wᵀz)_y, shape (n,)."""
    logits = Z @ W
    return special.logsumexp(logits, axis=1) - logits[np.arange(len(y_idx)), y_idx]

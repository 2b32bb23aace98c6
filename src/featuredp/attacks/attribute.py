"""Attribute inference on arrays (numpy/scipy/scikit-learn only), and Theorem 4's bound.

The adversary knows the public part Ψ(x) of a target record (and its label when the label
is public) and sees the model; it guesses the record's private categorical attribute
(e.g. ``sex`` or ``race``, one-hot encoded in the features). Attacks:

* **imputation baseline** (:class:`ImputationBaseline`): the same knowledge *without* the
  model — a classifier predicting the attribute from Ψ(x) (and y), fitted on a population
  sample disjoint from the targets. This is the bar every attack must clear (Jayaraman &
  Evans 2022: many "attribute inference" results are just imputation).
* **loss attack** (:func:`loss_attack`): plug each candidate value into x and take the one
  with the lowest model loss on the known label (Yeom et al. 2018; Fredrikson et al.).
* **confidence attack** (:func:`confidence_attack`): take the candidate under which the
  model is most confident in *any* class (needs no label; exploits overconfidence on
  memorised records).
* **MAP attack** (:func:`map_attack`): combine the imputation prior with the model's
  likelihood of the label, argmax_c log p(c | Ψ(x), y) + log p_θ(y | x_c) (Fredrikson et al.
  2014's estimator with the population prior).

Theorem 4 (paper §4): if the training is f-DP in the feature sense, any adversary's success
probability is at most ``1 − f(Ball)``, Ball the best success without the model. For
(ε, δ): ``min(1, e^ε·Ball + δ, 1 − e^{−ε}(1 − δ − Ball))`` (both branches of f_{ε,δ}).
By concavity of ``1 − f`` the bound also holds for the success averaged over targets with
Ball replaced by its average (Jensen).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

from featuredp._validate import check_nonnegative, check_open_unit
from featuredp.attacks.metrics import accuracy, balanced_accuracy, matthews_corrcoef, wilson_interval

# --- the attacks on score matrices -------------------------------------------------------------------


def _matrix(name: str, values: object) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] < 2:
        raise ValueError(f"{name} must have shape (n_targets, n_candidates >= 2), got {arr.shape}")
    if np.any(np.isnan(arr)):
        raise ValueError(f"{name} must not contain NaN")
    return arr


def loss_attack(losses: object) -> np.ndarray:
    """Index of the candidate with the lowest loss, per target; ``losses`` has shape (n, K)."""
    return np.argmin(_matrix("losses", losses), axis=1)


def confidence_attack(confidences: object) -> np.ndarray:
    """Index of the candidate with the highest top-class confidence; shape (n, K) -> (n,)."""
    return np.argmax(_matrix("confidences", confidences), axis=1)


def map_attack(losses: object, prior: object) -> np.ndarray:
    """argmax_c log prior[c] − loss[c] (losses are negative log-likelihoods of the label)."""
    loss = _matrix("losses", losses)
    pri = _matrix("prior", prior)
    if pri.shape != loss.shape:
        raise ValueError(f"prior must have the shape of losses {loss.shape}, got {pri.shape}")
    return np.argmax(np.log(np.clip(pri, 1e-300, None)) - loss, axis=1)


# --- the imputation baseline ---------------------------------------------------------------------------


class ImputationBaseline:
    """Predict the private attribute from public knowledge only (no model access).

    A multinomial logistic regression (well calibrated, which matters because its
    probabilities also estimate Ball) on the public features, optionally with the label
    one-hot. Fit on a population sample that does not contain the targets.
    """

    def __init__(self, C: float = 1.0, max_iter: int = 500) -> None:
        self.C = check_nonnegative("C", C)
        self.max_iter = int(max_iter)

    def fit(self, public: object, attribute: object, n_candidates: int | None = None) -> ImputationBaseline:
        """``public`` (n, d) float, ``attribute`` (n,) int codes in [0, n_candidates)."""
        from sklearn.linear_model import LogisticRegression

        X = np.asarray(public, dtype=float)
        a = np.asarray(attribute).ravel().astype(int)
        if X.ndim != 2 or X.shape[0] != a.size:
            raise ValueError(f"public must have shape (n, d) with n = {a.size}, got {X.shape}")
        k = int(a.max()) + 1 if n_candidates is None else int(n_candidates)
        if a.min() < 0 or a.max() >= k:
            raise ValueError(f"attribute codes must lie in [0, {k}), got range [{a.min()}, {a.max()}]")
        self.n_candidates_ = k
        self.prior_ = np.bincount(a, minlength=k) / a.size
        if np.unique(a).size < 2:
            self.model_ = None  # a constant attribute: the prior is the whole story
        else:
            self.model_ = LogisticRegression(C=self.C if self.C > 0 else 1e6, max_iter=self.max_iter).fit(X, a)
        return self

    def predict_proba(self, public: object) -> np.ndarray:
        """(n, K) probabilities p(c | public knowledge)."""
        if not hasattr(self, "prior_"):
            raise RuntimeError("ImputationBaseline.predict_proba called before fit")
        X = np.asarray(public, dtype=float)
        out = np.tile(self.prior_, (X.shape[0], 1))
        if self.model_ is not None:
            out[:, :] = 0.0
            out[:, self.model_.classes_] = self.model_.predict_proba(X)
        return out

    def predict(self, public: object) -> np.ndarray:
        """Most likely code per target."""
        return np.argmax(self.predict_proba(public), axis=1)


# --- Ball and Theorem 4 -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BallEstimate:
    """Estimate of the average Ball (best success without the model) with a confidence interval.

    ``estimate`` is the mean over targets of max_c p̂(c | Ψ(x)) from the calibrated imputation
    model: the success of the best model-free guess if p̂ is the true conditional law.
    ``imputation_accuracy`` is the measured success of that guess (another estimate of the same
    quantity; a large gap means p̂ is miscalibrated). The interval is a normal interval on the
    mean of bounded per-target values; it does not cover model misspecification, so the bound
    uses ``upper`` = max(CI upper end, upper CI end of the measured imputation accuracy).
    """

    estimate: float
    lower: float
    upper: float
    imputation_accuracy: float
    n: int
    method: str = "mean max-probability of the imputation model (calibrated logistic regression)"


def estimate_ball(prior_probs: object, true_codes: object | None = None, confidence: float = 0.95) -> BallEstimate:
    """Ball from the imputation model's probabilities on targets (n, K), with a CI."""
    p = _matrix("prior_probs", prior_probs)
    conf = check_open_unit("confidence", confidence)
    top = p.max(axis=1)
    n = top.size
    z = stats.norm.ppf(0.5 + conf / 2)
    se = top.std(ddof=1) / math.sqrt(n) if n > 1 else 0.5
    est = float(top.mean())
    lo, hi = max(0.0, est - z * se), min(1.0, est + z * se)
    acc = float("nan")
    if true_codes is not None:
        t = np.asarray(true_codes).ravel().astype(int)
        if t.size != n:
            raise ValueError(f"true_codes must have {n} entries, got {t.size}")
        hits = int(np.sum(np.argmax(p, axis=1) == t))
        acc = hits / n
        hi = max(hi, wilson_interval(hits, n, conf)[1])
    return BallEstimate(estimate=est, lower=float(lo), upper=float(hi), imputation_accuracy=acc, n=n)


def theorem4_bound(
    ball: float,
    *,
    epsilon: float | None = None,
    delta: float = 0.0,
    tradeoff: Callable[[np.ndarray], np.ndarray] | None = None,
) -> float:
    """Theorem 4: the largest attribute-inference success an f-FDP model allows.

    Give either ``tradeoff`` (the trade-off function f of the training, vectorised; from
    ``featuredp.accounting.tradeoff``) for the tight ``1 − f(Ball)``, or ``epsilon`` (and
    ``delta``) for the (ε, δ) form
    ``1 − f_{ε,δ}(Ball) = min(1, e^ε·Ball + δ, 1 − e^{−ε}(1 − δ − Ball))``.
    ``epsilon=inf`` (non-private) gives 1.
    """
    b = float(ball)
    if not 0.0 <= b <= 1.0:
        raise ValueError(f"ball must be in [0, 1], got {ball!r}")
    if tradeoff is not None:
        return float(min(1.0, max(b, 1.0 - float(np.asarray(tradeoff(np.array([b])))[0]))))
    if epsilon is None:
        raise ValueError("theorem4_bound needs epsilon or tradeoff, got neither")
    eps = check_nonnegative("epsilon", epsilon, allow_inf=True)
    d = check_nonnegative("delta", delta)
    if math.isinf(eps):
        return 1.0
    # f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α)) (Dong, Roth, Su): both branches count;
    # the second is the tighter one when Ball is large (e.g. a majority attribute value).
    return float(min(1.0, math.exp(eps) * b + d, 1.0 - math.exp(-eps) * (1.0 - d - b)))


# --- evaluation -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttackScore:
    """Metrics of one attack on one group of targets (members or non-members)."""

    attack: str
    group: str
    n: int
    accuracy: float
    accuracy_ci: tuple[float, float]
    balanced_accuracy: float
    mcc: float
    baseline_accuracy: float
    advantage: float
    advantage_ci: tuple[float, float]

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict."""
        d = dict(self.__dict__)
        d["accuracy_ci"] = list(self.accuracy_ci)
        d["advantage_ci"] = list(self.advantage_ci)
        return d


def score_attack(
    attack: str, group: str, true_codes: object, guesses: object, baseline_guesses: object, confidence: float = 0.95
) -> AttackScore:
    """Accuracy, balanced accuracy, MCC and the paired advantage over the imputation baseline.

    The advantage CI is a normal interval on the mean of paired differences
    ``1[attack right] − 1[baseline right]`` over the same targets.
    """
    t = np.asarray(true_codes).ravel()
    g = np.asarray(guesses).ravel()
    b = np.asarray(baseline_guesses).ravel()
    if not (t.size == g.size == b.size) or t.size == 0:
        raise ValueError(f"true_codes, guesses and baseline_guesses must have the same non-zero length, "
                         f"got {t.size}, {g.size}, {b.size}")
    conf = check_open_unit("confidence", confidence)
    hit = (g == t).astype(float)
    base = (b == t).astype(float)
    diff = hit - base
    z = stats.norm.ppf(0.5 + conf / 2)
    se = diff.std(ddof=1) / math.sqrt(t.size) if t.size > 1 else 1.0
    adv = float(diff.mean())
    return AttackScore(
        attack=attack,
        group=group,
        n=int(t.size),
        accuracy=accuracy(t, g),
        accuracy_ci=wilson_interval(int(hit.sum()), t.size, conf),
        balanced_accuracy=balanced_accuracy(t, g),
        mcc=matthews_corrcoef(t, g),
        baseline_accuracy=float(base.mean()),
        advantage=adv,
        advantage_ci=(adv - z * se, adv + z * se),
    )

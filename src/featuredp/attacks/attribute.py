"""Attribute inference on arrays (numpy/scipy/scikit-learn only), and Theorem 4's bound.

The adversary knows the public part Ψ(x) of a target record (and its label when the label
is public) and sees the model; it guesses the record's private categorical attribute
(e.g. ``sex`` or ``race``, one-hot encoded in the features). Attacks:

* **imputation baseline** (:func:`cross_fitted_imputation`; :class:`ImputationBaseline` is the
  single logistic regression): the same knowledge *without* the model — the best of several
  classifiers predicting the attribute from Ψ(x) (and y), cross-fitted so that no target is
  predicted by a classifier that saw it; :func:`ball_from_hits` turns its held-out hits into
  Ball with a Clopper–Pearson interval whose upper end the bound uses. This is the bar every
  attack must clear (Jayaraman & Evans 2022: many "attribute inference" results are just
  imputation).
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
from typing import Any

import numpy as np
from scipy import stats

from featuredp._validate import check_nonnegative, check_open_unit
from featuredp.attacks.bounds import clopper_pearson
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


#: The imputers tried for the baseline, in order (ties keep the first). "logistic" is the historical
#: imputer (unscaled, C = 1): on raw columns of very different scales its penalty can flatten a strong
#: predictor, which is why the scaled logistic regression and gradient boosting compete with it.
IMPUTERS = ("logistic", "scaled logistic", "gradient boosting")


def _make_imputer(name: str, seed: int) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if name == "logistic":
        return LogisticRegression(C=1.0, max_iter=500)
    if name == "scaled logistic":
        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000))
    if name == "gradient boosting":
        # early stopping on a held-out tenth: fewer trees, and less overfitting on small tables
        return HistGradientBoostingClassifier(max_iter=200, early_stopping=True, random_state=seed)
    raise ValueError(f"imputers must name entries of {IMPUTERS}, got {name!r}")


def _one_thread(items: list) -> Any:
    """Iterate with BLAS and OpenMP held to one thread: on a busy 2-core machine lbfgs on a few
    thousand rows ran ~25x slower with BLAS threads than without (Adult), and the fits are small."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield from items


@dataclass(frozen=True)
class CrossFittedBaseline:
    """Out-of-fold predictions of the best of several imputers (no model access).

    ``probs[i]`` comes from an imputer that never saw row i (k-fold cross-fitting), so every row
    can be a target and every other row training data. ``cv_accuracy`` is each candidate's
    out-of-fold accuracy on the scored attribute over all rows; ``chosen`` is the best of them.
    """

    chosen: str
    probs: np.ndarray
    cv_accuracy: dict[str, float]
    folds: int
    n_rows: int

    @property
    def n_fit(self) -> int:
        """Rows each fold's imputers were fitted on."""
        return self.n_rows - -(-self.n_rows // self.folds)


def cross_fitted_imputation(
    public: object,
    codes: object,
    n_candidates: int,
    *,
    attribute_of: object | None = None,
    imputers: tuple[str, ...] = IMPUTERS,
    folds: int = 5,
    seed: int = 0,
) -> CrossFittedBaseline:
    """Fit every imputer in ``imputers`` by k-fold cross-fitting; keep the best by CV accuracy.

    ``codes`` (n,) are the values predicted (e.g. the joint values of all hidden attributes);
    ``attribute_of[c]`` maps code c to the attacked attribute's value, on which candidates are
    scored (identity by default). Picking the best of a few after looking makes its CV accuracy
    slightly optimistic, which only raises Ball and so loosens, never breaks, Theorem 4's bound.
    """
    from sklearn.model_selection import KFold

    X = np.asarray(public, dtype=float)
    a = np.asarray(codes).ravel().astype(int)
    if X.ndim != 2 or X.shape[0] != a.size:
        raise ValueError(f"public must have shape (n, d) with n = {a.size}, got {X.shape}")
    k = int(n_candidates)
    if a.size == 0 or a.min() < 0 or a.max() >= k:
        raise ValueError(f"codes must be non-empty and lie in [0, {k}), got {a.size} codes")
    folds = int(folds)
    if not 2 <= folds <= a.size:
        raise ValueError(f"folds must be in [2, {a.size}] (the number of rows), got {folds}")
    if not imputers:
        raise ValueError(f"imputers must name at least one of {IMPUTERS}, got ()")
    attr_of = np.arange(k) if attribute_of is None else np.asarray(attribute_of).ravel().astype(int)
    if attr_of.size != k:
        raise ValueError(f"attribute_of must have one entry per code ({k}), got {attr_of.size}")
    truth = attr_of[a]
    n_attr = int(attr_of.max()) + 1
    splits = list(KFold(folds, shuffle=True, random_state=seed).split(X))
    probs: dict[str, np.ndarray] = {}
    acc: dict[str, float] = {}
    for name in imputers:
        p = np.zeros((a.size, k))
        for fit_idx, held in _one_thread(splits):
            seen = np.unique(a[fit_idx])
            if seen.size < 2:  # a constant fold: its prior is the whole story
                p[np.ix_(held, seen)] = 1.0
                continue
            est = _make_imputer(name, seed).fit(X[fit_idx], a[fit_idx])
            p[np.ix_(held, est.classes_)] = est.predict_proba(X[held])
        marg = np.zeros((a.size, n_attr))
        np.add.at(marg.T, attr_of, p.T)
        probs[name] = p
        acc[name] = float(np.mean(np.argmax(marg, axis=1) == truth))
    chosen = max(imputers, key=lambda m: acc[m])
    return CrossFittedBaseline(chosen=chosen, probs=probs[chosen], cv_accuracy=acc, folds=folds, n_rows=int(a.size))


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


def ball_from_hits(hits: object, confidence: float = 0.95, method: str = "") -> BallEstimate:
    """Ball as the baseline's held-out accuracy on the targets, with a Clopper–Pearson interval.

    ``hits`` (n,) says whether the model-free guess was right on each target (predicted by an
    imputer that never saw it). Theorem 4's bound should use ``upper``: a bound computed from a
    point estimate of Ball is too small about half of the time.
    """
    h = np.asarray(hits).ravel().astype(bool)
    if h.size == 0:
        raise ValueError("hits must hold at least one target, got 0")
    k, n = int(h.sum()), int(h.size)
    lo, hi = clopper_pearson(k, n, check_open_unit("confidence", confidence))
    how = method or "held-out accuracy of the imputation baseline, Clopper–Pearson interval"
    return BallEstimate(estimate=k / n, lower=lo, upper=hi, imputation_accuracy=k / n, n=n, method=how)


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

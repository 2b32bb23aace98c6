"""What the DP-ERM estimators share: parameter checks, the data-norm contract, the
intercept, label encoding, prediction, and the privacy record.

**The data-norm contract.** Every guarantee here assumes ‖x‖ <= ``data_norm`` for each
row. ``data_norm`` is a required parameter (a bound the user knows without looking at
the private rows, e.g. 1 after L2-normalising rows). ``data_norm="compute"`` reads the
largest row norm from the data, which leaks it: a ``PrivacyLeakWarning`` says so.
Rows above the bound are refused (``norm_policy="raise"``, the default) or scaled down
onto the ball (``norm_policy="clip"``; a per-row map that does not look at other rows,
so the guarantee is kept).

**The intercept.** With ``fit_intercept=True`` each row becomes
z = [x / data_norm, h] / √(1 + h²) with h = ``intercept_scaling``, so ‖z‖ <= 1 exactly
as the analyses require; the intercept is the weight of the constant column and is
regularised like the other weights (the strong convexity the sensitivity bound needs
covers it). Without an intercept z = x / data_norm. The learned ``coef_`` and
``intercept_`` are mapped back to the original feature scale.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy import special
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from featuredp._validate import check_choice, check_int, check_nonnegative, check_positive
from featuredp.errors import DataValidationError, PrivacyLeakWarning

LOSSES = ("logistic", "huber")
NORM_POLICIES = ("raise", "clip")
# float32 data L2-normalised to 1 can have norms of 1 + 1e-7; accept that rounding, then clip exactly.
_NORM_RTOL = 1e-6


def check_data_norm(data_norm: object) -> float | str:
    """A positive finite bound, or the string 'compute'; None is refused with the reason."""
    if data_norm is None:
        raise ValueError(
            "data_norm is required: give an upper bound on the L2 norm of the rows of X chosen without "
            "looking at the private data (e.g. 1.0 after L2-normalising rows), or data_norm='compute' to read "
            "it from the data (this leaks the largest row norm); got None"
        )
    if isinstance(data_norm, str):
        if data_norm != "compute":
            raise ValueError(f"data_norm must be a positive number or 'compute', got {data_norm!r}")
        return data_norm
    return check_positive("data_norm", data_norm)


def check_random_state(random_state: object) -> int | None:
    """None or a non-negative integer seed."""
    if random_state is None:
        return None
    return check_int("random_state", random_state, minimum=0)


def check_epsilon_delta(epsilon: object, delta: object) -> tuple[float, float]:
    """ε > 0 finite; δ in [0, 1) (0 = pure ε-DP)."""
    eps = check_positive("epsilon", epsilon)
    d = check_nonnegative("delta", delta)
    if d >= 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return eps, d


class PrivateLinearClassifier(ClassifierMixin, BaseEstimator):
    """Base of the DP linear classifiers (not for direct use).

    Subclasses implement ``_fit_private(Z, y_idx, n_classes, rng_seed)`` returning the
    weights W over the normalised features (shape (d_z, K) or (d_z, 1) for binary) and
    setting the privacy attributes.
    """

    # ---- validation shared by all estimators -------------------------------------------------
    def _check_common(self) -> dict[str, Any]:
        eps, delta = check_epsilon_delta(self.epsilon, self.delta)
        out = {
            "epsilon": eps,
            "delta": delta,
            "lam": check_positive("lam", self.lam),
            "data_norm": check_data_norm(self.data_norm),
            "loss": check_choice("loss", self.loss, LOSSES),
            "norm_policy": check_choice("norm_policy", self.norm_policy, NORM_POLICIES),
            "random_state": check_random_state(self.random_state),
            "intercept_scaling": check_positive("intercept_scaling", self.intercept_scaling),
            "huber_h": check_positive("huber_h", self.huber_h),
        }
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise TypeError(f"fit_intercept must be a bool, got {self.fit_intercept!r}")
        return out

    # ---- data ---------------------------------------------------------------------------------
    def _prepare(self, X: Any, y: Any, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Validate X, y; encode labels; return the normalised rows Z (‖z‖ <= 1) and class indices."""
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=False)
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise DataValidationError(
                f"y needs at least 2 classes to train a classifier, got 1 class ({self.classes_[0]!r})"
            )
        return self._normalise(X, params), y_idx.astype(np.int64)

    def _normalise(self, X: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        norms = np.linalg.norm(X, axis=1)
        bound = params["data_norm"]
        if bound == "compute":
            bound = float(norms.max())
            warnings.warn(
                f"data_norm='compute' read the largest row norm ({bound:.6g}) from the training data: this value "
                "is not protected by the privacy guarantee; pass a data-independent bound instead",
                PrivacyLeakWarning,
                stacklevel=3,
            )
            if bound <= 0:
                raise DataValidationError(f"data_norm='compute' found only all-zero rows (max norm {bound})")
        over = norms > bound * (1 + _NORM_RTOL)
        if over.any() and params["norm_policy"] == "raise":
            raise DataValidationError(
                f"{int(over.sum())} of {len(X)} rows of X have an L2 norm above data_norm={bound:g}; the privacy "
                "guarantee needs every row inside that bound: normalise the rows, raise data_norm, or pass "
                "norm_policy='clip' to scale such rows onto the bound"
            )
        # Scale every row above the bound (including float rounding) exactly onto it.
        scale = np.minimum(1.0, bound / np.maximum(norms, np.finfo(float).tiny))
        Z = X * (scale / bound)[:, None]
        self.data_norm_ = bound
        if self.fit_intercept:
            h = params["intercept_scaling"]
            Z = np.hstack([Z, np.full((len(Z), 1), h)]) / math.sqrt(1.0 + h * h)
        return Z

    def _set_coef(self, W: np.ndarray) -> None:
        """Map weights over Z (shape (d_z, K')) back to coef_ (K', d) and intercept_ (K',)."""
        R = self.data_norm_
        if self.fit_intercept:
            h = float(self.intercept_scaling)
            s = math.sqrt(1.0 + h * h)
            self.coef_ = (W[:-1] / (R * s)).T.copy()
            self.intercept_ = (W[-1] * h / s).copy()
        else:
            self.coef_ = (W / R).T.copy()
            self.intercept_ = np.zeros(W.shape[1])

    # ---- prediction -------------------------------------------------------------------------
    def decision_function(self, X: Any) -> np.ndarray:
        """Scores wᵀx + b: shape (n,) for two classes (positive = ``classes_[1]``), else (n, K)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        scores = X @ self.coef_.T + self.intercept_
        return scores.ravel() if scores.shape[1] == 1 else scores

    def predict(self, X: Any) -> np.ndarray:
        """The predicted class labels."""
        scores = self.decision_function(X)
        idx = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[idx]

    def _has_proba(self) -> bool:
        return self.loss == "logistic"

    @available_if(_has_proba)
    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities (logistic loss only): sigmoid for two classes, normalised
        one-vs-rest sigmoids, or softmax for the multinomial model."""
        scores = self.decision_function(X)
        if scores.ndim == 1:
            p1 = special.expit(scores)
            return np.column_stack([1 - p1, p1])
        if getattr(self, "multinomial_", False):
            return special.softmax(scores, axis=1)
        p = special.expit(scores)
        return p / np.maximum(p.sum(axis=1, keepdims=True), np.finfo(float).tiny)

    @available_if(_has_proba)
    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Logarithm of :meth:`predict_proba`."""
        return np.log(np.maximum(self.predict_proba(X), np.finfo(float).tiny))

    # ---- privacy record ---------------------------------------------------------------------
    def record(self, ledger: Any, name: str | None = None) -> dict[str, Any]:
        """Record the privacy this fit spent in a :class:`featuredp.accounting.BudgetLedger`.

        One-shot mechanisms are recorded as their (``epsilon_``, ``delta_``) pair (basic
        composition with other pair spends). The ledger raises ``BudgetExceededError`` and
        records nothing if the spend does not fit. Returns the ledger's record.
        """
        check_is_fitted(self)
        what = name or f"{type(self).__name__} ({self.privacy_['relation']})"
        return ledger.spend(what, epsilon=self.epsilon_, delta=self.delta_)

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        # Rows are validated against data_norm; NaN/inf can never satisfy a norm bound.
        tags.input_tags.allow_nan = False
        tags.non_deterministic = self.random_state is None
        return tags


def ovr_split(epsilon: float, delta: float, n_problems: int) -> list[tuple[float, float]]:
    """Basic composition: ``n_problems`` releases on the same data at (ε/K, δ/K) each sum to (ε, δ)."""
    return [(epsilon / n_problems, delta / n_problems)] * n_problems

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

**The class set.** ``classes=[...]`` declares the labels up front (public knowledge, e.g. a
schema): ``classes_`` is that list sorted, the model has one output per declared class
whether or not it occurs in y, and a label outside it is a ``DataValidationError``.
Without it the classes are ``np.unique(y)``, read from the private labels — a label held
by one record then changes the model's shape (ε = ∞ for that record) — and a
``PrivacyLeakWarning`` says so (see ``_labels``).

**The ledger.** ``ledger=`` (a path or a ``BudgetLedger``) reserves the planned spend
after the parameters and the data's shape are validated and before any mechanism runs, so
an overspend raises ``BudgetExceededError`` with the private data unused; the reservation
is settled with the spend once the mechanism has run (see ``_ledger``). ``record(ledger)``
after ``fit`` still works but can only refuse after the data was used.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy import special
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted, validate_data

from featuredp._validate import check_choice, check_int, check_nonnegative, check_positive
from featuredp.errors import DataValidationError, PrivacyLeakWarning
from featuredp.mechanisms._labels import resolve_classes
from featuredp.mechanisms._ledger import same_ledger
from featuredp.sampling import warn_private_seed

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
    seed = check_int("random_state", random_state, minimum=0)
    warn_private_seed("random_state", seed, stacklevel=4)
    return seed


def check_epsilon_delta(epsilon: object, delta: object) -> tuple[float, float]:
    """ε > 0 finite; δ in [0, 1) (0 = pure ε-DP)."""
    eps = check_positive("epsilon", epsilon)
    d = check_nonnegative("delta", delta)
    if d >= 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return eps, d


class PrivateLinearClassifier(ClassifierMixin, BaseEstimator):
    """Base of the DP linear classifiers (not for direct use).

    Subclasses implement ``_fit_private(Z, y_idx, n_classes, params, rng)`` returning the
    weights W over the normalised features (shape (d_z, K) or (d_z, 1) for binary) and
    setting the privacy attributes. ``fit`` must call ``_prepare`` (validation, no
    mechanism), reserve the planned spend in the ledger, and only then set fitted
    attributes, draw randomness and call the private part.
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
    def _prepare(
        self, X: Any, y: Any, params: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Validate X, y; encode labels. Returns the normalised rows Z (‖z‖ <= 1), the class
        indices, the classes and the data-norm bound.

        Sets no fitted attribute (beyond scikit-learn's ``n_features_in_``): ``fit`` assigns them
        only once the ledger reservation is held, so a refused fit leaves a previous fit's model,
        ``classes_`` and ``epsilon_`` consistent with each other.
        """
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=False)
        # Declared classes fix the model's shape independently of y; inferred ones warn (see _labels).
        classes, y_idx = resolve_classes(self.classes, y, stacklevel=3)
        Z, bound = self._normalise(X, params)
        return Z, y_idx, classes, bound

    def _normalise(self, X: np.ndarray, params: dict[str, Any]) -> tuple[np.ndarray, float]:
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
        if self.fit_intercept:
            h = params["intercept_scaling"]
            Z = np.hstack([Z, np.full((len(Z), 1), h)]) / math.sqrt(1.0 + h * h)
        return Z, float(bound)

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
    def _settle(self, reservation: Any, ledger: Any, **spent: Any) -> None:
        """Settle the fit's reservation (if any) with what was spent; keep the ledger's record."""
        self.ledger_record_ = None if reservation is None else reservation.settle(**spent)
        self._ledger_used = ledger if reservation is not None else None

    def _check_not_recorded(self, ledger: Any) -> None:
        used = getattr(self, "_ledger_used", None)
        if used is not None and same_ledger(used, ledger):
            raise ValueError(
                f"this fit was already recorded in the ledger {getattr(ledger, 'path', ledger)} by fit(ledger=...); "
                "recording it again would count the same spend twice"
            )

    def record(self, ledger: Any, name: str | None = None) -> dict[str, Any]:
        """Record the privacy this fit spent in a :class:`featuredp.accounting.BudgetLedger`.

        One-shot mechanisms are recorded as their (``epsilon_``, ``delta_``) pair (basic
        composition with other pair spends). The ledger raises ``BudgetExceededError`` and
        records nothing if the spend does not fit. Returns the ledger's record.

        This runs *after* ``fit``: an overspend is found only once the mechanism has used the
        private data. Prefer the ``ledger=`` parameter, which reserves the spend before the
        mechanism runs and refuses with the data untouched. Recording a fit made with
        ``ledger=`` in the same ledger again is refused (it would count twice).
        """
        check_is_fitted(self)
        self._check_not_recorded(ledger)
        what = name or self._ledger_what()
        return ledger.spend(what, epsilon=self.epsilon_, delta=self.delta_)

    def _ledger_what(self) -> str:
        return f"{type(self).__name__} (replace-one)"

    def __sklearn_is_fitted__(self) -> bool:
        # validate_data sets n_features_in_ before a ledger can refuse the fit; only a model counts as fitted.
        return hasattr(self, "coef_")

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # Rows are validated against data_norm; NaN/inf can never satisfy a norm bound.
        tags.input_tags.allow_nan = False
        tags.non_deterministic = self.random_state is None
        return tags


def ovr_split(epsilon: float, delta: float, n_problems: int) -> list[tuple[float, float]]:
    """Basic composition: ``n_problems`` releases on the same data at (ε/K, δ/K) each sum to (ε, δ)."""
    return [(epsilon / n_problems, delta / n_problems)] * n_problems

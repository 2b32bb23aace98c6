"""Label-DP baselines: randomized response on labels, RR-with-prior and LP-2ST.

Label-DP (Ghazi et al. 2021, "Deep learning with label differential privacy") protects
only the label: neighbours differ in the label of one record (replace-one). It is
feature-DP with Ψ(x, y) = x (the paper's label-DP case study, §5). Each mechanism here releases *noisy labels*;
any classifier trained on them is post-processing.

* Randomized response (RR) over K classes keeps the label with probability
  e^ε/(e^ε + K − 1) and otherwise outputs one of the K − 1 others uniformly: ε-label-DP.
* RR-with-prior: given a prior p(·|x) that does not depend on this record's label, take
  the k most likely classes Y_k with k maximising e^ε/(e^ε + k − 1)·p(Y_k) and run RR
  inside Y_k (a label outside Y_k is replaced by a uniform draw from Y_k): ε-label-DP for
  any prior, because every output has probability in [1/(e^ε + k − 1), e^ε/(e^ε + k − 1)].
* LP-2ST: split the rows (label-independently) in two; stage 1 releases RR labels of part 1
  and trains a model on them; stage 2 uses that model's predicted probabilities as the
  prior of RR-with-prior on part 2; the final model trains on all noisy labels. Each label
  is randomised once, with a prior that depends only on *other* rows' released labels:
  parallel composition over the disjoint parts gives ε-label-DP in total.

The class set K of RR is part of the mechanism: :class:`LabelDPClassifier` takes it from
``classes=[...]`` (public knowledge). Reading it from the labels (``classes=None``) lets one
record's unique label change K, ``classes_`` and the output's shape — outside the ε bound —
and warns with ``PrivacyLeakWarning``. ``ledger=`` reserves ε before any label is randomised.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, clone
from sklearn.utils import get_tags
from sklearn.utils.validation import check_is_fitted, validate_data

from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.errors import DataValidationError, PrivacyLeakWarning
from featuredp.mechanisms._labels import resolve_classes
from featuredp.mechanisms._ledger import open_ledger, reserved, same_ledger
from featuredp.mechanisms.classic import RandomizedResponse
from featuredp.sampling import make_streams, warn_private_seed

METHODS = ("rr", "rr-prior", "lp-2st")


def rr_keep_probability(epsilon: float, n_classes: int) -> float:
    """Probability that K-ary randomized response reports the true label: e^ε/(e^ε + K − 1).

    >>> import math
    >>> rr_keep_probability(math.log(3), 2)
    0.75
    >>> round(rr_keep_probability(1.0, 10), 3)
    0.232
    """
    eps = check_positive("epsilon", epsilon)
    k = check_int("n_classes", n_classes, minimum=2)
    return 1.0 / (1.0 + (k - 1) * math.exp(-eps))


def _check_labels(y: Any, n_classes: int | None) -> tuple[np.ndarray, int]:
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataValidationError(
            f"y must be a 1-D array of class indices 0..K-1, got dtype {y.dtype}, shape {y.shape}"
        )
    k = int(y.max()) + 1 if n_classes is None else check_int("n_classes", n_classes, minimum=2)
    if len(y) and (y.min() < 0 or y.max() >= k):
        raise DataValidationError(f"y must hold class indices in 0..{k - 1}, got values in [{y.min()}, {y.max()}]")
    return y.astype(np.int64), k


def optimal_top_k(prior: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``prior`` (n, K): the classes sorted by prior (descending) and the k*
    maximising e^ε/(e^ε + k − 1)·(sum of the k largest priors) (ties: the smallest k)."""
    order = np.argsort(-prior, axis=1, kind="stable")
    mass = np.cumsum(np.take_along_axis(prior, order, axis=1), axis=1)
    k = np.arange(1, prior.shape[1] + 1)
    keep = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    best = np.argmax(mass * keep[None, :], axis=1) + 1
    return order, best


def _rr_in_sets(
    y: np.ndarray, order: np.ndarray, k: np.ndarray, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """RR restricted to each row's top-k set (rows: sorted classes ``order``, set sizes ``k``)."""
    n = len(y)
    rank = np.argmax(order == y[:, None], axis=1)  # position of the true label in the sorted order
    inside = rank < k
    keep_p = np.exp(epsilon) / (np.exp(epsilon) + k - 1)
    keep = inside & (rng.random(n) < keep_p)
    # Not kept and inside: uniform over the other k − 1 members; outside: uniform over all k members.
    j_other = np.floor(rng.random(n) * np.maximum(k - 1, 1)).astype(np.int64)
    j_other = j_other + (j_other >= rank)
    j_any = np.floor(rng.random(n) * k).astype(np.int64)
    pos = np.where(keep, rank, np.where(inside, j_other, j_any))
    return order[np.arange(n), np.minimum(pos, order.shape[1] - 1)]


def _label_noise_rng(random_state: int | np.random.Generator | None) -> np.random.Generator:
    """The label-noise generator; a seed warns, pointing at the caller of the public function."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is not None:
        # a known seed replays the noise: every randomized label can then be undone
        seed = check_int("random_state", random_state, minimum=0)
        warn_private_seed("random_state", seed, stacklevel=4)
        return make_streams(seed).noise
    return make_streams(None).noise


def randomized_response(
    y: Any, epsilon: float, n_classes: int | None = None, random_state: int | np.random.Generator | None = None
) -> np.ndarray:
    """K-ary randomized response on class indices ``y`` (ε-label-DP).

    Give ``n_classes`` (public knowledge). Without it K = max(y) + 1 is read from the private
    labels — one record holding the largest label changes K and so the output range, which the
    ε bound does not cover — and a ``PrivacyLeakWarning`` says so. ``random_state``: None (fresh
    OS entropy) for a real release; a seed replays the noise, so it is for tests only and warns.
    """
    eps = check_positive("epsilon", epsilon)
    if n_classes is None:
        warnings.warn(
            "randomized_response(n_classes=None) read the number of classes from the private labels (max(y) + 1): "
            "one record's label can change it, which the privacy guarantee does not cover; pass n_classes=K",
            PrivacyLeakWarning,
            stacklevel=2,
        )
    y, K = _check_labels(y, n_classes)
    rng = _label_noise_rng(random_state)
    return RandomizedResponse(eps, K).randomize(y, rng)


def rr_with_prior(
    y: Any, prior: Any, epsilon: float, random_state: int | np.random.Generator | None = None
) -> np.ndarray:
    """RR-with-prior (Ghazi et al. 2021, Alg. 2) on class indices ``y`` with per-row prior (n, K).

    The prior must not depend on the labels being randomised (e.g. a model trained on other
    rows' noisy labels, or on public data); then the output is ε-label-DP. ``random_state`` as in
    :func:`randomized_response` (a seed warns).
    """
    eps = check_positive("epsilon", epsilon)
    prior = np.asarray(prior, dtype=np.float64)
    if prior.ndim != 2 or prior.shape[1] < 2:
        raise DataValidationError(f"prior must have shape (n, K) with K >= 2, got {prior.shape}")
    y, _K = _check_labels(y, prior.shape[1])
    if len(y) != len(prior):
        raise DataValidationError(f"prior has {len(prior)} rows but y has {len(y)}")
    if not np.all(np.isfinite(prior)) or (prior < 0).any():
        raise DataValidationError("prior must hold finite non-negative probabilities")
    rng = _label_noise_rng(random_state)
    order, k = optimal_top_k(prior, eps)
    return _rr_in_sets(y, order, k, eps, rng)


def rr_with_prior_distribution(prior_row: Any, label: int, epsilon: float) -> np.ndarray:
    """The exact output distribution of RR-with-prior for one row (for audits and tests).

    >>> rr_with_prior_distribution([0.5, 0.3, 0.2], label=1, epsilon=1.0).round(4).tolist()
    [0.2689, 0.7311, 0.0]
    """
    prior_row = np.asarray(prior_row, dtype=np.float64)[None, :]
    orders, sizes = optimal_top_k(prior_row, epsilon)
    order, k = orders[0], int(sizes[0])
    K = prior_row.shape[1]
    out = np.zeros(K)
    top = order[:k]
    e = math.exp(epsilon)
    if label in top:
        out[top] = 1.0 / (e + k - 1)
        out[label] = e / (e + k - 1)
    else:
        out[top] = 1.0 / k
    return out


class LabelDPClassifier(MetaEstimatorMixin, ClassifierMixin, BaseEstimator):
    """Train any classifier on ε-label-DP noisy labels (RR, RR-with-prior or LP-2ST).

    Parameters
    ----------
    estimator : an unfitted scikit-learn classifier (cloned; trained on the noisy labels;
        for ``'lp-2st'`` it must have ``predict_proba``).
    epsilon : the label-DP ε (> 0). δ is 0.
    method : ``'rr'``, ``'rr-prior'`` (needs ``prior_model``) or ``'lp-2st'``.
    prior_model : for ``'rr-prior'``: a *fitted* classifier with ``predict_proba`` whose training
        did not use these labels (e.g. trained on public data); its probabilities are the prior.
    first_stage_fraction : for ``'lp-2st'``: the share of rows in stage 1.
    random_state : seed of the split and the label noise.
    classes : the class labels, declared from public knowledge. ``classes_`` is this list sorted;
        randomized response draws over exactly these K classes (so a declared class absent from y
        can still be released, as the ε bound requires) and ``predict_proba`` has one column per
        class; a label outside it raises ``DataValidationError``. None reads the classes from y,
        which the guarantee does not cover (K and the output shape change with one record's
        unique label): a ``PrivacyLeakWarning`` says so.
    ledger : None, a path to an existing budget ledger, or a
        :class:`featuredp.accounting.BudgetLedger`: ``fit`` reserves (ε, 0) before any label is
        randomised (``BudgetExceededError``, labels unused, ledger unchanged, if it does not fit)
        and settles it after. Safer than :meth:`record` after ``fit``.

    Attributes
    ----------
    estimator_ : the fitted classifier; classes_; epsilon_, delta_ (= 0); privacy_;
    ledger_record_ (the settled ledger record, None without ``ledger``).
    """

    def __init__(
        self,
        estimator: Any = None,
        epsilon: float = 1.0,
        method: str = "rr",
        prior_model: Any = None,
        first_stage_fraction: float = 0.5,
        random_state: int | None = None,
        classes: Any = None,
        ledger: Any = None,
    ) -> None:
        self.estimator = estimator
        self.epsilon = epsilon
        self.method = method
        self.prior_model = prior_model
        self.first_stage_fraction = first_stage_fraction
        self.random_state = random_state
        self.classes = classes
        self.ledger = ledger

    def _base(self) -> Any:
        if self.estimator is None:
            from sklearn.linear_model import LogisticRegression

            return LogisticRegression(max_iter=1000)
        return clone(self.estimator)

    def fit(self, X: Any, y: Any) -> LabelDPClassifier:
        """Randomise the labels of y, then fit the estimator on (X, noisy labels); returns self.

        Order: validate parameters and data (and compute an ``'rr-prior'`` prior, which reads X and
        the public prior model only), reserve ε in ``ledger`` if given, and only then randomise.
        """
        eps = check_positive("epsilon", self.epsilon)
        method = check_choice("method", self.method, METHODS)
        frac = check_open_unit("first_stage_fraction", self.first_stage_fraction)
        if method == "rr-prior" and (self.prior_model is None or not hasattr(self.prior_model, "predict_proba")):
            raise ValueError(
                f"method='rr-prior' needs prior_model: a fitted classifier with predict_proba trained without "
                f"these labels; got {self.prior_model!r}"
            )
        seed = None if self.random_state is None else check_int("random_state", self.random_state, minimum=0)
        if seed is not None:
            warn_private_seed("random_state", seed)
        ledger = open_ledger(self.ledger)
        X, y = validate_data(self, X, y, accept_sparse=True, dtype=None, ensure_all_finite=False)
        # K is a parameter of RR: declared, it cannot depend on any one record's label (see module docstring).
        classes, y_idx = resolve_classes(self.classes, y, stacklevel=2)
        K = len(classes)
        prior = None
        if method == "rr-prior":
            # Reads X (public under label-DP) and the public prior model only; done before the reservation
            # so a model that does not fit these classes fails without spending.
            prior = self._aligned_proba(self.prior_model, X, K, classes)
        with reserved(ledger, self._ledger_what(), epsilon=eps, delta=0.0) as reservation:
            # The reservation is held: only now set fitted attributes and let the labels meet the mechanism
            # (a refused fit leaves a previous fit's classes_ and epsilon_ consistent with its estimator_).
            self.classes_ = classes
            streams = make_streams(seed)
            if method == "rr":
                noisy = randomized_response(y_idx, eps, K, streams.noise)
            elif method == "rr-prior":
                noisy = rr_with_prior(y_idx, prior, eps, streams.noise)
            else:
                noisy = self._lp_2st(X, y_idx, K, eps, frac, streams)
            self.ledger_record_ = None if reservation is None else reservation.settle(epsilon=eps, delta=0.0)
            self._ledger_used = ledger if reservation is not None else None
        # Everything below reads only the released noisy labels (post-processing).
        if len(np.unique(noisy)) < 2:
            # The mechanism's output (post-processing): every released label is one class — e.g. RR-with-prior
            # at small ε with a skewed prior. Most classifiers refuse one class; predict that class instead.
            warnings.warn(
                f"all noisy labels are class {self.classes_[noisy[0]]!r}; fitting a constant predictor",
                UserWarning, stacklevel=2,
            )
            from sklearn.dummy import DummyClassifier

            self.estimator_ = DummyClassifier(strategy="most_frequent").fit(X, self.classes_[noisy])
        else:
            self.estimator_ = self._base().fit(X, self.classes_[noisy])
        self.epsilon_, self.delta_ = eps, 0.0
        self.privacy_ = {"method": f"label-dp-{method}", "guarantee": "label-DP", "relation": "replace-one",
                         "epsilon": eps, "delta": 0.0, "n": len(y_idx), "classes": K}
        return self

    def _aligned_proba(self, model: Any, X: Any, K: int, classes: np.ndarray | None = None) -> np.ndarray:
        """predict_proba mapped onto the K ``classes`` (default ``classes_``; missing classes get probability 0)."""
        classes = self.classes_ if classes is None else classes
        proba = np.asarray(model.predict_proba(X), dtype=np.float64)
        model_classes = np.asarray(getattr(model, "classes_", classes))
        # searchsorted alone would silently map a class we do not have onto a neighbouring column.
        try:
            cols = np.minimum(np.searchsorted(classes, model_classes), K - 1)
            aligned = bool(np.all(classes[cols] == model_classes))
        except TypeError:  # incomparable label types (e.g. None among strings)
            cols, aligned = np.zeros(0, dtype=np.int64), False
        if proba.ndim != 2 or proba.shape[1] != len(model_classes) or not aligned:
            raise DataValidationError(
                f"{type(model).__name__} predicts classes {model_classes.tolist()!r} with probabilities of shape "
                f"{proba.shape}, which do not map onto classes_={classes.tolist()!r}"
            )
        out = np.zeros((proba.shape[0], K))
        out[:, cols] = proba
        return out

    def _lp_2st(self, X: Any, y_idx: np.ndarray, K: int, eps: float, frac: float, streams: Any) -> np.ndarray:
        n = len(y_idx)
        perm = streams.draws.permutation(n)  # label-independent split
        n1 = min(max(1, round(frac * n)), n - 1)
        first, second = perm[:n1], perm[n1:]
        noisy = np.empty(n, dtype=np.int64)
        noisy[first] = randomized_response(y_idx[first], eps, K, streams.noise)
        stage1 = self._base()
        if len(np.unique(noisy[first])) >= 2:
            stage1.fit(X[first], self.classes_[noisy[first]])
            prior = self._aligned_proba(stage1, X[second], K)
        else:  # degenerate stage 1: fall back to the uniform prior (= plain RR)
            prior = np.full((len(second), K), 1.0 / K)
        noisy[second] = rr_with_prior(y_idx[second], prior, eps, streams.noise)
        return noisy

    def predict(self, X: Any) -> np.ndarray:
        """Predictions of the estimator trained on noisy labels."""
        check_is_fitted(self)
        return self.estimator_.predict(X)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities of the estimator trained on noisy labels, one column per ``classes_``
        (0 for a class that no noisy label took)."""
        check_is_fitted(self)
        return self._aligned_proba(self.estimator_, X, len(self.classes_))

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # Inputs go straight to the wrapped estimator: accept what it accepts.
        base = get_tags(self._base())
        tags.input_tags.sparse = base.input_tags.sparse
        tags.input_tags.allow_nan = base.input_tags.allow_nan
        tags.non_deterministic = self.random_state is None
        return tags

    def record(self, ledger: Any, name: str | None = None) -> dict[str, Any]:
        """Record the label-DP spend (ε, 0) in a :class:`featuredp.accounting.BudgetLedger`.

        Raises ``BudgetExceededError`` (recording nothing) if it does not fit the budget. This runs
        *after* ``fit``, when the labels were already randomised: prefer ``ledger=``, which reserves
        ε before and refuses an overspend with the labels untouched. Recording a fit made with
        ``ledger=`` in the same ledger again is refused (it would count twice).
        """
        check_is_fitted(self)
        used = getattr(self, "_ledger_used", None)
        if used is not None and same_ledger(used, ledger):
            raise ValueError(
                f"this fit was already recorded in the ledger {getattr(ledger, 'path', ledger)} by fit(ledger=...); "
                "recording it again would count the same spend twice"
            )
        return ledger.spend(name or self._ledger_what(), epsilon=self.epsilon_, delta=self.delta_)

    def _ledger_what(self) -> str:
        return f"LabelDPClassifier[{self.method}] label-DP"

    def __sklearn_is_fitted__(self) -> bool:
        # validate_data sets n_features_in_ before a ledger can refuse the fit; only a model counts as fitted.
        return hasattr(self, "estimator_")

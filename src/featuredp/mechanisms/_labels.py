"""The class set of a private classifier: declared (public) or read from the labels (a leak).

Why this matters: a classifier's shape — ``classes_``, the rows of ``coef_``, the columns of
``predict_proba``, the number of one-vs-rest problems and so the budget split, K in
randomized response — is released with the model. If it is ``np.unique(y)``, one record
holding a label nobody else has changes that shape between neighbouring datasets: the
difference is visible with certainty, ε = ∞ for that record, whatever noise is added
afterwards. The cure is to declare the class set up front (``classes=[...]``), from
knowledge that is not the private labels (a schema, a data dictionary, the task).

Shared by the sklearn-style private estimators: :mod:`featuredp.mechanisms.labeldp` and :mod:`featuredp.erm`
(which imports it from here, so that the mechanisms never import the estimators built on them).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.utils.multiclass import check_classification_targets

from featuredp.errors import DataValidationError, PrivacyLeakWarning

# Longest class list quoted in full in an error message (the message stays one line).
_MAX_QUOTED = 10


def check_classes(classes: object) -> np.ndarray:
    """Validate a declared class set; return it sorted (as ``np.unique`` / scikit-learn order).

    Sorting matches scikit-learn (``LabelEncoder``, ``SGDClassifier.partial_fit(classes=)``):
    column k of ``predict_proba`` is ``classes_[k]`` and does not depend on how the list was
    written. Duplicates are refused rather than merged: a repeated entry is most likely a typo
    for a missing class, and merging it silently would change the model's shape.
    """
    if isinstance(classes, (str, bytes)) or not hasattr(classes, "__len__"):
        raise ValueError(f"classes must be a list of at least 2 class labels, got {classes!r}")
    arr = np.asarray(classes)
    if arr.ndim != 1:
        raise ValueError(f"classes must be a flat list of class labels, got shape {arr.shape}")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise ValueError(f"classes must hold finite labels, got {_quote(arr)}")
    try:
        uniq = np.unique(arr)
    except TypeError as exc:  # e.g. a mix of str and int, which has no order
        raise ValueError(f"classes must be mutually comparable labels (one type), got {_quote(arr)}: {exc}") from None
    if len(uniq) != len(arr):
        raise ValueError(f"classes has duplicate entries: {_quote(arr)}; declare each class once")
    if len(uniq) < 2:
        raise ValueError(f"classes must declare at least 2 classes to train a classifier, got {_quote(arr)}")
    return uniq


def infer_classes_with_warning(y: np.ndarray, stacklevel: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(y)`` and the label indices (the old behaviour), with a ``PrivacyLeakWarning``
    saying what that leaks."""
    check_classification_targets(y)
    classes, y_idx = np.unique(y, return_inverse=True)
    warnings.warn(
        f"classes=None: the class set ({len(classes)} {'class' if len(classes) == 1 else 'classes'}) was read from "
        "the private labels y, so a label held by a single record changes classes_ and the model's shape, which the "
        "privacy guarantee does not cover; declare every possible label from public knowledge (a schema, the task "
        "definition) with classes=[...], e.g. classes=[0, 1]",
        PrivacyLeakWarning,
        stacklevel=stacklevel + 1,
    )
    if len(classes) < 2:
        raise DataValidationError(
            f"y needs at least 2 classes to train a classifier, got 1 class ({classes.tolist()[0]!r}); "
            "or declare classes=[...]"
        )
    return classes, y_idx.astype(np.int64)


def encode_labels(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Indices of ``y`` in the sorted declared ``classes``; a label outside them is a ``DataValidationError``."""
    y = np.asarray(y)
    k = len(classes)
    same_kind = (y.dtype.kind in "biuf" and classes.dtype.kind in "biuf") or (
        y.dtype.kind in "US" and classes.dtype.kind in "US"
    )
    if same_kind:
        pos = np.minimum(np.searchsorted(classes, y), k - 1)
        known = classes[pos] == y
    else:
        # Mixed or object dtypes (e.g. str labels vs int classes): numpy comparison would be elementwise-undefined.
        # Python equality/hash also matches 1 == 1.0 == np.int64(1), as the numeric path does.
        index = {c: i for i, c in enumerate(classes.tolist())}
        found = [index.get(v, -1) if _hashable(v) else -1 for v in y.tolist()]
        pos = np.asarray(found, dtype=np.int64)
        known = pos >= 0
    if not known.all():
        bad = y[~known].tolist()
        raise DataValidationError(
            f"y holds label {bad[0]!r}, which is not in the declared classes={_quote(classes)}; add it to classes "
            "or remove the rows with that label"
        )
    return pos.astype(np.int64)


def resolve_classes(declared: object, y: np.ndarray, stacklevel: int) -> tuple[np.ndarray, np.ndarray]:
    """(``classes_``, label indices): the declared set when given, else the labels' own (with a warning)."""
    if declared is None:
        return infer_classes_with_warning(y, stacklevel + 1)
    classes = check_classes(declared)
    return classes, encode_labels(y, classes)


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _quote(arr: np.ndarray) -> str:
    items = arr.tolist()
    if len(items) <= _MAX_QUOTED:
        return repr(items)
    return repr(items[:_MAX_QUOTED])[:-1] + f", ... ({len(items)} in all)]"

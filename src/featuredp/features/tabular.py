"""Public feature maps Ψ: what of a record is public.

A :class:`PublicFeatureMap` is *declared* by the user (never inferred from the
data). Given a batch — a dict of batch-first tensors such as ``"x"`` (float
features), ``"y"`` (int64 labels) and ``"x_cat"`` (int64 category codes, ``-1``
= masked) — it returns the *public view* Ψ(batch): the only thing the public
loss ℓ_pub may read. Private entries are removed (a whole key) or replaced by a
fixed constant (0 for features, -1 for category codes), so nothing private can
leak into ℓ_pub through the view.

Maps:

* :class:`Columns` — some raw columns of a tabular dataset are private
  (optionally the label too);
* :class:`LabelPrivate` — Ψ(x, y) = x (label differential privacy);
* :class:`FunctionMap` — a user function batch → public view.

Image maps (a Gaussian blur, pixelation, masks) are in :mod:`featuredp.features.image`.

Binding is where the private set actually used for training meets the data, so
:meth:`Columns.bind` and :meth:`LabelPrivate.bind` check the dataset's recorded
provenance (``statistics_from_data``): a private column whose scaling bounds or
category list, or a private label whose class list, was computed from the data
raises :class:`~featuredp.errors.PrivacyLeakWarning` — whatever was declared
private when the dataset was loaded.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from featuredp.errors import DataValidationError, PrivacyLeakWarning
from featuredp.features.base import Batch, PublicFeatureMap
from featuredp.plan import Disclosure

__all__ = ["Columns", "FunctionMap", "LabelPrivate"]


def _raw_columns(dataset: Any) -> list[str]:
    """Raw column names of a TabularDataset, in order of first appearance."""
    names: list[str] = []
    for src in list(dataset.feature_sources) + list(getattr(dataset, "cat_sources", None) or []):
        if src not in names:
            names.append(src)
    return names


# The kinds of featuredp.data.tabular.STATISTIC_KINDS; not imported so that Ψ does not pull in pandas.
_STATISTIC_NAMES = {"bounds": "bounds: min/max", "categories": "category list", "classes": "class list"}
_FIX_OPTIONS = {"bounds": "bounds=", "categories": "categories=", "classes": "classes="}


def _private_statistics_from_data(dataset: Any, private: Iterable[str], label_private: bool) -> dict[str, str]:
    """The private columns (and label) whose encoding statistic was computed from the data.

    Maps the column to the statistic (``"bounds"``, ``"categories"``, ``"classes"``),
    read from ``dataset.statistics_from_data``; empty when the dataset records no
    provenance (built by hand) or when every private statistic is public knowledge.
    """
    recorded = getattr(dataset, "statistics_from_data", None)
    if not recorded:
        return {}
    wanted = list(dict.fromkeys(private))
    label = getattr(dataset, "label_name", None)
    if label_private and label is not None:
        wanted.append(str(label))
    return {c: str(recorded[c]) for c in wanted if c in recorded}


def _warn_statistics_from_data(dataset: Any, leaked: dict[str, str], reported: set[tuple[str, ...]]) -> None:
    """Warn (PrivacyLeakWarning) about ``leaked`` unless already said for this dataset.

    Entries the dataset's loader already warned about (``statistics_warned``: the columns
    declared private at load time) are not repeated, nor is a warning this map already
    gave (maps are bound more than once per run: by the caller, then by the trainer).
    """
    already = set(getattr(dataset, "statistics_warned", None) or ())
    new = {c: k for c, k in leaked.items() if c not in already}
    if not new:
        return
    name = str(getattr(dataset, "name", "dataset"))
    key = (name, *sorted(f"{c}:{k}" for c, k in new.items()))
    if key in reported:
        return
    reported.add(key)
    listed = ", ".join(f"{c} ({_STATISTIC_NAMES.get(k, k)})" for c, k in new.items())
    options = " / ".join(v for k, v in _FIX_OPTIONS.items() if k in set(new.values()))
    warnings.warn(
        f"{name}: the feature map makes private column(s) whose encoding statistics were computed from the "
        f"data: {listed}. These statistics depend on private values and are not covered by the privacy "
        f"guarantee; load the dataset with public {options} (a codebook, or a schema: featuredp data schema, "
        "docs/own-data.md) so they are fixed in advance",
        PrivacyLeakWarning,
        stacklevel=3,
    )


def _encoded_names(dataset: Any, private: set[str], from_data: dict[str, str]) -> tuple[list[str], dict[str, int]]:
    """The private encoded column names that describe() may show, and the columns whose names are hidden.

    A one-hot name of a private column whose categories were read from the data names a private value
    (``"diag=HIV-positive"``, perhaps held by one record), so it is shown as ``"diag=<category 3 of 5>"``;
    only the count is kept (it is public anyway: the model's width).
    """
    hidden = {c for c, kind in from_data.items() if kind == "categories"}
    counts = {c: n for c in hidden if (n := sum(1 for s in dataset.feature_sources if s == c))}
    seen = dict.fromkeys(counts, 0)
    names = []
    for name, source in zip(dataset.feature_names, dataset.feature_sources):
        if source not in private:
            continue
        if source in counts:
            seen[source] += 1
            name = f"{source}=<category {seen[source]} of {counts[source]}>"
        names.append(str(name))
    return names, counts


class Columns(PublicFeatureMap):
    """Some raw columns of a tabular dataset are private; the rest are public.

    Give exactly one of ``private`` (the private raw columns) or ``public`` (the
    public raw columns; all others are private). Raw names are those a user
    writes (``"sex"``, ``"race"``); :meth:`bind` maps them to the encoded
    columns (one-hot ``"sex=Female"``, ...) through ``feature_sources`` and to
    the code columns through ``cat_sources``. Naming the label column among the
    private ones is the same as ``label_private=True``.

    The public view keeps ``"x"`` with private encoded columns set to 0,
    ``"x_cat"`` with private code columns set to -1 (the sparse models' "masked"
    code), and drops ``"y"`` when the label is private.

    :meth:`bind` warns (:class:`~featuredp.errors.PrivacyLeakWarning`) when a
    private column's bounds or category list, or a private label's class list,
    was computed from the data (the dataset's ``statistics_from_data``), even if
    the column was public when the dataset was loaded.
    """

    def __init__(
        self,
        private: Iterable[str] | None = None,
        *,
        public: Iterable[str] | None = None,
        label_private: bool = False,
    ) -> None:
        if (private is None) == (public is None):
            raise ValueError("give exactly one of private=[...] or public=[...] to Columns")
        if isinstance(private, str) or isinstance(public, str):
            raise TypeError("private/public must be a list of column names, not a string; e.g. private=['sex', 'race']")
        self._private_arg = None if private is None else [str(c) for c in private]
        self._public_arg = None if public is None else [str(c) for c in public]
        self.label_private = bool(label_private)
        self.private_columns: list[str] | None = None
        self.public_columns: list[str] | None = None
        self.label_name: str | None = None
        self._x_mask: torch.Tensor | None = None
        self._cat_mask: torch.Tensor | None = None
        self._encoded_private: list[str] = []
        self._hidden_categories: dict[str, int] = {}  # private columns whose category values are not shown
        self._statistics_from_data: dict[str, str] = {}
        self._reported: set[tuple[str, ...]] = set()

    # -- binding -------------------------------------------------------------------------------------
    def bind(self, dataset: Any) -> Columns:
        """Resolve raw names against ``dataset`` (a TabularDataset); unknown names raise DataValidationError.

        Warns (PrivacyLeakWarning) when a private column or a private label has an
        encoding statistic computed from the data (see the class docstring).
        """
        for attr in ("feature_names", "feature_sources", "label_name"):
            if not hasattr(dataset, attr):
                raise TypeError(f"Columns.bind needs a TabularDataset (missing {attr!r}), got {type(dataset).__name__}")
        available = _raw_columns(dataset)
        label = str(dataset.label_name)
        given = self._private_arg if self._private_arg is not None else self._public_arg
        assert given is not None
        unknown = [c for c in given if c not in available and c != label]
        if unknown:
            raise DataValidationError(
                f"unknown column(s) {unknown} in dataset {getattr(dataset, 'name', '?')!r}; "
                f"available columns: {', '.join(available)} (label: {label})"
            )
        label_private = self.label_private
        if self._private_arg is not None:
            private = [c for c in dict.fromkeys(self._private_arg) if c != label]
            label_private = label_private or label in self._private_arg
        else:
            public = set(self._public_arg or [])
            if label in public and self.label_private:
                raise ValueError(f"label {label!r} is listed as public but label_private=True")
            private = [c for c in available if c not in public]
        if not private and not label_private:
            raise DataValidationError(
                "the private set is empty: nothing would be protected; name at least one private column "
                f"(available: {', '.join(available)}) or use method='nonprivate'"
            )
        if len(private) == len(available):
            raise DataValidationError(
                f"every feature column is private ({', '.join(private)}): the public view would hold "
                "nothing to learn from; use ordinary DP-SGD (method='dpsgd') instead"
            )
        self.private_columns = private
        self.public_columns = [c for c in available if c not in private]
        self.label_private = label_private
        self.label_name = label
        priv = set(private)
        self._x_mask = torch.tensor([s in priv for s in dataset.feature_sources], dtype=torch.bool)
        cat_sources = getattr(dataset, "cat_sources", None)
        self._cat_mask = (
            None if cat_sources is None else torch.tensor([s in priv for s in cat_sources], dtype=torch.bool)
        )
        # The private set is final only here (it may differ from the one declared at load time),
        # so this is where statistics read from private data must be caught.
        self._statistics_from_data = _private_statistics_from_data(dataset, private, label_private)
        _warn_statistics_from_data(dataset, self._statistics_from_data, self._reported)
        self._encoded_private, self._hidden_categories = _encoded_names(dataset, priv, self._statistics_from_data)
        return self

    def _require_bound(self) -> None:
        if self._x_mask is None:
            raise RuntimeError("Columns is not bound to a dataset yet: call .bind(dataset) first")

    # -- the view ------------------------------------------------------------------------------------
    def __call__(self, batch: Batch) -> Batch:
        """The view: private ``x`` columns 0, private ``x_cat`` codes -1, ``y`` dropped if private."""
        self._require_bound()
        assert self._x_mask is not None
        view: Batch = {}
        for key, value in batch.items():
            if key == "y" and self.label_private:
                continue  # the label is private: drop it
            if key == "x":
                if value.shape[-1] != self._x_mask.numel():
                    raise DataValidationError(
                        f"batch['x'] has {value.shape[-1]} columns, Columns was bound to {self._x_mask.numel()}"
                    )
                # torch.where, not multiplication: a private NaN/inf must not survive as NaN.
                zero = torch.zeros((), dtype=value.dtype, device=value.device)
                value = torch.where(self._x_mask.to(value.device), zero, value)
            elif key == "x_cat" and self._cat_mask is not None:
                masked = torch.full((), -1, dtype=value.dtype, device=value.device)
                value = torch.where(self._cat_mask.to(value.device), masked, value)
            view[key] = value
        return view

    def private_entries(self) -> dict[str, torch.Tensor]:
        """The private encoded columns of ``x`` and, with codes, of ``x_cat`` (CPU masks)."""
        self._require_bound()
        assert self._x_mask is not None
        out = {"x": self._x_mask}
        if self._cat_mask is not None:
            out["x_cat"] = self._cat_mask
        return out

    def describe(self) -> Disclosure:
        """The public and the private columns (before binding: as declared)."""
        if self._x_mask is None:
            given = self._private_arg if self._private_arg is not None else self._public_arg
            declared = f"the private columns {self._private_arg}" if self._private_arg is not None else (
                f"every column but {self._public_arg}")
            return Disclosure(
                "Columns",
                reveals=f"the public columns {self._public_arg}" if self._public_arg is not None
                else f"every column but {self._private_arg}",
                hides=declared + (" and the label" if self.label_private else ""),
                details={"bound": False, "private": self._private_arg, "public": self._public_arg,
                         "label_private": self.label_private, "declared": given},
            )
        return Disclosure(
            "Columns",
            reveals=f"the public columns {self.public_columns}"
            + ("" if self.label_private else f" and the label {self.label_name!r}"),
            hides=" and ".join(
                ([f"the private columns {self.private_columns}"] if self.private_columns else [])
                + ([f"the label {self.label_name!r}"] if self.label_private else [])
            ),
            details={
                "private_columns": list(self.private_columns or []),
                "public_columns": list(self.public_columns or []),
                "private_encoded_columns": list(self._encoded_private),
                "label": self.label_name,
                "label_private": self.label_private,
            } | (
                # Only when there is something to say, so reports of clean runs keep their shape.
                {"private_statistics_from_data": dict(self._statistics_from_data)} if self._statistics_from_data
                else {}
            ) | (
                {"private_categories": {c: f"{k} read from the data (not listed: private)"
                                        for c, k in self._hidden_categories.items()}}
                if self._hidden_categories else {}
            ),
        )


class LabelPrivate(PublicFeatureMap):
    """Ψ(x, y) = x: the features are public, the label is private (label DP).

    >>> sorted(LabelPrivate()({"x": torch.ones(2, 3), "y": torch.tensor([0, 1])}))
    ['x']
    >>> LabelPrivate().describe().hides
    "the label ('y')"
    """

    def __init__(self, label_key: str = "y") -> None:
        self.label_key = label_key
        self._reported: set[tuple[str, ...]] = set()

    def bind(self, dataset: Any) -> LabelPrivate:
        """Accept any dataset; warns (PrivacyLeakWarning) if its label's class list was read from the data."""
        _warn_statistics_from_data(dataset, _private_statistics_from_data(dataset, (), True), self._reported)
        return self

    def __call__(self, batch: Batch) -> Batch:
        """The batch without the label."""
        return {k: v for k, v in batch.items() if k != self.label_key}

    def describe(self) -> Disclosure:
        """Every feature is public; the label is hidden."""
        return Disclosure("LabelPrivate", reveals="all features", hides=f"the label ({self.label_key!r})",
                          details={"label_private": True})


class FunctionMap(PublicFeatureMap):
    """Ψ given as a user function ``fn(batch) -> public view``.

    The function must be per example and must not read private entries; the
    library cannot check this, so ``description`` must say what it reveals and
    ``hides`` what it removes (the guarantee names it; default "what the function
    removes"). ``private`` optionally lists masks as in
    :meth:`PublicFeatureMap.private_entries`.

    >>> first = FunctionMap(lambda b: {"x": b["x"][:, :1], "y": b["y"]}, "the first column and the label",
    ...                     hides="every column but the first")
    >>> first({"x": torch.ones(2, 3), "y": torch.tensor([0, 1])})["x"].shape
    torch.Size([2, 1])
    """

    def __init__(
        self,
        fn: Callable[[Batch], Batch],
        description: str,
        *,
        private: dict[str, torch.Tensor | Sequence[bool]] | None = None,
        hides: str = "what the function removes from each record",
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if not isinstance(description, str) or not description.strip():
            raise ValueError("description must say what the function reveals, got an empty description")
        self.fn = fn
        self.description = description
        if not isinstance(hides, str) or not hides.strip():
            raise ValueError("hides must say what the function removes, got an empty phrase")
        self.hides = hides
        self._private = {k: torch.as_tensor(v, dtype=torch.bool) for k, v in (private or {}).items()}

    def __call__(self, batch: Batch) -> Batch:
        """``fn`` applied to a shallow copy of the batch."""
        view = self.fn(dict(batch))
        if not isinstance(view, dict):
            raise TypeError(f"the feature map function must return a dict of tensors, got {type(view).__name__}")
        return view

    def private_entries(self) -> dict[str, torch.Tensor]:
        """The masks given as ``private`` (CPU; callers move them to the batch's device)."""
        return dict(self._private)

    def describe(self) -> Disclosure:
        """What the user's ``description`` says the function reveals and hides."""
        return Disclosure("FunctionMap", reveals=self.description, hides=self.hides,
                          details={"function": getattr(self.fn, "__name__", repr(self.fn))})

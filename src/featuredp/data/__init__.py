"""Datasets for feature-DP experiments.

``load_dataset(name, **options) -> (train, test)`` returns two
:class:`TabularDataset` objects. Names:

===================  ===========================================================
``adult``            UCI Adult, bundled (no download); sex, race private
``census-income``    Census-Income (KDD); fetched into the cache on first use
``purchase-style``   Purchase100 stand-in built from Census-Income (525 binary, 100 classes)
``criteo-style``     Criteo stand-in built from Census-Income (numeric public, categorical private)
``purchase100``      the real Purchase100 file you have (``path=``; CSV or NPZ)
``criteo``           a Criteo display-ads TSV you have (``path=``)
``csv``              your own CSV/Parquet with a column spec (``path=``, ``label=``, ...)
===================  ===========================================================

Census-based sets download themselves on first use (sha256-checked, atomic, a progress
bar; ``FEATUREDP_OFFLINE=1`` forbids it, see :mod:`featuredp.data.cache`). Your own
table's columns can be declared in a schema file (:mod:`featuredp.data.schema`).
Image datasets live in :mod:`featuredp.data.images`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from featuredp.data.schema import Schema, read_schema
from featuredp.data.tabular import TableSpec, TabularDataset, encode_frames


@dataclass(frozen=True)
class DatasetInfo:
    """What a named dataset is, where it comes from and what it declares private."""

    name: str
    loader: str  # "module:function", imported lazily
    summary: str
    default_private: tuple[str, ...]
    needs_fetch: bool = False  # True: downloaded into the cache on first use (not with FEATUREDP_OFFLINE=1)
    needs_path: bool = False  # True: the user supplies the file (path=...)


_REGISTRY: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo("adult", "featuredp.data.adult:load_adult",
                    "UCI Adult 1994, bundled; 32,561/16,281; label income>50K", ("sex", "race")),
        DatasetInfo("census-income", "featuredp.data.census:load_census_income",
                    "Census-Income (KDD) 1994-95; 199,523/99,762; label income>50K", ("sex", "race"),
                    needs_fetch=True),
        DatasetInfo("purchase-style", "featuredp.data.purchase:load_purchase_style",
                    "Purchase100 stand-in from Census-Income: 525 binary features, 100 k-means classes",
                    ("425 of 525 features",), needs_fetch=True),
        DatasetInfo("criteo-style", "featuredp.data.criteo:load_criteo_style",
                    "Criteo stand-in from Census-Income: numeric public, categorical private (X_cat codes)",
                    ("all categorical columns",), needs_fetch=True),
        DatasetInfo("purchase100", "featuredp.data.purchase:load_purchase100",
                    "your Purchase100 file (label then 600 binary features; CSV or NPZ)", ("500 of 600 features",),
                    needs_path=True),
        DatasetInfo("criteo", "featuredp.data.criteo:load_criteo",
                    "your Criteo display-ads TSV (label, I1-I13, C1-C26)", ("C1..C26",), needs_path=True),
        DatasetInfo("csv", "featuredp.data.files:load_table",
                    "your CSV/Parquet with a column spec (label, numeric, categorical, public/private)", (),
                    needs_path=True),
    )
}  # fmt: skip


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_dataset`."""
    return list(_REGISTRY)


def dataset_info(name: str) -> DatasetInfo:
    """The registry entry of ``name`` (ValueError naming the choices if unknown)."""
    if name not in _REGISTRY:
        raise ValueError(f"dataset must be one of {', '.join(map(repr, _REGISTRY))}; got {name!r}")
    return _REGISTRY[name]


def load_dataset(name: str, **options: Any) -> tuple[TabularDataset, TabularDataset]:
    """Load dataset ``name`` as ``(train, test)``; ``options`` go to its loader (see module doc)."""
    info = dataset_info(name)
    module, func = info.loader.split(":")
    return getattr(importlib.import_module(module), func)(**options)


__all__ = [
    "DatasetInfo",
    "Schema",
    "TableSpec",
    "TabularDataset",
    "available_datasets",
    "dataset_info",
    "encode_frames",
    "load_dataset",
    "read_schema",
]

"""The public feature map Ψ: the contract every map keeps, and the batch type.

A :class:`PublicFeatureMap` is *declared* by the user (never inferred from the
data). Given a batch (a dict of batch-first tensors, see :mod:`featuredp.batches`)
it returns the *public view* Ψ(batch): the only thing the public loss ℓ_pub may
read. Its ``describe()`` returns a :class:`~featuredp.plan.Disclosure`.

Adding a public feature map takes two files:

1. The class, in a module of this package (``tabular.py``, ``image.py`` or a new
   one): subclass :class:`PublicFeatureMap` (or
   :class:`~featuredp.features.image.ImageFeatureMap` for an image transform).
   ``__call__`` returns a new dict, per example, deterministic, reading only the
   public part of each record, with every tensor it makes on the input's device;
   ``describe()`` returns a :class:`~featuredp.plan.Disclosure` whose ``hides``
   completes the guarantee's "protecting ..."; override :meth:`~PublicFeatureMap.private_entries`
   if it hides entries by position and :meth:`~PublicFeatureMap.bind` if it needs
   the dataset. Re-export it from :mod:`featuredp.features` if it is public API.
2. Its zoo entry in ``tests/features/test_feature_map_contract.py``: how to build the map
   with a small batch and, unless its ``private_entries()`` masks and dropped keys
   already say what is private, how to change only what it hides. The contract
   suite finds every concrete map class of this package by itself and fails for
   one without a zoo entry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from featuredp.plan import Disclosure

Batch = dict[str, torch.Tensor]

__all__ = ["Batch", "Disclosure", "PublicFeatureMap"]


class PublicFeatureMap(ABC):
    """Ψ: a batch → its public view (subclass and implement ``__call__`` and ``describe``).

    Contract: ``__call__`` is per example (no mixing across the batch dimension,
    it must work on a batch of one under ``torch.func.vmap``), deterministic, and
    its output depends only on the public part of each record.
    """

    def bind(self, dataset: Any) -> PublicFeatureMap:
        """Validate the map against a dataset and resolve names; returns ``self``.

        The default accepts any dataset (maps that need no column names).
        """
        return self

    @abstractmethod
    def __call__(self, batch: Batch) -> Batch:
        """The public view Ψ(batch): a new dict; the input batch is not modified."""

    @abstractmethod
    def describe(self) -> Disclosure:
        """What Ψ reveals and what it hides (the privacy report; the guarantee names ``hides``)."""

    def private_entries(self) -> dict[str, torch.Tensor]:
        """Per batch key, a boolean mask over one example's entries that Ψ hides (True = private).

        Which entries are private is itself public (it is declared), so loss
        splits may use these masks, e.g. to pad private positions with noise.
        Keys that are wholly hidden (removed from the view) are not listed here.
        """
        return {}

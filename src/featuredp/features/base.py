"""The public feature map Ψ: the contract every map keeps, and the batch type.

A :class:`PublicFeatureMap` is *declared* by the user (never inferred from the
data). Given a batch (a dict of batch-first tensors, see :mod:`featuredp.batches`)
it returns the *public view* Ψ(batch): the only thing the public loss ℓ_pub may
read. Its ``describe()`` returns a :class:`~featuredp.plan.Disclosure`.
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

"""Public feature maps Ψ: what of a record is public.

* :mod:`featuredp.features.base` — the contract (:class:`PublicFeatureMap`, ``describe() -> Disclosure``);
* :mod:`featuredp.features.tabular` — :class:`Columns`, :class:`LabelPrivate`, :class:`FunctionMap`;
* :mod:`featuredp.features.image` — :class:`GaussianBlur`, :class:`Pixelate`, :class:`BoxMask`;
* :mod:`featuredp.features.text` — Ψ for text on strings: private spans (annotated or detected) replaced by typed
  placeholders (:class:`~featuredp.features.text.TextSpans`);
* :mod:`featuredp.features.tokens` — Ψ on token batches: :class:`TokenView` (the tokens of Ψ(text)).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from featuredp.features.base import Batch, Disclosure, PublicFeatureMap
    from featuredp.features.image import BoxMask, GaussianBlur, ImageFeatureMap, Pixelate
    from featuredp.features.tabular import Columns, FunctionMap, LabelPrivate
    from featuredp.features.tokens import TokenView

# The names are imported on first use (PEP 562): featuredp.features.text (Ψ on strings) needs no torch, and
# `featuredp data scan` must run without importing it; every map on tensors lives in a module that does.
_WHERE = {"Batch": "base", "Disclosure": "base", "PublicFeatureMap": "base", "BoxMask": "image",
          "GaussianBlur": "image", "ImageFeatureMap": "image", "Pixelate": "image", "Columns": "tabular",
          "FunctionMap": "tabular", "LabelPrivate": "tabular", "TokenView": "tokens"}  # fmt: skip


def __getattr__(name: str) -> Any:
    """The map classes, imported from their module on first use."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"featuredp.features.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'featuredp.features' has no attribute {name!r}")


__all__ = [
    "Batch",
    "BoxMask",
    "Columns",
    "Disclosure",
    "FunctionMap",
    "GaussianBlur",
    "ImageFeatureMap",
    "LabelPrivate",
    "Pixelate",
    "PublicFeatureMap",
    "TokenView",
]

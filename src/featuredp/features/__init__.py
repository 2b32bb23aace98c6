"""Public feature maps Ψ: what of a record is public.

* :mod:`featuredp.features.base` — the contract (:class:`PublicFeatureMap`, ``describe() -> Disclosure``);
* :mod:`featuredp.features.tabular` — :class:`Columns`, :class:`LabelPrivate`, :class:`FunctionMap`;
* :mod:`featuredp.features.image` — :class:`GaussianBlur`, :class:`Pixelate`, :class:`BoxMask`;
* :mod:`featuredp.features.text` — Ψ for text on strings: private spans (annotated or detected) replaced by typed
  placeholders (:class:`~featuredp.features.text.TextSpans`);
* :mod:`featuredp.features.tokens` — Ψ on token batches: :class:`TokenView` (the tokens of Ψ(text)).
"""

from featuredp.features.base import Batch, Disclosure, PublicFeatureMap
from featuredp.features.image import BoxMask, GaussianBlur, ImageFeatureMap, Pixelate
from featuredp.features.tabular import Columns, FunctionMap, LabelPrivate
from featuredp.features.tokens import TokenView

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

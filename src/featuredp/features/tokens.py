"""Ψ on token batches: the public view of a text batch is the tokens of Ψ(text), nothing else.

A text batch (:class:`featuredp.data.text.TextDataset`) carries the full text's tokens (``"x"``, ``"y"``) and the
tokens of Ψ(text) = :class:`~featuredp.features.text.TextSpans` applied to each record (``"x_pub"``, ``"y_pub"``),
made when the dataset is built. :class:`TokenView` selects the latter as the view, under the names a model and a
loss read (``"x"``, ``"y"``): the public loss of a language model then sees the text with placeholders
(``[EMAIL]``) where the private spans were, and no token of their contents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from featuredp.errors import DataValidationError
from featuredp.features.base import Batch, PublicFeatureMap
from featuredp.features.text import TextSpans
from featuredp.plan import Disclosure

__all__ = ["TokenView"]

_KEYS = ("x_pub", "y_pub")


class TokenView(PublicFeatureMap):
    """Ψ(batch) = ``{"x": batch["x_pub"], "y": batch["y_pub"]}``: the tokens of the redacted text.

    ``psi`` is the :class:`~featuredp.features.text.TextSpans` the batch's public tokens were made with; the
    view describes itself as that Ψ (the guarantee names the hidden span types), and :meth:`bind` refuses a
    dataset built with another one. The view reads ``"x_pub"`` and ``"y_pub"`` only; ``"x"`` and ``"y"`` (the
    full text) are dropped, so no entry-wise mask is declared (:meth:`private_entries` is empty).

    >>> import torch
    >>> view = TokenView(TextSpans(("email",)))({"x": torch.ones(1, 3), "y": torch.ones(1, 3),
    ...                                          "x_pub": torch.zeros(1, 3), "y_pub": torch.zeros(1, 3)})
    >>> sorted(view), float(view["x"].sum())
    (['x', 'y'], 0.0)
    """

    def __init__(self, psi: TextSpans) -> None:
        if not isinstance(psi, TextSpans):
            raise TypeError(f"psi must be a TextSpans (featuredp.features.text), got {type(psi).__name__}")
        self.psi = psi

    def __repr__(self) -> str:
        return f"TokenView({self.psi!r})"

    def bind(self, dataset: Any) -> TokenView:
        """Check that ``dataset`` (a text dataset, or a batch dict) carries public tokens made with this Ψ."""
        if isinstance(dataset, Mapping):
            missing = [k for k in _KEYS if k not in dataset]
            if missing:
                raise DataValidationError(f"TokenView needs a text batch with 'x_pub' and 'y_pub' (the tokens of "
                                          f"Ψ(text)); missing {missing}, got keys {sorted(dataset)}")  # fmt: skip
            return self
        psi = getattr(dataset, "psi", None)
        if not isinstance(psi, TextSpans) or not callable(getattr(dataset, "batch", None)):
            raise DataValidationError(f"TokenView needs a text dataset (featuredp.data.text.TextDataset) or a batch "
                                      f"with 'x_pub' and 'y_pub'; got {type(dataset).__name__}")  # fmt: skip
        if psi != self.psi:
            # the guarantee would name one Ψ's hidden spans while the public tokens were made with another's
            raise DataValidationError(f"dataset: its public tokens were made with {psi!r}, but this TokenView "
                                      f"describes {self.psi!r}")  # fmt: skip
        return self

    def __call__(self, batch: Batch) -> Batch:
        """The public view: the tokens of Ψ(text) as ``"x"`` (inputs) and ``"y"`` (targets); nothing else."""
        missing = [k for k in _KEYS if k not in batch]
        if missing:
            raise DataValidationError(f"batch: a text batch needs 'x_pub' and 'y_pub', missing {missing} "
                                      f"(got keys {sorted(batch)})")  # fmt: skip
        return {"x": batch["x_pub"], "y": batch["y_pub"]}

    def describe(self) -> Disclosure:
        """The Disclosure of the Ψ the public tokens were made with (what it reveals and the spans it hides)."""
        return self.psi.describe()

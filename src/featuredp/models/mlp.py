"""Multi-layer perceptron for tabular classification (the paper's Purchase100 model is MLP 600→300→100)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from featuredp._validate import check_choice, check_int
from featuredp.models.layers import ColumnLinear

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "elu": nn.ELU}


class MLP(nn.Module):
    """Fully connected network ``in_features → hidden... → n_classes`` (logits).

    No normalisation layers: BatchNorm mixes examples and is refused in private training.
    The first layer is a :class:`~featuredp.models.layers.ColumnLinear`, so ``model(x_sub, columns=idx)``
    evaluates the network on an input whose columns outside ``idx`` are zero at a fraction of the cost.
    """

    #: ``forward`` accepts ``columns=`` (see :class:`~featuredp.models.layers.ColumnLinear`).
    accepts_columns = True

    def __init__(
        self, in_features: int, hidden: Sequence[int] = (300,), n_classes: int = 2, activation: str = "relu"
    ) -> None:
        super().__init__()
        in_features = check_int("in_features", in_features, minimum=1)
        n_classes = check_int("n_classes", n_classes, minimum=2)
        activation = check_choice("activation", activation, tuple(_ACTIVATIONS))
        widths = [check_int("hidden", h, minimum=1) for h in hidden]
        layers: list[nn.Module] = []
        prev = in_features
        for i, w in enumerate(widths):
            layers += [(ColumnLinear if i == 0 else nn.Linear)(prev, w), _ACTIVATIONS[activation]()]
            prev = w
        layers.append((ColumnLinear if not widths else nn.Linear)(prev, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, shape (B, n_classes); with ``columns``, ``x`` holds only those input columns."""
        if columns is None:
            return self.net(x)
        first, *rest = self.net  # (slicing a Sequential is typed as returning a plain Module)
        h = first(x, columns=columns)
        for layer in rest:
            h = layer(h)
        return h

"""Building blocks shared by the tabular models."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp.clipping.rules import linear_rule, register_rule

__all__ = ["ColumnLinear"]


class ColumnLinear(nn.Linear):
    """``nn.Linear`` that can also be applied to a subset of its input columns, the others being zero.

    ``layer(x)`` is ordinary ``nn.Linear``. ``layer(x_sub, columns=idx)`` takes
    ``x_sub = x[..., idx]`` of an input ``x`` whose other columns are exactly zero and returns the
    same value as ``layer(x)``, multiplying only the given columns. Zero columns contribute exactly
    zero to the output and to the weight's gradient, so the result and the gradient equal those of
    the full product (up to float summation order).

    Why: a feature-DP public view with zero-masked private columns (``Masking(fill="zero")``) has
    most of its first-layer input equal to zero; on Purchase100-shaped data (100 of 600 columns
    public) the public passes then cost a sixth of a full first layer. The parameters and the
    ``state_dict`` are those of ``nn.Linear``; ghost clipping has an exact rule for both forms.
    """

    def forward(self, input: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """``input @ weight.T + bias``; with ``columns``, ``input`` holds only those input columns."""
        if columns is None:
            return nnf.linear(input, self.weight, self.bias)
        if input.shape[-1] != columns.numel():
            raise ValueError(
                f"ColumnLinear: input has {input.shape[-1]} columns but columns lists {columns.numel()}"
            )
        return nnf.linear(input, self.weight.index_select(1, columns), self.bias)


# Ghost clipping's Linear rule reads the column subset; registered here, where the layer is defined, so that
# clipping never imports the models.
register_rule(ColumnLinear)(linear_rule)

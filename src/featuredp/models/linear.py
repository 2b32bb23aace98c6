"""Linear classifiers: dense multinomial logistic regression and the sparse categorical model.

:class:`SparseLogisticRegression` is the paper's Criteo model: a dense linear
part on the numeric columns plus, for every categorical column, an embedding
of dimension 1 (per class for more than two classes) looked up by category
code. A code of -1 means "masked" (a private column in the public view) and
contributes exactly 0, so ℓ_pub computed on masked codes uses only the public
columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from featuredp._validate import check_int
from featuredp.models.layers import ColumnLinear


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: logits = W x + b, shape (B, n_classes)."""

    #: ``forward`` accepts ``columns=`` (see :class:`~featuredp.models.layers.ColumnLinear`).
    accepts_columns = True

    def __init__(self, in_features: int, n_classes: int = 2, bias: bool = True) -> None:
        super().__init__()
        in_features = check_int("in_features", in_features, minimum=1)
        n_classes = check_int("n_classes", n_classes, minimum=2)
        self.linear = ColumnLinear(in_features, n_classes, bias=bias)

    def forward(self, x: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, shape (B, n_classes); with ``columns``, ``x`` holds only those input columns."""
        return self.linear(x, columns=columns)


class SparseLogisticRegression(nn.Module):
    """Logistic regression on numeric columns + dimension-1 embeddings of categorical codes.

    Reads ``batch["x"][:, dense_index]`` and ``batch["x_cat"]`` (int64 codes per
    categorical column, -1 = masked). For two classes there is one logit z and
    the model returns logits (0, z) so that softmax cross-entropy equals the
    logistic loss; for K > 2 classes the embeddings have dimension K.
    """

    takes_batch = True
    # Buffers (registered in __init__), declared so that type checkers see tensors, not Module attributes.
    dense_index: torch.Tensor
    offsets: torch.Tensor

    def __init__(
        self,
        dense_index: Sequence[int],
        cat_cardinalities: Sequence[int],
        n_classes: int = 2,
        bias: bool = True,
    ) -> None:
        super().__init__()
        n_classes = check_int("n_classes", n_classes, minimum=2)
        cards = [check_int("cat_cardinalities", c, minimum=1) for c in cat_cardinalities]
        self.n_classes = n_classes
        out = 1 if n_classes == 2 else n_classes
        self.register_buffer("dense_index", torch.as_tensor(list(dense_index), dtype=torch.long), persistent=False)
        offsets = [sum(cards[:i]) for i in range(len(cards))]
        self.register_buffer("offsets", torch.as_tensor(offsets, dtype=torch.long), persistent=False)
        self.dense = nn.Linear(len(dense_index), out, bias=bias) if len(dense_index) else None
        # One table over all columns' offset codes; zero init like a logistic regression.
        self.embedding = nn.Embedding(max(sum(cards), 1), out) if cards else None
        if self.embedding is not None:
            nn.init.zeros_(self.embedding.weight)
        if not bias and self.dense is None:
            raise ValueError("a model without numeric columns needs bias=True or categorical columns")
        self.bias = nn.Parameter(torch.zeros(out)) if (bias and self.dense is None) else None

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits, shape (B, n_classes)."""
        x = batch["x"]
        z = None
        if self.dense is not None:
            z = self.dense(x.index_select(-1, self.dense_index))
        if self.embedding is not None:
            codes = batch["x_cat"]
            valid = codes >= 0
            # Masked codes (-1) look up row 0 and are then multiplied by 0: they contribute nothing,
            # and their gradient is zero.
            idx = torch.where(valid, codes + self.offsets, torch.zeros_like(codes))
            e = self.embedding(idx) * valid.unsqueeze(-1).to(self.embedding.weight.dtype)
            ez = e.sum(-2)
            z = ez if z is None else z + ez
        if self.bias is not None:
            z = z + self.bias if z is not None else self.bias.expand(x.shape[0], -1)
        assert z is not None
        if self.n_classes == 2:
            return torch.cat([torch.zeros_like(z), z], dim=-1)
        return z

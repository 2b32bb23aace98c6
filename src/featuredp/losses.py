"""Loss splits ℓ = ℓ_priv + ℓ_pub (paper §3–4 and Algorithm 1; docs/engine.md).

ℓ_pub predicts ℓ from the public view Ψ(x) only; ℓ_priv = ℓ − ℓ_pub is what
is clipped and noised. Both are evaluated with the *same* model and the *same*
random draws (padding noise, diffusion timestep, ...), so the difference is
small and its gradient norm low.

Structure that keeps ℓ_pub honest: :meth:`LossSplit.public_loss` is a template
method that computes Ψ(batch) itself and hands only the view (and the draws) to
the subclass's ``_public_loss``; a subclass never sees the private entries
there.

Splits here (classification with cross-entropy):

* :class:`GaussianPadding` — the paper's choice: private feature positions are
  filled with N(0, 1) draws;
* :class:`Masking` — private positions filled with 0 or a mean that comes from
  public information or the user;
* :class:`LabelDPSplit` — label privacy: ℓ_pub = logsumexp of the centred logits,
  ℓ_priv = −(centred logit of the true class) (gradient −x·(y − 1/K)ᵀ for a linear model).

and for causal language models, :class:`CausalLMSplit`: ℓ = mean token NLL of the full text, ℓ_pub = the same
on the tokens of Ψ(text) (private spans as placeholders).

All losses are per example: shape (B,), no reduction, no mixing (vmap-able).
Models are called as ``model(batch)`` when they declare ``takes_batch = True``
(the sparse categorical model), else as ``model(batch["x"])``.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as nnf

from featuredp._validate import check_choice
from featuredp.batches import forward
from featuredp.errors import DataValidationError, PrivacyLeakWarning
from featuredp.features import Batch, Columns, LabelPrivate, PublicFeatureMap, TokenView
from featuredp.features.image import ImageFeatureMap
from featuredp.lm import token_nll

__all__ = [
    "GaussianPadding",
    "ImageClassificationSplit",
    "LabelDPSplit",
    "LossSplit",
    "Masking",
    "default_split",
    "forward",
    "zero_masked_logits",
]


def zero_masked_logits(model: nn.Module, view: Batch, feature_map: PublicFeatureMap) -> torch.Tensor:
    """Logits of a public view whose private ``"x"`` columns are zero, multiplying only the public columns.

    With a :class:`~featuredp.features.Columns` map, Ψ sets the private encoded columns to exactly 0.
    A model that declares ``accepts_columns`` (the MLP and logistic regression, whose first layer is a
    :class:`~featuredp.models.layers.ColumnLinear`) then gets just the public columns, which gives the
    same logits and gradients as the full input at a fraction of the first layer's cost. Any other
    model or map gets the full view.
    """
    mask = feature_map.private_entries().get("x") if isinstance(feature_map, Columns) else None
    if (
        mask is None
        or not getattr(model, "accepts_columns", False)
        or getattr(model, "takes_batch", False)
        or "x" not in view
        or not bool(mask.any())
    ):
        return forward(model, view)
    x = view["x"]
    columns = (~mask).nonzero().flatten().to(x.device)
    if columns.numel() == 0:
        return forward(model, view)
    return model(x.index_select(-1, columns), columns=columns)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy, shape (B,)."""
    return nnf.cross_entropy(logits, y, reduction="none")


class LossSplit(ABC):
    """The pair (ℓ, ℓ_pub); ℓ_priv = ℓ − ℓ_pub with the same model and draws.

    Subclasses implement :meth:`loss`, :meth:`_public_loss` (which receives the
    public view, never the batch) and optionally :meth:`draws`.
    """

    #: short name recorded in run.json
    name: str = "split"

    def __init__(self, feature_map: PublicFeatureMap) -> None:
        if not isinstance(feature_map, PublicFeatureMap):
            raise TypeError(f"feature_map must be a PublicFeatureMap, got {type(feature_map).__name__}")
        self.feature_map = feature_map

    def bind(self, dataset: Any) -> LossSplit:
        """Bind the feature map (and anything the split needs) to a dataset; returns ``self``."""
        self.feature_map.bind(dataset)
        return self

    def draws(self, batch: Batch, generator: torch.Generator) -> Batch:
        """Every random draw the losses use, batch-first; ``{}`` when the split is deterministic."""
        return {}

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """ℓ per example, shape (B,)."""

    def public_loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """ℓ_pub per example: computes Ψ(batch) and reads only that view (and the draws)."""
        view = self.feature_map(batch)
        return self._public_loss(model, view, draws)

    @abstractmethod
    def _public_loss(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        """ℓ_pub from the public view only, shape (B,)."""

    def private_loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """ℓ_priv = ℓ − ℓ_pub, same model and same draws, shape (B,)."""
        return self.loss(model, batch, draws) - self.public_loss(model, batch, draws)

    def describe(self) -> dict[str, Any]:
        """The split and the feature map (its :class:`~featuredp.plan.Disclosure` as a dict), for run.json.

        >>> default_split(LabelPrivate()).describe()["feature_map"]["hides"]
        "the label ('y')"
        """
        return {"split": self.name, "feature_map": self.feature_map.describe().to_dict()}


class _FilledClassification(LossSplit):
    """Cross-entropy; ℓ_pub = cross-entropy of the public view with private positions filled."""

    def _check_label_public(self) -> None:
        if getattr(self.feature_map, "label_private", False) or isinstance(self.feature_map, LabelPrivate):
            raise ValueError(
                f"{type(self).__name__} needs the label in the public view, but the feature map hides it; "
                "use LabelDPSplit for a private label"
            )

    def bind(self, dataset: Any) -> LossSplit:
        super().bind(dataset)
        self._check_label_public()
        return self

    def loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """Cross-entropy of the full record, shape (B,)."""
        return cross_entropy(forward(model, batch), batch["y"])

    def _fill(self, view: Batch, draws: Batch) -> Batch:
        raise NotImplementedError

    def _view_logits(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        return forward(model, self._fill(view, draws))

    def _public_loss(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        if "y" not in view:
            raise ValueError("the public view has no label 'y'; use LabelDPSplit for a private label")
        return cross_entropy(self._view_logits(model, view, draws), view["y"])


class GaussianPadding(_FilledClassification):
    """The paper's split (§6.2): private feature positions are filled with N(0, 1) draws.

    Private category codes (``"x_cat"``) stay masked (-1, a zero embedding).
    The padding draws are per example and are shared by ℓ_pub inside ℓ_priv =
    ℓ − ℓ_pub (common random numbers).
    """

    name = "gaussian_padding"

    def __init__(self, feature_map: PublicFeatureMap, *, scale: float = 1.0) -> None:
        super().__init__(feature_map)
        self.scale = float(scale)

    def draws(self, batch: Batch, generator: torch.Generator) -> Batch:
        """N(0, scale²) padding for every private ``x`` entry, drawn with ``generator`` on the batch's device: a
        tensor of ``x``'s shape, zero where ``x`` is public (:meth:`_fill` never reads those). Only the private
        entries are drawn (on Adult 8 of 105 columns: the full draw was 8 % of an FDP step)."""
        x = batch["x"]
        mask = self.feature_map.private_entries().get("x")
        if mask is None:
            return {}
        where = mask.expand(x.shape[1:]).reshape(-1).nonzero().flatten().to(x.device)  # the CPU mask's positions
        drawn = torch.randn((x.shape[0], where.numel()), generator=generator, dtype=x.dtype, device=x.device)
        pad = torch.zeros((x.shape[0], math.prod(x.shape[1:])), dtype=x.dtype, device=x.device)
        pad.index_copy_(1, where, drawn if self.scale == 1.0 else drawn.mul_(self.scale))
        return {"pad": pad.view(x.shape)}

    def _fill(self, view: Batch, draws: Batch) -> Batch:
        mask = self.feature_map.private_entries().get("x")
        if mask is None or "pad" not in draws:
            return view
        out = dict(view)
        out["x"] = torch.where(mask.to(view["x"].device), draws["pad"], view["x"])
        return out

    def describe(self) -> dict[str, Any]:
        """The split, Ψ and the padding distribution."""
        return {**super().describe(), "padding": f"N(0, {self.scale:g}^2)"}


class Masking(_FilledClassification):
    """Private feature positions filled with 0 (``fill="zero"``) or a mean (``fill="mean"``).

    A mean must be public information: give ``mean`` (a mapping encoded column
    → value, or a full-length vector). If it is left out, :meth:`bind` computes
    it from the private columns of the data and warns with PrivacyLeakWarning
    (those means are not covered by the training guarantee).
    """

    name = "masking"

    def __init__(
        self,
        feature_map: PublicFeatureMap,
        *,
        fill: str = "zero",
        mean: Mapping[str, float] | Sequence[float] | torch.Tensor | None = None,
    ) -> None:
        super().__init__(feature_map)
        self.fill = check_choice("fill", fill, ("zero", "mean"))
        if fill == "zero" and mean is not None:
            raise ValueError("mean is only used with fill='mean'")
        self._mean_arg = mean
        self._mean: torch.Tensor | None = None
        self.mean_source: str | None = None

    def bind(self, dataset: Any) -> LossSplit:
        """Bind Ψ and resolve the mean (given, or read from the data with a PrivacyLeakWarning)."""
        super().bind(dataset)
        if self.fill != "mean":
            return self
        d = len(dataset.feature_names)
        if self._mean_arg is None:
            warnings.warn(
                "Masking(fill='mean') computed the mean of the private columns from the training data; "
                "that statistic is not covered by the privacy guarantee. Pass mean=... from public "
                "information instead",
                PrivacyLeakWarning,
                stacklevel=2,
            )
            self._mean = torch.as_tensor(dataset.X, dtype=torch.float32).mean(0)
            self.mean_source = "private data (PrivacyLeakWarning)"
        elif isinstance(self._mean_arg, Mapping):
            names = list(dataset.feature_names)
            unknown = [k for k in self._mean_arg if k not in names]
            if unknown:
                raise DataValidationError(f"mean names unknown encoded column(s) {unknown}; available: {names}")
            vec = torch.zeros(d)
            for k, v in self._mean_arg.items():
                vec[names.index(k)] = float(v)
            self._mean = vec
            self.mean_source = "user"
        else:
            vec = torch.as_tensor(self._mean_arg, dtype=torch.float32).flatten()
            if vec.numel() != d:
                raise ValueError(f"mean must have {d} entries (one per encoded column), got {vec.numel()}")
            self._mean = vec
            self.mean_source = "user"
        return self

    def _view_logits(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        if self.fill == "zero":  # Ψ already sets private features to 0: only the public columns need multiplying
            return zero_masked_logits(model, view, self.feature_map)
        return super()._view_logits(model, view, draws)

    def _fill(self, view: Batch, draws: Batch) -> Batch:
        if self.fill == "zero":
            return view  # Ψ already sets private features to 0
        if self._mean is None:
            raise RuntimeError("Masking(fill='mean') is not bound: call .bind(dataset) first")
        mask = self.feature_map.private_entries().get("x")
        if mask is None:
            return view
        out = dict(view)
        x = view["x"]
        out["x"] = torch.where(mask.to(x.device), self._mean.to(dtype=x.dtype, device=x.device), x)
        return out

    def describe(self) -> dict[str, Any]:
        """The split, Ψ, the fill and where a mean came from."""
        return {**super().describe(), "fill": self.fill, "mean_source": self.mean_source}


class LabelDPSplit(LossSplit):
    """Label privacy: ℓ = cross-entropy, ℓ_pub = logsumexp(z − z̄) of the public view's centred logits z − z̄.

    With Ψ(x, y) = x, ℓ_priv = ℓ − ℓ_pub = −(z_y − z̄), whose gradient for a linear
    model W is −x·(y − 1/K)ᵀ (norm ‖x‖·√(1 − 1/K) ≤ ‖x‖): 1-Lipschitz where ℓ is √2-Lipschitz (the label-DP case;
    docs/convex.md). Centring makes ℓ_pub bounded below (by log K, at the uniform prediction): uncentred,
    logsumexp(z) falls without bound along the shift of all logits, which cross-entropy ignores, and an MLP whose
    clipped private part did not cancel that pull diverged. If the feature map also hides feature columns, they
    are zero in the view.
    """

    name = "label_dp"

    def __init__(self, feature_map: PublicFeatureMap | None = None) -> None:
        super().__init__(feature_map if feature_map is not None else LabelPrivate())

    def loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """Cross-entropy of the full record, shape (B,)."""
        return cross_entropy(forward(model, batch), batch["y"])

    def _public_loss(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        # Centred logits: cross-entropy ignores a shift of all logits, but logsumexp(z) alone falls without bound
        # along it. Whenever clipping or a Poisson batch of other than its expected size leaves the private part
        # short of cancelling that pull, the model's weights grew exponentially (an MLP on a private label reached
        # 1e18 and the ghost check refused it as "mixing"). logsumexp(z − mean z) >= log K, with its minimum at
        # the uniform prediction; ℓ stays exactly ℓ_pub + ℓ_priv.
        logits = zero_masked_logits(model, view, self.feature_map)
        return torch.logsumexp(logits - logits.mean(dim=-1, keepdim=True), dim=-1)


def default_split(feature_map: PublicFeatureMap, kind: str | None = None) -> LossSplit:
    """The split to use for ``feature_map``: ``"padding"`` (default for column maps),
    ``"zero"``, ``"mean"`` or ``"labeldp"`` (default when the label is private).

    >>> default_split(LabelPrivate()).name
    'label_dp'
    """
    label_private = isinstance(feature_map, LabelPrivate) or bool(getattr(feature_map, "label_private", False))
    if kind is None:
        kind = "labeldp" if label_private else "padding"
    kind = check_choice("loss_split", kind, ("padding", "zero", "mean", "labeldp"))
    if kind == "labeldp":
        return LabelDPSplit(feature_map)
    if kind == "padding":
        return GaussianPadding(feature_map)
    return Masking(feature_map, fill=kind)


# Re-exported for convenience: the maps that go with these splits.

class ImageClassificationSplit(LossSplit):
    """ℓ = CE(f(x), y); ℓ_pub = CE(f(Ψ(x)), y) on the public view; ℓ_priv = ℓ − ℓ_pub.

    The label must be in the public view (Ψ with ``label_public=True``): ℓ_pub needs it, and a
    private label would make the view identify nothing of it. Deterministic: no draws.

    >>> from featuredp.features.image import GaussianBlur
    >>> split = ImageClassificationSplit(GaussianBlur(0.0))   # σ = 0: everything public
    >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    >>> b = {"x": torch.randn(2, 1, 4, 4), "y": torch.tensor([0, 2])}
    >>> split.private_loss(net, b, {}).abs().max().item()
    0.0
    """

    name = "image_cross_entropy"

    def __init__(self, feature_map: ImageFeatureMap) -> None:
        super().__init__(feature_map)
        if not isinstance(feature_map, ImageFeatureMap):
            raise TypeError(f"feature_map must be an image feature map (GaussianBlur, Pixelate, ...), got "
                            f"{type(feature_map).__name__}")  # fmt: skip
        if not feature_map.label_public:
            raise ValueError("ImageClassificationSplit needs the label in the public view (label_public=True): "
                             "ℓ_pub is the cross-entropy of the public image with its label")  # fmt: skip

    def loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """ℓ: cross-entropy of the sharp image, shape (B,)."""
        return nnf.cross_entropy(forward(model, batch), batch["y"], reduction="none")

    def _public_loss(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        return nnf.cross_entropy(forward(model, view), view["y"], reduction="none")

    def describe(self) -> dict[str, Any]:
        """The split, Ψ (its Disclosure) and what ℓ_pub is."""
        return {**super().describe(), "public_loss": "cross-entropy of the same network on Ψ(x) with the label"}


__all__ += ["Columns", "LabelPrivate"]


class CausalLMSplit(LossSplit):
    """Causal LM: ℓ = mean token NLL of the full text; ℓ_pub = mean token NLL of Ψ(text); ℓ_priv = ℓ − ℓ_pub.

    The batch is a text batch (:class:`featuredp.data.text.TextDataset`): ``"x"``/``"y"`` hold the full text's
    tokens, ``"x_pub"``/``"y_pub"`` those of the text with each private span replaced by its placeholder. ℓ_pub
    is computed, as in every split, from the :class:`~featuredp.features.TokenView` of the batch alone. Both
    losses are per example (each row's mean over its own targets, :func:`featuredp.lm.token_nll`), with the same
    model and no random draws.

    >>> from featuredp.features.text import TextSpans
    >>> split = CausalLMSplit(TokenView(TextSpans(("email",))))
    >>> net = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5))
    >>> b = {"x": torch.tensor([[0, 1, 2]]), "y": torch.tensor([[1, 2, -100]])}
    >>> b.update(x_pub=b["x"], y_pub=b["y"])   # nothing private in this text: ℓ_priv = 0
    >>> split.private_loss(net, b, {}).abs().item()
    0.0
    """

    name = "causal_lm"

    def __init__(self, feature_map: TokenView) -> None:
        if not isinstance(feature_map, TokenView):
            raise TypeError(f"feature_map must be a TokenView (Ψ on token batches), got {type(feature_map).__name__}")
        super().__init__(feature_map)

    def loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """ℓ: the mean NLL of each full text's target tokens, shape (B,)."""
        return token_nll(forward(model, batch), batch["y"])

    def _public_loss(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        return token_nll(forward(model, view), view["y"])

    def describe(self) -> dict[str, Any]:
        """The split, Ψ (its Disclosure) and what ℓ_pub is."""
        return {**super().describe(),
                "public_loss": "mean token NLL of the same model on the text with private spans as placeholders"}


__all__ += ["CausalLMSplit"]

"""The losses a Hugging Face model computes from ``labels`` (``outputs = model(**batch); outputs.loss``), as
criteria the engine recomputes per example.

A ``transformers`` model called with ``labels=`` returns ``outputs.loss``: for a causal LM the mean token
cross-entropy of the logits against the labels shifted by one (labels of -100 ignored), for sequence
classification cross-entropy, mean squared error or binary cross-entropy by ``config.problem_type``. The wrapped
model replaces that value with the engine's loss (:func:`hf_loss`), whose ``backward()`` clips each example's gradient
of the same loss: each example's mean over its own counted tokens. No ``transformers`` import is needed: the
model's output and config are read by their attributes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

from featuredp.private_output import FunctionalLoss

__all__ = ["IGNORE_INDEX", "CausalLMLoss", "hf_criterion"]

#: Hugging Face's label for "no target here"
IGNORE_INDEX = -100


class CausalLMLoss:
    """Next-token cross-entropy of logits ``(N, L, V)`` against labels ``(N, L)``, shifted by one as Hugging Face
    shifts them (the last position has no target); ``reduction="none"`` gives ``(N, L)`` with 0 where ignored."""

    ignore_index = IGNORE_INDEX

    def __init__(self) -> None:
        self.reduction = "mean"

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss at this object's ``reduction``."""
        labels = labels.reshape(logits.shape[:-1])
        targets = functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        per = functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                       ignore_index=IGNORE_INDEX, reduction="none").reshape(labels.shape)  # fmt: skip
        if self.reduction == "none":
            return per
        if self.reduction == "sum":
            return per.sum()
        return per.sum() / (targets != IGNORE_INDEX).sum().clamp(min=1)

    @staticmethod
    def counted(labels: torch.Tensor) -> torch.Tensor:
        """Each example's number of counted targets (its labels after the first that are not -100)."""
        return (labels[:, 1:] != IGNORE_INDEX).sum(1)

    def __repr__(self) -> str:
        return "causal LM next-token cross-entropy"


def hf_criterion(outputs: Any, labels: torch.Tensor, config: Any) -> Any:
    """The criterion behind ``outputs.loss`` of a Hugging Face model called with ``labels``, or None when the
    engine cannot tell which loss the model computed (the caller refuses then)."""
    logits = getattr(outputs, "logits", None)
    if not isinstance(logits, torch.Tensor):
        return None
    if logits.dim() == 3 and labels.dim() == 2 and labels.shape == logits.shape[:2]:
        return CausalLMLoss()
    if logits.dim() != 2:
        return None
    problem = getattr(config, "problem_type", None)
    if problem is None:
        problem = ("regression" if logits.shape[1] == 1 else
                   "single_label_classification" if not labels.is_floating_point() else
                   "multi_label_classification")  # fmt: skip
    func: Any = {"regression": functional.mse_loss, "single_label_classification": functional.cross_entropy,
            "multi_label_classification": functional.binary_cross_entropy_with_logits}.get(problem)  # fmt: skip
    return None if func is None else FunctionalLoss(func, {})

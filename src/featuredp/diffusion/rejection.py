"""Rejection sampling of blurry samples (post-processing, paper §6.3).

FDP (Alg. 1) in the paper adds a step that filters out blurry generated images. It costs no
privacy as long as it reads no private data: the score is computed on the *generated* samples and
the threshold comes from public information only — a fixed constant, or a quantile of the
sharpness of the *public views* Ψ(x) (blurred images are public by definition). Nothing here
accepts the training images themselves; :func:`public_threshold` takes the output of Ψ.

Sharpness score: the variance of the Laplacian (3×3 kernel [[0,1,0],[1,−4,1],[0,1,0]]) of the image
scaled to [0, 1], a standard focus measure: blur removes high frequencies and lowers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from featuredp._validate import check_int, check_nonnegative, check_open_unit

__all__ = ["DEFAULT_QUANTILE", "RejectionResult", "laplacian_variance", "public_threshold", "rejection_sample"]

#: default quantile of the public views' sharpness used as the threshold: a sample must be sharper
#: than the median blurred (public) image to be kept.
DEFAULT_QUANTILE = 0.5

_LAPLACE = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]])


def _as_unit(images: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Float (N, C, H, W) in [0, 1] from uint8 [0, 255] or float [-1, 1]."""
    x = torch.as_tensor(images)
    if x.dim() != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {tuple(x.shape)}")
    if x.dtype == torch.uint8:
        return x.float() / 255.0
    return (x.float() + 1.0) / 2.0


def laplacian_variance(images: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Per-image variance of the Laplacian (channels averaged first), shape (N,). Higher = sharper."""
    x = _as_unit(images).mean(1, keepdim=True)
    lap = F.conv2d(x, _LAPLACE.to(x.device).view(1, 1, 3, 3))  # valid convolution: no padding artefacts at borders
    return lap.flatten(1).var(1)


def public_threshold(public_images: torch.Tensor | np.ndarray, quantile: float = DEFAULT_QUANTILE) -> float:
    """A threshold from PUBLIC images (the views Ψ(x), e.g. blurred images): the ``quantile`` of their
    sharpness. Pass ``feature_map(batch)["x"]``, never the training images."""
    quantile = check_open_unit("quantile", quantile)
    scores = laplacian_variance(public_images)
    if scores.numel() == 0:
        raise ValueError("public_images is empty")
    return float(torch.quantile(scores.double(), quantile))


class RejectionResult:
    """Accepted samples and how many were drawn."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None, drawn: int, forced: int) -> None:
        self.images = images
        self.labels = labels
        self.drawn = drawn
        self.forced = forced  # samples kept after max_rounds although below the threshold

    @property
    def acceptance_rate(self) -> float:
        """Accepted (by the test) / drawn."""
        return (len(self.images) - self.forced) / max(self.drawn, 1)

    def describe(self) -> dict[str, Any]:
        """Counts for run files: kept, drawn, forced and the acceptance rate."""
        return {"kept": len(self.images), "drawn": self.drawn, "forced": self.forced,
                "acceptance_rate": self.acceptance_rate}


def rejection_sample(
    sample_fn: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    threshold: float,
    *,
    max_rounds: int = 5,
    fill: bool = True,
) -> RejectionResult:
    """Draw ``sample_fn(labels)`` and redraw, for the rejected labels only, until every sample has
    sharpness ≥ ``threshold`` or ``max_rounds`` rounds have run.

    ``sample_fn`` maps a 1-D label tensor to images (N, C, H, W); it is the trained generator (post-
    processing of the private model). If ``fill``, the last round's rejected samples are kept so the
    output has ``len(labels)`` images (counted in ``forced``); else fewer may be returned.
    The output keeps the order of acceptance, with matching labels.
    """
    threshold = check_nonnegative("threshold", threshold)
    max_rounds = check_int("max_rounds", max_rounds, minimum=1)
    pending = torch.as_tensor(labels, dtype=torch.long)
    kept_x: list[torch.Tensor] = []
    kept_y: list[torch.Tensor] = []
    drawn = forced = 0
    for round_ in range(max_rounds):
        if pending.numel() == 0:
            break
        imgs = sample_fn(pending)
        drawn += len(imgs)
        ok = laplacian_variance(imgs) >= threshold  # on the images' device
        ok_y = ok.to(pending.device)  # the labels may live elsewhere (e.g. CPU labels, GPU samples)
        kept_x.append(imgs[ok])
        kept_y.append(pending[ok_y])
        if round_ == max_rounds - 1 and fill and bool((~ok).any()):
            kept_x.append(imgs[~ok])
            kept_y.append(pending[~ok_y])
            forced = int((~ok).sum())
        pending = pending[~ok_y]
    return RejectionResult(torch.cat(kept_x), torch.cat(kept_y), drawn, forced)

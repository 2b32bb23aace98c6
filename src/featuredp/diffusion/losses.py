"""The diffusion loss split (paper §6.3): ℓ on the sharp image, ℓ_pub on its public view.

ℓ(x)     = ‖ε − ε_θ(x_t, t, y)‖²       with x_t = √ᾱ_t·x + √(1 − ᾱ_t)·ε
ℓ_pub(x) = ‖ε − ε_θ(Ψ(x)_t, t, y)‖²    with Ψ(x)_t from the SAME t and the SAME ε
ℓ_priv   = ℓ − ℓ_pub

The timestep t and the noise ε are drawn once per example in :meth:`DiffusionLoss.draws` and
shared by both terms (common random numbers): the difference then measures only what the
private detail changes, so its gradient is small and cheap to privatise. Drawing them twice
would add the full variance of the denoising loss to ℓ_priv.

Losses are per example (mean over pixels), shape (B,), vmap-able.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.errors import DataValidationError
from featuredp.features import Batch, PublicFeatureMap
from featuredp.losses import LossSplit

__all__ = ["DiffusionLoss", "denoising_loss"]


def denoising_loss(
    model: nn.Module, schedule: NoiseSchedule, x0: torch.Tensor, y: torch.Tensor | None, t: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """Per-example ε-prediction loss mean((ε − ε_θ(x_t, t, y))²) over pixels, shape (B,)."""
    x_t = schedule.q_sample(x0, t, noise)
    pred = model(x_t, t, y)
    return (pred - noise).pow(2).flatten(1).mean(1)


class DiffusionLoss(LossSplit):
    """The DDPM loss split with common random numbers (timestep and noise) for ℓ and ℓ_pub.

    ``feature_map`` is the image Ψ (e.g. :class:`featuredp.features.image.GaussianBlur`). When it
    drops the label, ℓ_pub conditions on the model's null class, while ℓ uses the label.
    """

    name = "diffusion"

    def __init__(self, feature_map: PublicFeatureMap, schedule: NoiseSchedule | None = None) -> None:
        super().__init__(feature_map)
        self.schedule = schedule if schedule is not None else NoiseSchedule()
        if not isinstance(self.schedule, NoiseSchedule):
            raise TypeError(f"schedule must be a NoiseSchedule, got {type(schedule).__name__}")

    def draws(self, batch: Batch, generator: torch.Generator) -> Batch:
        """t ~ Uniform{0, ..., T−1} and ε ~ N(0, I) per example, batch-first, drawn with ``generator``.

        Both are made on the batch's device (``generator`` must live there too).
        """
        x = batch.get("x")
        if x is None or x.dim() != 4:
            raise DataValidationError("the diffusion loss needs batch['x'] of shape (B, C, H, W)")
        b = x.shape[0]
        t = torch.randint(0, self.schedule.timesteps, (b,), generator=generator, dtype=torch.long, device=x.device)
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        return {"t": t, "noise": noise}

    def loss(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """ℓ: the denoising loss of the sharp image (conditioned on its label), shape (B,)."""
        return denoising_loss(model, self.schedule, batch["x"], batch.get("y"), draws["t"], draws["noise"])

    def _public_loss(self, model: nn.Module, view: Batch, draws: Batch) -> torch.Tensor:
        return denoising_loss(model, self.schedule, view["x"], view.get("y"), draws["t"], draws["noise"])

    def describe(self) -> dict[str, Any]:
        """The split, Ψ (its Disclosure as a dict), the schedule and the shared draws."""
        return {**super().describe(), **self.schedule.describe(), "common_random_numbers": ["t", "noise"]}

"""The diffusion loss split (paper §6.3): ℓ on the sharp image, ℓ_pub on its public view.

ℓ(x)     = ‖ε − ε_θ(x_t, t, y)‖²       with x_t = √ᾱ_t·x + √(1 − ᾱ_t)·ε
ℓ_pub(x) = ‖ε − ε_θ(Ψ(x)_t, t, y)‖²    with Ψ(x)_t from the SAME t and the SAME ε
ℓ_priv   = ℓ − ℓ_pub

The timestep t and the noise ε are drawn once per example in :meth:`DiffusionLoss.draws` and
shared by both terms (common random numbers): the difference then measures only what the
private detail changes, so its gradient is small and cheap to privatise. Drawing them twice
would add the full variance of the denoising loss to ℓ_priv.

Losses are per example (mean over pixels), shape (B,), vmap-able.

A public per-timestep weight w(t) (:class:`TimestepWeight`) moves part of the work between the
terms: ℓ_pub ← w(t)·ℓ_pub and ℓ_priv = ℓ − w(t)·ℓ_pub, so ℓ_pub + ℓ_priv = ℓ still. w is a fixed
function of the drawn timestep, chosen without the data, so it changes no privacy accounting:
w = 0 at some t makes Algorithm 1 clip the whole ∇ℓ there (as FDP (DP-SGD) does).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.errors import DataValidationError
from featuredp.features import Batch, PublicFeatureMap
from featuredp.losses import LossSplit

__all__ = ["DiffusionLoss", "TimestepWeight", "denoising_loss"]

WEIGHT_KINDS = ("constant", "linear", "step")


class TimestepWeight:
    """A public weight w(t) ∈ [0, 1] of ℓ_pub per timestep t ∈ {0, …, T−1}.

    ``constant``: w = 1 (the paper's split); ``linear``: w = t/(T−1); ``step``: w = 1 for
    t ≥ ``threshold``·T, else 0.

    >>> w = TimestepWeight("step", threshold=0.5)
    >>> w(torch.tensor([0, 499, 500, 999]), 1000).tolist()
    [0.0, 0.0, 1.0, 1.0]
    >>> TimestepWeight("linear")(torch.tensor([0, 999]), 1000).tolist()
    [0.0, 1.0]
    """

    def __init__(self, kind: str = "constant", threshold: float = 0.5) -> None:
        if kind not in WEIGHT_KINDS:
            raise ValueError(f"public_weight must be one of {', '.join(WEIGHT_KINDS)}, got {kind!r}")
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
        self.kind, self.threshold = kind, float(threshold)

    @classmethod
    def parse(cls, spec: str) -> TimestepWeight:
        """``constant``, ``linear`` or ``step:τ`` (e.g. ``step:0.3``)."""
        kind, _, arg = str(spec).partition(":")
        if kind == "step" and arg:
            try:
                return cls("step", float(arg))
            except ValueError:
                raise ValueError(
                    f"public_weight must be constant, linear or step:τ with τ in [0, 1], got {spec!r}") from None
        if arg:
            raise ValueError(f"public_weight must be constant, linear or step:τ with τ in [0, 1], got {spec!r}")
        return cls(kind)

    def __call__(self, t: torch.Tensor, timesteps: int) -> torch.Tensor:
        """w(t) as float32, shape of ``t``."""
        if self.kind == "constant":
            return torch.ones(t.shape, dtype=torch.float32, device=t.device)
        if self.kind == "linear":
            return t.float() / max(timesteps - 1, 1)
        return (t >= self.threshold * timesteps).float()

    def describe(self) -> dict[str, Any]:
        """For run.json and the resume fingerprint."""
        return {"kind": self.kind, **({"threshold": self.threshold} if self.kind == "step" else {})}

    def __repr__(self) -> str:
        return f"TimestepWeight({self.kind!r}" + (f", threshold={self.threshold})" if self.kind == "step" else ")")



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

    def __init__(
        self, feature_map: PublicFeatureMap, schedule: NoiseSchedule | None = None,
        public_weight: TimestepWeight | str | None = None,
    ) -> None:
        super().__init__(feature_map)
        self.schedule = schedule if schedule is not None else NoiseSchedule()
        if not isinstance(self.schedule, NoiseSchedule):
            raise TypeError(f"schedule must be a NoiseSchedule, got {type(schedule).__name__}")
        if isinstance(public_weight, str):
            public_weight = TimestepWeight.parse(public_weight)
        if public_weight is not None and not isinstance(public_weight, TimestepWeight):
            raise TypeError(f"public_weight must be a TimestepWeight or its name, got {type(public_weight).__name__}")
        # constant 1 is the paper's split: kept as None so the fingerprint of earlier runs stays the same
        self.public_weight = None if public_weight is None or public_weight.kind == "constant" else public_weight

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
        loss = denoising_loss(model, self.schedule, view["x"], view.get("y"), draws["t"], draws["noise"])
        if self.public_weight is None:
            return loss
        return self.public_weight(draws["t"], self.schedule.timesteps).to(loss.dtype) * loss

    def describe(self) -> dict[str, Any]:
        """The split, Ψ (its Disclosure as a dict), the schedule, the shared draws and w(t) if not 1."""
        out = {**super().describe(), **self.schedule.describe(), "common_random_numbers": ["t", "noise"]}
        if self.public_weight is not None:
            out["public_weight"] = self.public_weight.describe()
        return out

"""DDPM noise schedules: β_t, ᾱ_t = Π(1 − β_s), and the forward process q(x_t | x_0)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from featuredp._validate import check_choice, check_int

__all__ = ["NoiseSchedule"]

SCHEDULES = ("linear", "cosine")


@dataclass(frozen=True)
class NoiseSchedule:
    """A discrete DDPM schedule with ``timesteps`` steps.

    ``linear``: β from 1e-4 to 0.02 scaled by 1000/T (Ho et al. 2020);
    ``cosine``: ᾱ_t = cos²((t/T + s)/(1 + s)·π/2), β clipped at 0.999 (Nichol & Dhariwal 2021).
    """

    kind: str = "cosine"
    timesteps: int = 1000
    alphas_cumprod: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_choice("schedule", self.kind, SCHEDULES)
        check_int("timesteps", self.timesteps, minimum=2)
        T = self.timesteps
        if self.kind == "linear" and T <= 20:
            # β_T = 0.02·1000/T reaches 1 at T = 20: ᾱ would hit 0 (then turn negative), not a schedule
            raise ValueError(f"the linear schedule needs timesteps > 20 (β_T = 20/T must stay below 1), got {T}")
        if self.kind == "linear":
            scale = 1000.0 / T
            betas = torch.linspace(scale * 1e-4, scale * 0.02, T, dtype=torch.float64)
        else:
            s = 0.008
            steps = torch.arange(T + 1, dtype=torch.float64) / T
            f = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
            abar = f / f[0]
            betas = (1 - abar[1:] / abar[:-1]).clamp(max=0.999)
        object.__setattr__(self, "alphas_cumprod", torch.cumprod(1.0 - betas, 0).to(torch.float32))

    def abar(self, t: torch.Tensor) -> torch.Tensor:
        """ᾱ_t for integer timesteps ``t`` (any shape), float32, on ``t``'s device."""
        return self.alphas_cumprod.to(t.device)[t]

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = √ᾱ_t·x_0 + √(1 − ᾱ_t)·ε, with ``t`` of shape (B,) and x0, noise of shape (B, ...).

        >>> s = NoiseSchedule("cosine", 100)
        >>> x_t = s.q_sample(torch.ones(2, 3), torch.tensor([0, 99]), torch.zeros(2, 3))  # ε = 0: x_t = √ᾱ_t
        >>> [round(float(v), 4) for v in x_t[:, 0]]
        [0.9997, 0.0005]
        """
        a = self.abar(t.to(x0.device)).to(x0.dtype).view(-1, *([1] * (x0.dim() - 1)))
        return a.sqrt() * x0 + (1 - a).sqrt() * noise

    def describe(self) -> dict[str, Any]:
        """Plain settings, for run files."""
        return {"schedule": self.kind, "timesteps": self.timesteps}

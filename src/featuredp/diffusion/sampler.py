"""Samplers: DDIM (deterministic with η = 0, Song et al. 2021) and ancestral DDPM (Ho et al. 2020).

Sampling is post-processing of the trained model: it reads no training data.

Samples are made on the model's device (or ``device=``). Their noise is drawn with the given
``generator`` on the generator's own device and then moved, so one seed gives the same starting
noise on every device.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from tqdm.auto import tqdm

from featuredp._validate import check_int, check_nonnegative
from featuredp.diffusion.schedule import NoiseSchedule

__all__ = ["ddim_sample", "ddpm_sample", "generate"]


def _model_device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """``device``, else the device of the model's first parameter or buffer (the CPU if it has none)."""
    if device is not None:
        return torch.device(device)
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _noise(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """N(0, I) drawn with ``generator`` on its own device (on ``device`` without one), placed on ``device``."""
    source = device if generator is None else generator.device
    return torch.randn(shape, generator=generator, device=source).to(device)


def _labels(labels: torch.Tensor | None, n: int | None) -> tuple[torch.Tensor | None, int]:
    """The labels as a 1-D int64 tensor and the sample count (``n`` when unconditional)."""
    if labels is None:
        if n is None:
            raise ValueError("give labels or n (the number of unconditional samples)")
        return None, check_int("n", n, minimum=1)
    labels = torch.as_tensor(labels, dtype=torch.long)
    if labels.dim() != 1 or labels.numel() == 0:
        raise ValueError(f"labels must be a non-empty 1-D tensor, got shape {tuple(labels.shape)}")
    return labels, labels.numel()


@torch.no_grad()
def ddim_sample(
    model: nn.Module,
    schedule: NoiseSchedule,
    shape: tuple[int, int, int],
    *,
    labels: torch.Tensor | None = None,
    n: int | None = None,
    steps: int = 25,
    eta: float = 0.0,
    generator: torch.Generator | None = None,
    clip: bool = True,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """DDIM with ``steps`` evenly spaced timesteps; returns images (N, C, H, W) in [-1, 1].

    ``eta = 0`` is deterministic given the starting noise; ``eta = 1`` matches DDPM's variance.
    ``clip`` clamps the predicted x_0 to [-1, 1] at each step (the data range), which steadies
    small, briefly trained models.
    """
    labels, n = _labels(labels, n)
    dev = _model_device(model, device)
    labels = None if labels is None else labels.to(dev)
    steps = check_int("steps", steps, minimum=1)
    eta = check_nonnegative("eta", eta)
    T = schedule.timesteps
    if steps > T:
        raise ValueError(f"steps must be <= timesteps={T}, got {steps}")
    was_training = model.training
    model.eval()
    abar = schedule.alphas_cumprod.to(dev)
    one = torch.ones((), device=dev)
    ts: list[int] = torch.linspace(T - 1, 0, steps).round().long().tolist()
    x = _noise((n, *shape), generator, dev)
    for i, t in enumerate(ts):
        a_t = abar[t]
        a_prev = abar[ts[i + 1]] if i + 1 < len(ts) else one
        eps = model(x, torch.full((n,), t, dtype=torch.long, device=dev), labels)
        x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt()
        if clip:
            x0 = x0.clamp(-1, 1)
            eps = (x - a_t.sqrt() * x0) / (1 - a_t).sqrt()
        sigma = eta * ((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)).clamp(min=0).sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev - sigma**2).clamp(min=0).sqrt() * eps
        if eta > 0 and i + 1 < len(ts):
            x = x + sigma * _noise(tuple(x.shape), generator, dev)
    model.train(was_training)
    return x.clamp(-1, 1)


@torch.no_grad()
def ddpm_sample(
    model: nn.Module,
    schedule: NoiseSchedule,
    shape: tuple[int, int, int],
    *,
    labels: torch.Tensor | None = None,
    n: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Ancestral DDPM sampling over all T steps (slow; DDIM is the practical choice on CPU)."""
    labels, n = _labels(labels, n)
    dev = _model_device(model, device)
    labels = None if labels is None else labels.to(dev)
    was_training = model.training
    model.eval()
    abar = schedule.alphas_cumprod.to(dev)
    one = torch.ones((), device=dev)
    x = _noise((n, *shape), generator, dev)
    for t in range(schedule.timesteps - 1, -1, -1):
        a_t = abar[t]
        a_prev = abar[t - 1] if t > 0 else one
        beta = 1 - a_t / a_prev
        eps = model(x, torch.full((n,), t, dtype=torch.long, device=dev), labels)
        x0 = ((x - (1 - a_t).sqrt() * eps) / a_t.sqrt()).clamp(-1, 1)
        # posterior mean of q(x_{t-1} | x_t, x_0)
        mean = (a_prev.sqrt() * beta * x0 + (1 - beta).sqrt() * (1 - a_prev) * x) / (1 - a_t)
        if t > 0:
            var = beta * (1 - a_prev) / (1 - a_t)
            x = mean + var.sqrt() * _noise(tuple(x.shape), generator, dev)
        else:
            x = mean
    model.train(was_training)
    return x.clamp(-1, 1)


def generate(
    model: nn.Module,
    schedule: NoiseSchedule,
    shape: tuple[int, int, int],
    labels: torch.Tensor,
    *,
    steps: int = 25,
    batch_size: int = 250,
    seed: int = 0,
    progress: bool = True,
) -> torch.Tensor:
    """DDIM samples for every label in ``labels``, in batches (with a progress bar), on the model's device.

    The noise comes from a CPU generator seeded with ``seed``: the same seed gives the same noise
    on every device.
    """
    labels = torch.as_tensor(labels, dtype=torch.long)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    g = torch.Generator().manual_seed(int(seed))
    out = []
    for start in tqdm(range(0, len(labels), batch_size), desc="sampling", disable=not progress, leave=False):
        out.append(ddim_sample(model, schedule, shape, labels=labels[start : start + batch_size], steps=steps,
                               generator=g))
    return torch.cat(out) if out else torch.empty((0, *shape), device=_model_device(model, None))

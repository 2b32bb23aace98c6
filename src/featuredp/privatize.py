"""The private aggregate: per-example gradients, clipping, noise.

A :class:`GradientStrategy` returns Σ_i clip_C(∇_θ loss_i) and the per-example
norms before clipping. Clipping is applied to the gradient of the loss it is
given *as a whole* — for FDP that is ℓ_priv = ℓ − ℓ_pub, never ℓ and ℓ_pub
separately (ARCHITECTURE rule 3). :class:`VmapGradients` computes exact
per-example gradients with ``torch.func`` (functional_call + vmap + grad), in
physical chunks so that a large logical batch fits in memory; the chunking
does not change the result (sums are added up). The faster ghost-norm strategy
lives in ``featuredp.privatize_ghost`` and implements the same protocol.

Noise (:func:`add_noise`) is added to the *sum*, with std σ·C; the engine
divides by the expected batch size afterwards.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from featuredp._validate import check_int, check_nonnegative, check_positive
from featuredp.features import Batch

__all__ = [
    "GradientStrategy",
    "LossFn",
    "VmapGradients",
    "add_noise",
    "check_no_batch_mixing",
    "clip_factors",
    "get_strategy",
    "trainable_parameters",
]

LossFn = Any  # Callable[[nn.Module, Batch, Batch], Tensor] returning per-example losses (B,)


@runtime_checkable
class GradientStrategy(Protocol):
    """Per-example clipped gradient sums (see DEVELOPING.md)."""

    name: str

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Σ_i clip_C(∇_θ loss_fn(model, batch_i, draws_i)) per named trainable parameter, and the
        per-example norms before clipping, shape (B,). ``max_grad_norm`` may be inf (no clipping)."""
        ...


def trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Named parameters with ``requires_grad`` (the ones that are trained, clipped and noised)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def clip_factors(norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """Per-example scale min(1, C / ‖g_i‖); the clipped norm is ≤ C (strictly, with the 1e-6 guard)."""
    if math.isinf(max_grad_norm):
        return torch.ones_like(norms)
    return (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)


def _batch_size(batch: Batch) -> int:
    sizes = {int(v.shape[0]) for v in batch.values()}
    if len(sizes) != 1:
        raise ValueError(f"batch tensors must share the first (batch) dimension, got sizes {sorted(sizes)}")
    return sizes.pop()


class _LossModule(nn.Module):
    """Wraps (model, loss_fn) so that ``functional_call`` swaps the model's parameters for every
    use inside the loss — ℓ_priv calls the model twice (ℓ and ℓ_pub), both must see the same θ."""

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, batch: Batch, draws: Batch) -> torch.Tensor:
        return self._loss_fn(self.model, batch, draws)


class VmapGradients:
    """Exact per-example gradients with ``torch.func`` (vmap of grad of a batch-of-one loss).

    ``physical_batch_size`` bounds how many examples are differentiated at once
    (memory); it does not change the result beyond float summation order.
    """

    name = "vmap"

    def __init__(self, physical_batch_size: int | None = 256) -> None:
        self.physical_batch_size = None if physical_batch_size is None else check_int(
            "physical_batch_size", physical_batch_size, minimum=1
        )

    def per_example_grads(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch
    ) -> dict[str, torch.Tensor]:
        """∇_θ loss_fn for every example: name → tensor of shape (B, *param.shape) (one chunk, no clipping)."""
        wrapper = _LossModule(model, loss_fn)
        params = {f"model.{n}": p.detach() for n, p in trainable_parameters(model).items()}
        frozen = {f"model.{n}": p.detach() for n, p in model.named_parameters() if not p.requires_grad}
        buffers = {f"model.{n}": b.detach() for n, b in model.named_buffers()}

        def one(p: dict[str, torch.Tensor], example: Batch, draw: Batch) -> torch.Tensor:
            # Give the example a batch dimension of 1: models and losses are written for batches.
            ex = {k: v.unsqueeze(0) for k, v in example.items()}
            dr = {k: v.unsqueeze(0) for k, v in draw.items()}
            out = functional_call(wrapper, {**p, **frozen, **buffers}, (ex, dr))
            return out.sum()

        grads = vmap(grad(one), in_dims=(None, 0, 0))(params, batch, draws)
        return {k[len("model.") :]: v for k, v in grads.items()}

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        check_positive("max_grad_norm", max_grad_norm, allow_inf=True)
        n = _batch_size(batch)
        names = trainable_parameters(model)
        sums = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in names.items()}
        if n == 0:  # an empty Poisson batch: the sum is zero (noise is still added by the caller)
            return sums, torch.zeros(0)
        chunk = self.physical_batch_size or n
        all_norms = []
        was_training = model.training
        for start in range(0, n, chunk):
            sl = slice(start, min(start + chunk, n))
            g = self.per_example_grads(
                model, loss_fn, {k: v[sl] for k, v in batch.items()}, {k: v[sl] for k, v in draws.items()}
            )
            sq = sum(t.reshape(t.shape[0], -1).pow(2).sum(1) for t in g.values())
            norms = torch.sqrt(sq)
            factors = clip_factors(norms, float(max_grad_norm))
            for k, t in g.items():
                sums[k] += torch.einsum("b,b...->...", factors.to(t.dtype), t)
            all_norms.append(norms.detach())
        model.train(was_training)
        return sums, torch.cat(all_norms)


def add_noise(grads: dict[str, torch.Tensor], std: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``grads`` + N(0, std²) per coordinate, drawn from ``generator``, as new tensors (std = σ·C)."""
    std = check_nonnegative("std", std)
    if std == 0:
        return {k: v.clone() for k, v in grads.items()}
    # Draw, scale and add in place: one temporary per tensor instead of three (same values as v + std·z).
    return {
        k: torch.randn(v.shape, generator=generator, dtype=v.dtype, device=v.device).mul_(std).add_(v)
        for k, v in grads.items()
    }


_MIXING_FIX = "use GroupNorm or LayerNorm (per-example normalisation) instead"


def check_no_batch_mixing(model: nn.Module) -> None:
    """Refuse layers that mix examples of a batch (BatchNorm, InstanceNorm with running stats).

    Such layers make one example's output depend on the others, so per-example
    clipping no longer bounds one record's influence.
    """
    for name, module in model.named_modules():
        label = name or type(model).__name__
        if isinstance(module, nn.modules.batchnorm._BatchNorm):  # includes SyncBatchNorm and lazy variants
            raise ValueError(
                f"layer {label!r} ({type(module).__name__}) mixes examples across the batch, which breaks "
                f"per-example clipping in private training; {_MIXING_FIX}"
            )
        if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
            raise ValueError(
                f"layer {label!r} ({type(module).__name__}, track_running_stats=True) carries batch statistics "
                f"across examples; set track_running_stats=False or {_MIXING_FIX}"
            )


def get_strategy(
    strategy: str | GradientStrategy, *, physical_batch_size: int | str | None = "auto"
) -> GradientStrategy:
    """A strategy object from a name (``"vmap"``, ``"ghost"``) or the object itself.

    ``physical_batch_size="auto"`` chunks vmap at 256 examples (per-example gradients are
    materialised, so memory grows with the chunk) and runs ghost clipping unchunked
    (it never materialises them; chunking only costs time, about 23% at batch 1024).
    """
    if physical_batch_size == "auto":
        physical_batch_size = None if strategy == "ghost" else 256
    if not isinstance(strategy, str):
        if not callable(getattr(strategy, "clipped_sum", None)):
            raise TypeError(f"strategy must be a name or have a clipped_sum method, got {type(strategy).__name__}")
        return strategy
    if strategy == "vmap":
        return VmapGradients(physical_batch_size)
    if strategy == "ghost":
        module = importlib.import_module("featuredp.privatize_ghost")
        for attr in ("GhostGradients", "GhostNormGradients", "GhostClipping"):
            cls = getattr(module, attr, None)
            if cls is not None:
                try:
                    return cls(physical_batch_size=physical_batch_size)
                except TypeError:
                    return cls()
        raise ValueError("featuredp.privatize_ghost defines no ghost strategy class")
    raise ValueError(f"strategy must be 'vmap', 'ghost' or a GradientStrategy object, got {strategy!r}")

"""The clipping protocol and what every strategy shares.

A :class:`GradientStrategy` returns Σ_i clip_C(∇_θ loss_i) and the per-example
norms before clipping. Clipping is applied to the gradient of the loss it is
given *as a whole* — for FDP that is ℓ_priv = ℓ − ℓ_pub, never ℓ and ℓ_pub
separately (Algorithm 1; docs/engine.md). Strategies are registered by name in
:mod:`featuredp.clipping`; :func:`per_example_grads` is the one torch.func
per-example gradient helper (used by the vmap strategy and by ghost's fallback).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from featuredp.features.base import Batch

__all__ = [
    "PRECISIONS",
    "AutocastLoss",
    "GradientStrategy",
    "LossFn",
    "LossModule",
    "add_up",
    "batch_size_of",
    "check_precision",
    "clip_factors",
    "empty_result",
    "full_precision",
    "per_example_grads",
    "slice_batch",
    "trainable_parameters",
]

# Callable[[nn.Module, Batch, Batch], Tensor] returning per-example losses (B,). Any, not that Callable: a loss
# annotated for its own model class (``model: MLP``) would not type-check against ``nn.Module`` (contravariance).
LossFn = Any


#: ``fp32``: everything in the parameters' dtype; ``bf16``: forward and backward under bfloat16 autocast.
PRECISIONS = ("fp32", "bf16")
_LOW = (torch.bfloat16, torch.float16)


class AutocastLoss:
    """A loss function whose forward (and so its backward) runs under bfloat16 autocast.

    Only the model's arithmetic is in bfloat16. The per-example losses come back in float32, and the
    clipping strategies take every quantity that bounds the sensitivity in float32 or better: ghost
    clipping computes norms and weighted sums from float32 copies of the layers' activations and
    output gradients (:func:`full_precision`), and the vmap strategy's per-example gradients are in the
    parameters' dtype. The clip factors and the noise are float32 or float64 in both (docs/engine.md).

    >>> loss = AutocastLoss(lambda m, b, d: m(b["x"]).sum(1), "cpu")
    >>> loss(torch.nn.Linear(3, 2), {"x": torch.ones(4, 3)}, {}).dtype
    torch.float32
    """

    def __init__(self, loss_fn: LossFn, device_type: str, dtype: torch.dtype = torch.bfloat16) -> None:
        self.loss_fn = loss_fn
        self.device_type = device_type
        self.dtype = dtype

    def __call__(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        """The per-example losses, computed under autocast and returned in float32."""
        with torch.autocast(self.device_type, dtype=self.dtype):
            losses = self.loss_fn(model, batch, draws)
        return losses.float()

    def __repr__(self) -> str:
        return f"AutocastLoss({self.loss_fn!r}, {self.device_type!r}, {self.dtype})"


def full_precision(value: Any) -> Any:
    """``value`` with bfloat16/float16 tensors (also inside tuples, lists and dicts) as float32; the rest as is.

    >>> full_precision((torch.ones(1, dtype=torch.bfloat16), 3))[0].dtype
    torch.float32
    """
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _LOW else value
    if isinstance(value, tuple | list):
        return type(value)(full_precision(v) for v in value)
    if isinstance(value, dict):
        return {k: full_precision(v) for k, v in value.items()}
    return value


def check_precision(precision: str, device: torch.device) -> str:
    """``precision`` if the device runs it: bf16 on the CPU, and on CUDA devices that support bfloat16."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(f"precision='bf16': the CUDA device {device} does not support bfloat16; use fp32")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"precision='bf16' is supported on cpu and cuda devices, not {device.type}; use fp32")
    return precision


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
    """Per-example scale min(1, C / ‖g_i‖); the clipped norm is ≤ C (strictly, with the 1e-6 guard).

    A non-finite norm (a NaN or an overflow in one example's gradient) gets 0: that example contributes
    nothing, so one record cannot turn the whole noisy update into NaN (ARCHITECTURE rule 14). Callers must
    also zero that example's gradient rows, since 0 · NaN is NaN.

    >>> clip_factors(torch.tensor([0.5, 2.0, 4.0, float("nan"), float("inf")]), 1.0)
    tensor([1.0000, 0.5000, 0.2500, 0.0000, 0.0000])
    """
    finite = torch.isfinite(norms)
    if math.isinf(max_grad_norm):
        return finite.to(norms.dtype)
    return torch.where(finite, (max_grad_norm / (norms + 1e-6)).clamp(max=1.0), 0.0)


def batch_size_of(batch: Batch, *more: Batch) -> int:
    """The number of examples: the first dimension shared by every tensor of ``batch`` (and of ``more``,
    e.g. the loss split's draws); a ValueError if they disagree or there are no tensors.

    >>> batch_size_of({"x": torch.zeros(3, 2)}, {"pad": torch.zeros(3, 2)})
    3
    """
    sizes = {int(v.shape[0]) for b in (batch, *more) for v in b.values()}
    if len(sizes) != 1:
        what = "batch and draws" if more else "batch"
        raise ValueError(f"{what} tensors must share the first (batch) dimension, got sizes {sorted(sizes)}")
    return sizes.pop()


def slice_batch(batch: Batch, rows: slice) -> Batch:
    """The same rows of every tensor of ``batch`` (a physical chunk, or the head of a batch)."""
    return {k: v[rows] for k, v in batch.items()}


def add_up(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """t₀ + t₁ + … in order: the rounding of Python's ``sum``, without its integer start (which types as int).

    >>> add_up([torch.tensor(1.0), torch.tensor(2.0)])
    tensor(3.)
    """
    if not tensors:
        raise ValueError("add_up needs at least one tensor")
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total


def empty_result(
    params: dict[str, torch.Tensor], *batches: Batch
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """What a strategy returns for an empty batch (a normal Poisson outcome; the caller still adds noise).

    Zero sums shaped like the parameters, and no norms (shape (0,)) in the parameters' dtype, on the
    parameters' device (the batch's when nothing is trainable), never on a hard-coded CPU.

    >>> sums, norms = empty_result({"w": torch.ones(2, dtype=torch.float64)}, {"x": torch.zeros(0, 3)})
    >>> sums["w"], norms.shape, norms.dtype
    (tensor([0., 0.], dtype=torch.float64), torch.Size([0]), torch.float64)
    """
    sums = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in params.items()}
    like = next(iter(params.values()), None)
    if like is None:
        like = next((t for b in batches for t in b.values()), None)
    if like is None:  # no parameters and no tensors: nothing to follow
        return sums, torch.zeros(0)
    dtype = like.dtype if like.is_floating_point() else torch.get_default_dtype()
    return sums, torch.zeros(0, dtype=dtype, device=like.device)


class LossModule(nn.Module):
    """Wraps (model, loss_fn) so that ``functional_call`` swaps the model's parameters for every
    use inside the loss — ℓ_priv calls the model twice (ℓ and ℓ_pub), both must see the same θ."""

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, batch: Batch, draws: Batch) -> torch.Tensor:
        """The per-example losses of ``batch`` (with the loss split's ``draws``) under the current parameters."""
        return self._loss_fn(self.model, batch, draws)


def per_example_grads(
    model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, names: list[str] | None = None
) -> dict[str, torch.Tensor]:
    """∇_θ loss_fn for every example, name → (B, *param.shape), with torch.func (vmap of grad).

    ``names`` restricts the differentiated parameters (the others, and the buffers, are
    constants); default: every trainable parameter. Each example gets a batch dimension of
    one, since models and losses are written for batches.
    """
    wrapper = LossModule(model, loss_fn)
    wanted = set(trainable_parameters(model) if names is None else names)
    diff = {f"model.{n}": p.detach() for n, p in model.named_parameters() if n in wanted}
    const = {f"model.{n}": p.detach() for n, p in model.named_parameters() if n not in wanted}
    buffers = {f"model.{n}": b.detach() for n, b in model.named_buffers()}

    def one(p: dict[str, torch.Tensor], example: Batch, draw: Batch) -> torch.Tensor:
        ex = {k: v.unsqueeze(0) for k, v in example.items()}
        dr = {k: v.unsqueeze(0) for k, v in draw.items()}
        return functional_call(wrapper, {**p, **const, **buffers}, (ex, dr)).sum()

    grads = vmap(grad(one), in_dims=(None, 0, 0))(diff, batch, draws)
    return {k[len("model.") :]: v for k, v in grads.items()}

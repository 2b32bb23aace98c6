"""Exact per-example gradients with ``torch.func`` (the reference strategy).

:class:`VmapGradients` differentiates each example alone (vmap of grad of a
batch-of-one loss, :func:`featuredp.clipping.base.per_example_grads`), in
physical chunks so that a large logical batch fits in memory; the chunking does
not change the result (sums are added up). Because each example is
differentiated alone, layers that mix the batch cannot fool it; they are still
refused (:func:`featuredp.clipping.check_no_batch_mixing`), as by every strategy.
"""

from __future__ import annotations

import torch
from torch import nn

from featuredp._validate import check_int, check_positive
from featuredp.clipping.base import (
    LossFn,
    add_up,
    batch_size_of,
    clip_factors,
    empty_result,
    per_example_grads,
    slice_batch,
    trainable_parameters,
)
from featuredp.clipping.safety import ForwardStateGuard, check_no_batch_mixing
from featuredp.features.base import Batch

__all__ = ["VmapGradients"]


class VmapGradients:
    """Exact per-example gradients with ``torch.func`` (vmap of grad of a batch-of-one loss).

    ``physical_batch_size`` bounds how many examples are differentiated at once
    (memory); it does not change the result beyond float summation order.

    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(3, 1)
    >>> loss = lambda m, batch, draws: m(batch["x"]).squeeze(1) ** 2
    >>> sums, norms = VmapGradients().clipped_sum(model, loss, {"x": torch.ones(4, 3)}, {}, max_grad_norm=1.0)
    >>> sorted(sums), tuple(norms.shape)
    (['bias', 'weight'], (4,))
    >>> bool(torch.linalg.vector_norm(torch.cat([s.flatten() for s in sums.values()])) <= 4 * 1.0)
    True
    """

    name = "vmap"

    def __init__(self, physical_batch_size: int | None = 256) -> None:
        self.physical_batch_size = None if physical_batch_size is None else check_int(
            "physical_batch_size", physical_batch_size, minimum=1
        )

    def __repr__(self) -> str:
        return f"VmapGradients(physical_batch_size={self.physical_batch_size})"

    def per_example_grads(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch
    ) -> dict[str, torch.Tensor]:
        """∇_θ loss_fn for every example: name → tensor of shape (B, *param.shape) (one chunk, no clipping)."""
        return per_example_grads(model, loss_fn, batch, draws)

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Σ_i clip_C(∇_θ loss_fn(model, batch_i, draws_i)) per trainable parameter, and the norms (B,)."""
        check_positive("max_grad_norm", max_grad_norm, allow_inf=True)
        n = batch_size_of(batch, draws)
        params = trainable_parameters(model)
        check_no_batch_mixing(model)
        if n == 0:  # an empty Poisson batch: the sum is zero (noise is still added by the caller)
            return empty_result(params, batch, draws)
        sums = {k: torch.zeros_like(p, memory_format=torch.contiguous_format) for k, p in params.items()}
        chunk = self.physical_batch_size or n
        all_norms = []
        was_training = model.training
        # torch.func already refuses in-place writes to captured parameters and buffers and undoes rebinding,
        # but a tensor registered during the forward escapes vmap and stays in the model: guard this path too.
        with ForwardStateGuard(model):
            for start in range(0, n, chunk):
                sl = slice(start, min(start + chunk, n))
                g = self.per_example_grads(model, loss_fn, slice_batch(batch, sl), slice_batch(draws, sl))
                if not g:  # nothing trainable: every gradient is empty, of norm 0
                    all_norms.append(empty_result({}, batch, draws)[1].new_zeros(sl.stop - sl.start))
                    continue
                norms = torch.sqrt(add_up([t.reshape(t.shape[0], -1).pow(2).sum(1) for t in g.values()]))
                factors = clip_factors(norms, float(max_grad_norm))
                finite = torch.isfinite(norms)
                for k, t in g.items():
                    # A non-finite example has factor 0, and its gradient is zeroed as well (0 · NaN is NaN).
                    t = torch.where(finite.view(-1, *[1] * (t.dim() - 1)), t, 0)
                    sums[k] += torch.einsum("b,b...->...", factors.to(t.dtype), t)
                all_norms.append(norms.detach())
            model.train(was_training)
        return sums, torch.cat(all_norms)

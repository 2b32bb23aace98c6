"""The gradients ghost clipping's every-step checks compare against: examples computed alone, and their rounding.

Each is a computation no other example enters (a batch of one), or the rounding one computation has: the separability
cross-check and the chunk check of :mod:`featuredp.clipping.ghost_checks` compare ghost's per-example gradients with
these, and a mismatch that these roundings do not explain is mixing. On a sharded model (:mod:`featuredp.clipping.fsdp`)
the examples alone are read from their own ghost contributions one parameter at a time (:class:`AloneGradients`),
never as the whole model's gradient.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from featuredp.clipping.base import LossFn, slice_batch, trainable_parameters
from featuredp.clipping.contributions import Contribution
from featuredp.clipping.safety import AutogradHookGuard
from featuredp.features.base import Batch

__all__ = [
    "NOT_DETERMINISTIC",
    "AloneGradients",
    "alone_gradients",
    "batch_rounding_noise",
    "example_gradient",
    "example_gradients",
    "owner",
    "rounding_noise",
    "row_gradients",
]

NOT_DETERMINISTIC = (
    "GhostGradients checks on every step that the model treats examples separately, by recomputing a few examples' "
    "gradients on their own; that needs a forward that is deterministic given (batch, draws) apart from nn.Dropout "
    "modules, but two identical calls gave different gradients for {name!r}; take random numbers from the loss "
    "split's draws, or use strategy='vmap'"
)


def owner(model: nn.Module) -> str:
    """Who refuses, in the checks' errors."""
    return f"GhostGradients ({type(model).__name__})"


def example_gradient(
    model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, params: dict[str, torch.Tensor], i: int
) -> list[torch.Tensor]:
    """The gradient of example ``i`` alone (a batch of one with its own batch and draws rows), per parameter of
    ``params`` in order; zeros where no gradient reaches a parameter."""
    return example_gradients(model, loss_fn, batch, draws, params, [i])[0]


def example_gradients(
    model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, params: dict[str, torch.Tensor], rows: list[int]
) -> list[list[torch.Tensor]]:
    """:func:`example_gradient` of each of ``rows``: each row's forward alone, under one autograd-hook guard."""
    tensors = list(params.values())
    with AutogradHookGuard(owner(model)):
        losses = [loss_fn(model, slice_batch(batch, slice(i, i + 1)), slice_batch(draws, slice(i, i + 1)))
                  for i in rows]  # fmt: skip
    out = []
    for loss in losses:
        gs = torch.autograd.grad(loss.sum(), tensors, allow_unused=True)
        out.append([torch.zeros_like(t) if g is None else g.detach() for g, t in zip(gs, tensors)])
    return out


def row_gradients(
    model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, params: dict[str, torch.Tensor], rows: list[int]
) -> list[list[torch.Tensor]]:
    """∇ of the losses of ``rows``, each from one forward of the whole ``batch`` (its rows' gradients through the
    batch's computation), per parameter of ``params`` in order; zeros where no gradient reaches a parameter."""
    tensors = list(params.values())
    with AutogradHookGuard(owner(model)):
        losses = loss_fn(model, batch, draws)
    out = []
    for j, i in enumerate(rows):
        gs = torch.autograd.grad(losses[i], tensors, allow_unused=True, retain_graph=j + 1 < len(rows))
        out.append([torch.zeros_like(t) if g is None else g.detach() for g, t in zip(gs, tensors)])
    return out


class AloneGradients(Mapping[str, torch.Tensor]):
    """The gradients of rows each computed alone, formed from their ghost contributions one parameter at a time, when
    read: ``alone[name]`` is (k, *shape), or with ``weights`` the weighted sum over the rows (*shape). A sharded
    model's checks read them so: never the whole model's gradient at once, only one parameter's."""

    def __init__(self, contribs: list[dict[str, Contribution]], params: dict[str, torch.Tensor],
                 weights: torch.Tensor | None = None) -> None:  # fmt: skip
        self.contribs, self.params, self.weights = contribs, params, weights

    @torch.no_grad()
    def __getitem__(self, name: str) -> torch.Tensor:
        p = self.params[name]
        first = torch.zeros(1, dtype=torch.int64, device=p.device)
        rows = [c[name].examples(first) if name in c else torch.zeros_like(p).unsqueeze(0) for c in self.contribs]
        if self.weights is None:
            return torch.cat(rows) if rows else torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        total = torch.zeros_like(p, dtype=rows[0].dtype if rows else p.dtype)
        for w, r in zip(self.weights.tolist(), rows):
            total.add_(r[0], alpha=w)
        return total

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)


def _float64(model: nn.Module, batch: Batch, draws: Batch, names: list[str]
             ) -> tuple[nn.Module, dict[str, torch.Tensor], Batch, Batch] | None:  # fmt: skip
    """A float64 copy of the model, its trainable parameters, and the batch and draws in float64 (None when the
    copy's parameters are not ``names``)."""
    wide = copy.deepcopy(model).double()
    wide_params = trainable_parameters(wide)
    if list(wide_params) != names:
        return None
    b64 = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    d64 = {k: v.double() if v.is_floating_point() else v for k, v in draws.items()}
    return wide, wide_params, b64, d64


def _against_float64(model: nn.Module, batch: Batch, draws: Batch, names: list[str],
                     measure: Callable[[nn.Module, dict[str, torch.Tensor], Batch, Batch], list[torch.Tensor]]
                     ) -> torch.Tensor | None:  # fmt: skip
    """``measure(wide, wide_params, batch64, draws64)`` on a float64 copy (:func:`_float64`), stacked; None when
    the model or the loss cannot run in float64."""
    try:
        copied = _float64(model, batch, draws, names)
        return None if copied is None else torch.stack(measure(*copied))
    except (RuntimeError, TypeError, ValueError):
        return None


def _apart(narrow: Sequence[torch.Tensor], exact: Sequence[torch.Tensor]) -> torch.Tensor:
    """‖narrow − exact‖ over all of one example's parameters, in float64."""
    return torch.cat([(a.to(torch.float64) - b).flatten() for a, b in zip(narrow, exact)]).norm()


def rounding_noise(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Batch,
    draws: Batch,
    params: dict[str, torch.Tensor],
    picked: np.ndarray,
    alone: dict[str, torch.Tensor],
) -> torch.Tensor | None:
    """Per checked example, ‖its float32 gradient alone − its float64 gradient alone‖ (float64, shape (k,)):
    how far float32 rounding alone moves it. None when the model or the loss cannot run in float64 (the
    comparison then stands as it is)."""
    names = list(params)

    def measure(wide: nn.Module, wide_params: dict[str, torch.Tensor], b64: Batch, d64: Batch) -> list[torch.Tensor]:
        return [_apart([alone[n][j] for n in names], example_gradient(wide, loss_fn, b64, d64, wide_params, i))
                for j, i in enumerate(picked.tolist())]  # fmt: skip

    return _against_float64(model, batch, draws, names, measure)


def batch_rounding_noise(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Batch,
    draws: Batch,
    params: dict[str, torch.Tensor],
    picked: np.ndarray,
) -> torch.Tensor | None:
    """Per checked example, ‖∇ its loss in a float32 forward of the whole ``batch`` − the same in float64‖
    (float64, shape (k,)): how far rounding moves its row in the batch's own computation, the branches its
    kernels' rounding takes at kinks included (the same forward as ghost's, so the same branches). None when
    the model or the loss cannot run in float64."""
    rows = picked.tolist()

    def measure(wide: nn.Module, wide_params: dict[str, torch.Tensor], b64: Batch, d64: Batch) -> list[torch.Tensor]:
        narrow = row_gradients(model, loss_fn, batch, draws, params, rows)
        exact = row_gradients(wide, loss_fn, b64, d64, wide_params, rows)
        return [_apart(mine, wide_row) for mine, wide_row in zip(narrow, exact)]

    return _against_float64(model, batch, draws, list(params), measure)


def alone_gradients(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Batch,
    draws: Batch,
    params: dict[str, torch.Tensor],
    picked: np.ndarray,
    *,
    twice: bool,
) -> dict[str, torch.Tensor]:
    """Gradients of the examples ``picked``, each from a forward and backward of that example alone.

    A plain loop of batch-of-one autograd calls rather than torch.func: it works for every model ghost
    clipping accepts (ragged bags with boolean masks and other dynamic shapes cannot be vmapped), and k is
    small. With ``twice`` (a model's first check) each example is computed twice: a forward that draws
    random numbers outside nn.Dropout modules would make the comparison meaningless, and is refused with
    its own message (one that starts doing so later fails the comparison instead: refused all the same).
    """
    names = list(params)
    rows: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for grads in example_gradients(model, loss_fn, batch, draws, params, picked.tolist()):
        for n, g in zip(names, grads):
            rows[n].append(g)
    again = example_gradients(model, loss_fn, batch, draws, params, picked.tolist()) if twice else []
    for j, grads in enumerate(again):
        for n, g in zip(names, grads):
            first = rows[n][j]
            if g.numel() and float((g - first).abs().max()) > 1e-5 * float(first.abs().max()) + 1e-12:
                raise ValueError(NOT_DETERMINISTIC.format(name=n))
    return {n: torch.stack(r) for n, r in rows.items()}

"""``strategy="auto"`` (the Trainer's default): ghost or vmap, chosen once per run from public shapes and timings.

Which strategy is faster depends on the model and the batch's shape, not on the data: ghost clipping wins by one
to two orders of magnitude on wide dense layers (it never materialises a per-example gradient), vmap wins on small
sequence models, where ghost's per-layer sums over positions cost more than the per-example gradients themselves
(docs/performance.md). Where every Linear, Embedding and convolution sees one position per example, ghost is
chosen from the shapes alone. Otherwise :class:`AutoStrategy` times both, once, on a stand-in batch of zeros shaped
like the run's records (the shape of a record is public: the schema, the fixed text length) with as many rows as
the run's expected batch (public: ``rows``, set from the plan), at most :data:`STAND_IN_ROWS`, and runs vmap for
the whole run if it was :data:`VMAP_MARGIN` times faster, ghost otherwise. No private value, and not the realised
size of a private batch, enters the choice; the result is the chosen strategy's, which is the same up to float
rounding either way (both pass the contract suite and the replay self-test), so the choice moves no privacy
quantity. It is printed once (stderr), and a checkpoint keeps it (:meth:`AutoStrategy.resume_choice`).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import torch
from torch import nn

from featuredp.clipping.base import LossFn, batch_size_of, empty_result, trainable_parameters
from featuredp.clipping.ghost import GhostGradients
from featuredp.clipping.safety import ForwardStateGuard, check_no_batch_mixing
from featuredp.clipping.vmap import VmapGradients
from featuredp.features.base import Batch

__all__ = ["STAND_IN_ROWS", "VMAP_MARGIN", "AutoStrategy"]

#: the most rows of the stand-in batch each strategy is timed on
STAND_IN_ROWS = 32
#: how much faster vmap must time than ghost to be chosen
VMAP_MARGIN = 1.2

_MULTI_POSITION = (nn.Linear, nn.Embedding, nn.modules.conv._ConvNd)


def _positions(model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch) -> int:
    """The most positions per example that a Linear, Embedding or convolution of ``model`` sees in ``loss_fn`` on the
    stand-in ``batch`` (1: each sees one row per example; a convolution counts its input's spatial positions)."""
    most = 1

    def seen(module: nn.Module, args: tuple[Any, ...]) -> None:
        nonlocal most
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if x is None or x.dim() == 0:
            return
        shape = tuple(x.shape[1:])
        if isinstance(module, nn.Linear):
            shape = shape[:-1]
        elif isinstance(module, nn.modules.conv._ConvNd):
            shape = shape[1:]
        most = max(most, math.prod(shape))

    check_no_batch_mixing(model)  # what both strategies refuse (batch statistics), refused before any forward
    handles = [m.register_forward_pre_hook(seen) for m in model.modules() if isinstance(m, _MULTI_POSITION)]
    try:
        with torch.no_grad(), ForwardStateGuard(model):
            loss_fn(model, batch, draws)
    finally:
        for h in handles:
            h.remove()
    return most


class AutoStrategy:
    """Ghost or vmap, whichever clips a stand-in batch of zeros faster on this model; chosen at the first call.

    ``physical_batch_size`` goes to the strategy chosen (vmap's default 256 when None is not given). ``rows``: the
    stand-in's rows (the run's expected batch, set by the run from its plan; at most :data:`STAND_IN_ROWS`).

    >>> auto = AutoStrategy()
    >>> model = torch.nn.Linear(3, 2)
    >>> loss = lambda m, batch, draws: m(batch["x"]).square().sum(1)
    >>> sums, norms = auto.clipped_sum(model, loss, {"x": torch.ones(4, 3)}, {}, 1.0)
    >>> auto.chosen in ("ghost", "vmap"), tuple(norms.shape)
    (True, (4,))
    """

    def __init__(self, physical_batch_size: int | None = None, *, rows: int = STAND_IN_ROWS,
                 verbose: bool = True) -> None:  # fmt: skip
        self.physical_batch_size = physical_batch_size
        self.rows = max(1, min(int(rows), STAND_IN_ROWS))
        self.verbose = verbose
        self.strategies: dict[str, Any] = {
            "ghost": GhostGradients(physical_batch_size),
            "vmap": VmapGradients(256 if physical_batch_size is None else physical_batch_size),
        }
        #: the strategy in use once chosen ("ghost" or "vmap"), and each one's time on the stand-in (seconds)
        self.chosen: str | None = None
        self.timings: dict[str, float] = {}
        #: the most positions per example a layer saw on the stand-in (1: ghost without timing)
        self.positions: int | None = None
        #: ``auto``, and the choice once made (``auto:vmap``)
        self.name = "auto"

    def __repr__(self) -> str:
        return f"AutoStrategy(physical_batch_size={self.physical_batch_size}, chosen={self.chosen!r})"

    def resume_choice(self, name: Any) -> None:
        """Take the choice a checkpoint recorded (``"auto:vmap"``), so that a resumed run does not time again and
        continues with the strategy it ran; anything else leaves the choice to be made."""
        if isinstance(name, str) and name.startswith("auto:") and name[5:] in self.strategies:
            self.chosen = name[5:]
            self.name = name

    def clipped_sum(
        self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float,
        captured: Any = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The chosen strategy's clipped sum (the choice is made at the first non-empty batch); ``captured``: ghost's
        forward already run (:meth:`GhostGradients.capture`), when ghost was chosen."""
        if self.chosen is None:
            if batch_size_of(batch, draws) == 0:  # an empty Poisson draw: nothing to clip, nothing to learn from
                return empty_result(trainable_parameters(model), batch, draws)
            self.chosen = self._choose(model, loss_fn, batch, draws, max_grad_norm)
            self.name = f"auto:{self.chosen}"
        if captured is not None and self.chosen == "ghost":
            return self.strategies["ghost"].clipped_sum(model, loss_fn, batch, draws, max_grad_norm,
                                                        captured=captured)  # fmt: skip
        return self.strategies[self.chosen].clipped_sum(model, loss_fn, batch, draws, max_grad_norm)

    def _choose(self, model: nn.Module, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float) -> str:
        """Ghost where no layer sees more than one position per example; otherwise time each strategy on zeros
        shaped like ``rows`` records of ``batch`` (its values are never read), vmap only if clearly faster."""
        stand_in = {k: torch.zeros((self.rows, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in batch.items()}
        stand_draws = {k: torch.zeros((self.rows, *v.shape[1:]), dtype=v.dtype, device=v.device)
                       for k, v in draws.items()}  # fmt: skip
        self.positions = _positions(model, loss_fn, stand_in, stand_draws)
        if self.positions == 1:
            # Ghost's per-example norm of a one-position layer is two row norms, against vmap's whole per-example
            # gradient: ghost by the shapes alone, without a timing that could come out either way on a small model.
            if self.verbose:
                print("featuredp: strategy auto: ghost (every layer sees one position per example)", file=sys.stderr)
            return "ghost"
        for name, strategy in self.strategies.items():
            strategy.clipped_sum(model, loss_fn, stand_in, stand_draws, max_grad_norm)  # warm-up (plans, kernels)
            best = float("inf")
            for _ in range(2):
                start = time.perf_counter()
                strategy.clipped_sum(model, loss_fn, stand_in, stand_draws, max_grad_norm)
                if stand_in and next(iter(stand_in.values())).is_cuda:
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - start)
            self.timings[name] = best
        # Ghost unless vmap is clearly faster: near a tie the timing's noise would decide, and ghost holds less.
        chosen = "vmap" if self.timings["vmap"] * VMAP_MARGIN < self.timings["ghost"] else "ghost"
        if self.verbose:
            print(f"featuredp: strategy auto: {chosen} (ghost {1e3 * self.timings['ghost']:.1f} ms, vmap "
                  f"{1e3 * self.timings['vmap']:.1f} ms on a stand-in of {self.rows} zero rows)", file=sys.stderr)
        return chosen

"""``strategy="auto"``: ghost or vmap, chosen once per run by timing both on a public stand-in batch.

Which strategy is faster depends on the model and the batch's shape, not on the data: ghost clipping wins by one
to two orders of magnitude on wide dense layers (it never materialises a per-example gradient), vmap wins on small
sequence models, where ghost's per-layer sums over positions cost more than the per-example gradients themselves
(docs/performance.md). :class:`AutoStrategy` times both, once, on a stand-in batch of zeros shaped like the run's
records (the shape of a record is public: the schema, the fixed text length) with as many rows as the run's expected
batch (public: ``rows``, set from the plan), at most :data:`STAND_IN_ROWS`, and then runs the faster one for the
whole run. No private value, and not the realised size of a private batch, enters the choice; the result is the
chosen strategy's, which is the same up to float rounding either way (both pass the contract suite and the replay
self-test), so the choice moves no privacy quantity. It is printed once (stderr).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from torch import nn

from featuredp.clipping.base import LossFn, batch_size_of, empty_result, trainable_parameters
from featuredp.clipping.ghost import GhostGradients
from featuredp.clipping.vmap import VmapGradients
from featuredp.features.base import Batch

__all__ = ["STAND_IN_ROWS", "AutoStrategy"]

#: the most rows of the stand-in batch each strategy is timed on
STAND_IN_ROWS = 32


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
        #: ``auto``, and the choice once made (``auto:vmap``)
        self.name = "auto"

    def __repr__(self) -> str:
        return f"AutoStrategy(physical_batch_size={self.physical_batch_size}, chosen={self.chosen!r})"

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
        """Time each strategy on zeros shaped like ``rows`` records of ``batch`` (its values are never read)."""
        stand_in = {k: torch.zeros((self.rows, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in batch.items()}
        stand_draws = {k: torch.zeros((self.rows, *v.shape[1:]), dtype=v.dtype, device=v.device)
                       for k, v in draws.items()}  # fmt: skip
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
        chosen = min(self.timings, key=lambda k: self.timings[k])
        if self.verbose:
            print(f"featuredp: strategy auto: {chosen} (ghost {1e3 * self.timings['ghost']:.1f} ms, vmap "
                  f"{1e3 * self.timings['vmap']:.1f} ms on a stand-in of {self.rows} zero rows)", file=sys.stderr)
        return chosen

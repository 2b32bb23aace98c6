"""``BatchMemoryManager``: one Poisson batch in physical chunks that fit in memory, one private step.

The path and the call are Opacus's, with ``featuredp`` in place of ``opacus``::

    from featuredp.utils.batch_memory_manager import BatchMemoryManager

    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=64, optimizer=optimizer) as memory_safe:
        for x, y in memory_safe:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()          # steps once per drawn batch, after its last chunk

Each batch the private loader draws (one accounted step, charged when drawn) is split into chunks of at most
``max_physical_batch_size`` records. Before each chunk the optimizer is told whether a step would end the logical
batch (Opacus's ``signal_skip_step``): the chunks' clipped sums add up, and the noise is added once, at the last
chunk's ``step()``. The update is the one-batch update (equal up to float rounding) and ε is unchanged. A step
with a chunk missing, or chunks of two draws in one step, is refused by the engine.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from featuredp._validate import check_int
from featuredp.dp_wrappers import DPOptimizer
from featuredp.private_loader import PrivateDataLoader, leaves

__all__ = ["BatchMemoryManager", "chunk_rows", "rows_of_batch"]


class BatchMemoryManager:
    """A context manager over the private loader whose batches come in physical chunks (see the module docstring)."""

    def __init__(self, *, data_loader: Any, max_physical_batch_size: int, optimizer: Any) -> None:
        if not isinstance(data_loader, PrivateDataLoader):
            raise TypeError(f"data_loader must be the loader make_private returned, got {type(data_loader).__name__}: "
                            "featuredp draws the batches it splits")  # fmt: skip
        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(f"optimizer must be the optimizer make_private returned, got {type(optimizer).__name__}")
        self.data_loader = data_loader
        self.max_physical_batch_size = check_int("max_physical_batch_size", max_physical_batch_size, minimum=1)
        self.optimizer = optimizer

    def __enter__(self) -> _PhysicalBatches:
        return _PhysicalBatches(self.data_loader, self.max_physical_batch_size, self.optimizer)

    def __exit__(self, *exc: Any) -> None:
        return None


class _PhysicalBatches:
    """The private loader's draws, each in chunks of at most ``size`` records, with the skip-step signals."""

    def __init__(self, loader: PrivateDataLoader, size: int, optimizer: DPOptimizer) -> None:
        self.loader, self.size, self.optimizer = loader, size, optimizer

    def __len__(self) -> int:
        expected = self.optimizer.expected_batch_size
        return len(self.loader) * max(1, math.ceil(expected / self.size))

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            chunks = max(1, math.ceil(rows_of_batch(batch) / self.size))
            for k, chunk in enumerate(chunk_rows(batch, chunks, self.loader.last_groups)):
                self.optimizer.signal_skip_step(do_skip=k < chunks - 1)
                yield chunk


def rows_of_batch(batch: Any) -> int:
    """The number of rows of a collated batch (its first batch-first tensor's)."""
    return next((int(t.shape[0]) for _, t in leaves(batch) if t.dim() >= 1), 0)


def chunk_rows(batch: Any, chunks: int, groups: np.ndarray | None = None) -> Iterator[Any]:
    """``batch`` in exactly ``chunks`` near-equal chunks of consecutive rows (as Opacus splits; some are empty when
    the batch has fewer rows than chunks). ``groups`` (a user-level draw's user per row, contiguous): every cut at a
    user's boundary, the nearest to the even split, so that each user's records stay in one chunk (a user larger
    than a chunk makes its chunk larger)."""
    rows = rows_of_batch(batch)
    bounds = [round(i * rows / chunks) for i in range(chunks + 1)]
    if groups is not None and rows:
        edges = np.concatenate([[0], np.flatnonzero(np.diff(groups)) + 1, [rows]])
        snapped = [int(edges[np.abs(edges - b).argmin()]) for b in bounds]
        bounds = [max(snapped[: i + 1]) for i in range(len(snapped))]
    for k in range(chunks):
        yield _slice(batch, bounds[k], bounds[k + 1])


def _slice(batch: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of every batch-first tensor of a collated batch (a tensor, tuple/list or dict of them)."""
    if isinstance(batch, torch.Tensor):
        return batch[lo:hi] if batch.dim() >= 1 else batch
    if isinstance(batch, dict):
        return {k: _slice(v, lo, hi) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_slice(v, lo, hi) for v in batch)
    return batch

"""The user's data loader, private: every batch drawn by the run's secret sampler, and only those trained on.

:func:`private_loader` returns a :class:`PrivateDataLoader`: the user's dataset and collate, its batches drawn by
the run's sampler (Poisson at rate q, or BandMF/BLT's cyclic sampler). Every batch it yields is a :class:`Draw`,
accounted as one private step the moment it is drawn, whether or not the loop trains on it: a loop that skips a
batch (``break``, a filter) can only over-count. :class:`Draws` remembers the current draw with a copy of each of
its tensors (a loss's tensor passed on unchanged is recognised by exact equality with it) and, made from the copies
when a tensor is not, a keyed fingerprint of each row, so that the engine can refuse, in one line, a backward on
anything else: a batch of the original loader, a validation batch, a batch reused after its step, a batch changed
in the loop (through ``.data`` too: the copy is the engine's own).

What may happen to a drawn batch in the loop: ``.to(device)``, a dtype cast (matched within the cast's rounding),
``view``/``reshape`` of a tensor with the batch first (``labels.view(-1)``), and splitting it into physical chunks of
rows, each row in one ``backward()`` (``BatchMemoryManager``, gradient accumulation; rows are paired by their
fingerprints, identical records being interchangeable). Any other transform (a normalisation,
a mask computed in the loop) belongs in the dataset or the collate, where the engine's record-alone check sees it.
A transform in the loop cannot be told apart from a batch-dependent one (standardising each batch moves one
record's clipped gradient by many C), so it is refused rather than trusted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset, default_collate

__all__ = ["Draw", "Draws", "PrivateDataLoader", "RowsUsedError", "index_records", "leaves", "private_loader"]

# Keyed fingerprints: exact for integers and floats of the same precision; a cast to half precision rounds each
# value to 2^-8 relative, so the tolerance is relative to Σ|x_j·r_j|.
_TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 8e-3}
_FLOAT_TOLERANCE = 1e-5
_EXACT_TOLERANCE = 1e-12


def leaves(batch: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """(path, tensor) for every tensor of a collated batch (a tensor, a tuple/list or a dict of them, nested)."""
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from leaves(v, (*path, k))
    elif isinstance(batch, list | tuple):
        for i, v in enumerate(batch):
            yield from leaves(v, (*path, i))
    elif hasattr(batch, "keys") and hasattr(batch, "__getitem__"):  # a transformers BatchEncoding
        for k in batch.keys():  # noqa: SIM118 - a mapping that is not a dict
            yield from leaves(batch[k], (*path, k))


def at(batch: Any, path: tuple[Any, ...]) -> Any:
    """The leaf of ``batch`` at ``path``."""
    for key in path:
        batch = batch[key]
    return batch


@dataclass
class Draw:
    """One batch the private loader yielded: its number, the dataset indices (secret), its tensors' fingerprints."""

    number: int
    indices: np.ndarray
    size: int
    used: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # rows already in a backward()
    #: per tensor of the batch: each row's keyed print, its scale, the dtype and the row's width (made when first
    #: needed, from ``copies``)
    prints: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, torch.dtype, int]] = field(default_factory=dict)
    #: per tensor of the batch with a row per record: a copy of it as drawn (what the loss's tensors are compared with)
    copies: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict)
    printed: bool = False
    stepped: bool = False
    #: the collated batch as the loader yielded it (a feature map's loss reads its other columns: a text's Ψ(x))
    batch: Any = None
    #: at user level, each row's user within the draw (0 .. U − 1, contiguous); None: records are the unit
    groups: np.ndarray | None = None


class Draws:
    """The draws of one run's private loader and the keyed row fingerprints that recognise them."""

    def __init__(self) -> None:
        self.current: Draw | None = None
        self.count = 0
        self._keys: dict[tuple[int, str], torch.Tensor] = {}
        self._seed = int.from_bytes(os.urandom(8), "little") >> 1  # secret: never from a published seed

    def _key(self, width: int, device: torch.device) -> torch.Tensor:
        key = self._keys.get((width, str(device)))
        if key is None:
            g = torch.Generator().manual_seed(self._seed + width)
            key = torch.rand(width, generator=g, dtype=torch.float64).add_(0.5).to(device)
            self._keys[(width, str(device))] = key
        return key

    def _print(self, t: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if rows == 0 or t.numel() % rows:
            return None
        flat = t.detach().reshape(rows, -1).to(torch.float64)
        key = self._key(int(flat.shape[1]), flat.device)
        return (flat @ key).cpu(), (flat.abs() @ key).cpu()

    def drawn(self, indices: np.ndarray, batch: Any, groups: np.ndarray | None = None) -> Draw:
        """Register ``batch`` (the collate of the records at ``indices``; ``groups``: their users at user level) as
        the current draw."""
        self.count += 1
        size = len(indices)
        draw = Draw(self.count, np.asarray(indices, dtype=np.int64), size, used=np.zeros(size, dtype=bool),
                    batch=batch, groups=groups)  # fmt: skip
        for path, t in leaves(batch):
            if t.dim() >= 1 and int(t.shape[0]) == size and (size == 0 or t.numel() % size == 0):
                # A copy, not the loop's tensor: a write into the batch (through .data too) cannot change it.
                draw.copies[path] = t.detach().clone()
        self.current = draw
        return draw

    def _printed(self, draw: Draw) -> dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, torch.dtype, int]]:
        """The draw's row prints, made from its copies the first time they are needed."""
        if not draw.printed:
            for path, t in draw.copies.items():
                printed = self._print(t, draw.size)
                if printed is not None:
                    draw.prints[path] = (*printed, t.dtype, t.numel() // draw.size)
            draw.printed = True
        return draw.prints

    def _as_drawn(self, tensor: torch.Tensor, draw: Draw) -> tuple[Any, ...] | None:
        """The path of the draw's tensor that ``tensor`` equals exactly, as drawn (same shape, dtype and device, the
        same values: the loop passed it on unchanged, the common case); None if there is none."""
        for path, copy in draw.copies.items():
            if (copy.shape == tensor.shape and copy.dtype == tensor.dtype and copy.device == tensor.device
                    and torch.equal(copy, tensor)):  # fmt: skip
                return path
        return None

    def rows_of(self, batch: dict[str, torch.Tensor], draw: Draw) -> tuple[np.ndarray, dict[str, tuple[Any, ...]]]:
        """Which rows of ``draw`` the loss's ``batch`` holds (all of them, or a physical chunk), and from which of the
        draw's tensors each of its tensors came (moved, cast or reshaped batch-first). Raises ``LookupError`` naming
        the first tensor that is not the draw's."""
        size = next((int(t.shape[0]) for t in batch.values() if t.dim() >= 1), 0)
        paths: dict[str, tuple[Any, ...]] = {}
        if size == 0:  # an empty Poisson batch (or chunk): nothing of any record reaches the step
            if any(t.numel() for t in batch.values()):
                raise LookupError(next(iter(batch)))
            return np.zeros(0, dtype=np.int64), paths
        if draw.size == 0:
            raise LookupError(next(iter(batch)))
        if size == draw.size:  # the whole draw, in order (the common case): no pairing of rows needed
            whole = {k: self._as_drawn(t, draw) for k, t in batch.items()}
            for k, t in batch.items():
                if whole[k] is None:  # moved, cast or reshaped: matched row by row by the keyed prints
                    whole[k] = self._in_order(t, draw)
            if all(v is not None for v in whole.values()):
                if draw.used.any():
                    raise RowsUsedError(next(iter(batch)))
                return np.arange(size), {k: v for k, v in whole.items() if v is not None}
        candidates = np.ones((size, draw.size), dtype=bool)
        for key, t in batch.items():
            found = self._candidates(t, size, draw)
            if found is None:
                raise LookupError(key)
            paths[key], rows = found
            candidates &= rows
        return _assign(candidates, draw.used, key=next(iter(batch))), paths

    def _in_order(self, tensor: torch.Tensor, draw: Draw) -> tuple[Any, ...] | None:
        """The path of the draw's tensor that ``tensor`` is row for row, in order; None if there is none."""
        found = self._candidates(tensor, draw.size, draw, in_order=True)
        return None if found is None else found[0]

    def _candidates(self, tensor: torch.Tensor, size: int, draw: Draw, *, in_order: bool = False
                    ) -> tuple[tuple[Any, ...], np.ndarray] | None:  # fmt: skip
        """The first of the draw's tensors whose rows hold every row of ``tensor`` (each row's candidates), or with
        ``in_order`` whose rows are ``tensor``'s row for row."""
        printed = self._print(tensor, size)
        if printed is None:
            return None
        seen, _ = printed
        width = tensor.numel() // size
        for path, (value, scale, dtype, drawn_width) in self._printed(draw).items():
            if drawn_width != width:
                continue
            # Exact values still print with float64 rounding that depends on the matrix shape (a chunk of 2 rows
            # against the draw of 5 sums in another order): relative 1e-12, far above it and far below any change.
            tol = max(_TOLERANCE.get(tensor.dtype, 0.0), _TOLERANCE.get(dtype, 0.0), _EXACT_TOLERANCE)
            if tensor.dtype.is_floating_point or dtype.is_floating_point:
                tol = max(tol, _FLOAT_TOLERANCE)
            if in_order:
                if bool(((seen - value).abs() <= tol * scale + 1e-12).all()):
                    return path, np.ones(0, dtype=bool)
                continue
            close = (seen[:, None] - value[None, :]).abs() <= tol * scale[None, :] + 1e-12
            if bool(close.any(1).all()):
                return path, close.numpy()
        return None


class RowsUsedError(LookupError):
    """Rows of the batch are rows of the draw already in an earlier ``backward()``."""


def _assign(candidates: np.ndarray, used: np.ndarray, *, key: str) -> np.ndarray:
    """One distinct row of the draw, not ``used`` by an earlier chunk, for each row of the batch (in order: the
    batch's rows are the draw's in order when it is the whole draw or a slice of it; identical records are
    interchangeable). ``RowsUsedError`` when a row's only matches are used."""
    taken = used.copy()
    rows = np.empty(candidates.shape[0], dtype=np.int64)
    for i, options in enumerate(candidates):
        free = np.flatnonzero(options & ~taken)
        if free.size == 0:
            raise RowsUsedError(key) if options.any() else LookupError(key)
        rows[i] = free[0]
        taken[free[0]] = True
    return rows


class _PlanSampler(Sampler[list[int]]):
    """Batches of indices from the run's secret sampler, ``batches`` per epoch as the original loader had; each
    is remembered (in order) for the loader to pair with its collated batch."""

    def __init__(self, draw: Callable[[], tuple[np.ndarray, np.ndarray | None]], batches: int) -> None:
        self.draw, self.batches = draw, batches
        self.pending: list[tuple[np.ndarray, np.ndarray | None]] = []

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[list[int]]:
        for idx in self.indices():
            yield [int(i) for i in idx]

    def indices(self) -> Iterator[np.ndarray]:
        """The draws as int64 arrays (each also kept in ``pending``): what a batched fetch indexes with."""
        for _ in range(self.batches):
            idx, groups = self.draw()
            idx = np.asarray(idx, dtype=np.int64)
            self.pending.append((idx, groups))
            yield idx


class PrivateDataLoader(DataLoader):
    """The user's loader with its batches drawn by the run's sampler; each yielded batch is a draw, charged as one
    private step when it is drawn (``on_draw``)."""

    def __init__(self, loader: DataLoader, draw: Callable[[], tuple[np.ndarray, np.ndarray | None]], batches: int,
                 on_draw: Callable[[np.ndarray, Any, np.ndarray | None], None]) -> None:  # fmt: skip
        dataset, collate = loader.dataset, loader.collate_fn

        def collate_or_empty(items: list[Any]) -> Any:
            if items:
                return collate(items)
            # The shape of one record is public (the schema); its values are not used.
            return _empty_like(collate([dataset[0]]))

        self._plan_sampler = _PlanSampler(draw, batches)
        self._on_draw = on_draw
        self.user_collate = collate
        #: the last draw's user per row at user level (physical chunks cut at users' boundaries); None otherwise
        self.last_groups: np.ndarray | None = None
        super().__init__(dataset, batch_sampler=self._plan_sampler, collate_fn=collate_or_empty,
                         num_workers=loader.num_workers, pin_memory=loader.pin_memory)  # fmt: skip

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._plan_sampler.pending.clear()
        batches = self._indexed() if self._batched_fetch() else super().__iter__()
        for batch in batches:
            # Batches come back in the sampler's order (workers included), so the oldest pending indices are this
            # batch's.
            idx, groups = self._plan_sampler.pending.pop(0)
            self._on_draw(idx, batch, groups)
            self.last_groups = groups
            yield batch

    @property
    def per_record_collate(self) -> bool:
        """Whether each row of a batch is its record whatever the batch: a ``TensorDataset`` with the default collate
        (``default_collate`` of its items stacks the records' rows unchanged). The record-alone check of the collate
        has nothing to find there."""
        return isinstance(self.dataset, TensorDataset) and self.user_collate is default_collate

    def _batched_fetch(self) -> bool:
        """Whether a draw can be read with one index per tensor: a ``TensorDataset`` with the default collate, in
        this process. ``default_collate`` of its items is exactly ``[t[idx] for t in tensors]``; any other
        dataset or collate is read item by item, as the user's loader reads it."""
        return self.per_record_collate and self.num_workers == 0 and not self.pin_memory

    def _indexed(self) -> Iterator[Any]:
        """The sampler's draws read with one index tensor per tensor of the dataset (no per-item fetch)."""
        for rows in self._plan_sampler.indices():
            yield index_records(self.dataset, rows)  # type: ignore[arg-type]  # a TensorDataset: _batched_fetch


def index_records(dataset: TensorDataset, rows: Any) -> list[torch.Tensor]:
    """The records ``rows`` of a ``TensorDataset`` with one index per tensor: what ``default_collate`` makes of its
    items, without reading them one by one."""
    index = torch.as_tensor(rows, dtype=torch.long)
    return [t.index_select(0, index.to(t.device)) for t in dataset.tensors]


def private_loader(loader: DataLoader, draw: Callable[[], tuple[np.ndarray, np.ndarray | None]], batches: int,
                   on_draw: Callable[[np.ndarray, Any, np.ndarray | None], None]) -> PrivateDataLoader:  # fmt: skip
    """The user's loader with its batches drawn by ``draw`` (the run's secret draw: record indices, and each
    record's user at user level), refusing samplers it would replace."""
    check_loader(loader)
    return PrivateDataLoader(loader, draw, batches, on_draw)


def check_loader(loader: DataLoader) -> None:
    """Refuse, in one line, a loader setting the private sampler would silently replace."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    default = isinstance(sampler, torch.utils.data.SequentialSampler | torch.utils.data.RandomSampler)
    if not default:
        raise ValueError(f"data_loader has sampler={type(sampler).__name__}: featuredp draws every batch itself "
                         "(Poisson at rate 1/len(data_loader), from secret coins); give a loader with the default "
                         "sampler (shuffle=True or False) and weight records in the loss instead")  # fmt: skip
    if batch_sampler is not None and type(batch_sampler) is not torch.utils.data.BatchSampler:
        raise ValueError(f"data_loader has batch_sampler={type(batch_sampler).__name__}: featuredp draws every "
                         "batch itself (Poisson at rate 1/len(data_loader)); give a loader with batch_size= "
                         "instead")  # fmt: skip
    if getattr(loader, "drop_last", False):
        raise ValueError("data_loader has drop_last=True: featuredp draws Poisson batches of varying size (expected "
                         "len(dataset)/len(data_loader)) and keeps every one; give drop_last=False")  # fmt: skip


def _empty_like(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, dict):
        return {k: _empty_like(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_empty_like(v) for v in batch)
    return batch

"""The loader's records as the engine reads them outside a draw: Algorithm 1's public batch and the replay self-test.

:class:`LoaderRecords` is the part of :class:`featuredp.privacy_engine.PrivacyEngine` that reads the user's dataset
through the loader's own collate rather than through the private sampler: the public batch of Algorithm 1 (and the
backstop's), one index per tensor where the collate stacks records unchanged (a ``TensorDataset``'s default
collate), item by item otherwise; and :meth:`~LoaderRecords.check_model`, the replay self-test through the engine's
own loop (one step with and without a record, the record-alone check on every row).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from featuredp.batches import Batch, as_batch, gather
from featuredp.own_loop_rows import DrawnRows
from featuredp.private_loader import index_records
from featuredp.testing.replay import replay_engine_step

__all__ = ["LoaderRecords"]


class LoaderRecords(DrawnRows):
    """The public batch read from the loader's dataset and the replay self-test, for an engine that holds the
    loader's dataset and collate, its run and state, its wrapped model, criterion and optimizer, and the draws."""

    _dataset: Any
    _collate: Callable[[list[Any]], Any]
    _model: Any
    _criterion: Any
    _optimizer: Any

    def _require_state(self) -> Any:
        raise NotImplementedError

    def _draw_indices(self, run: Any, state: Any) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def _drawn(self, indices: np.ndarray, batch: Any, groups: np.ndarray | None = None) -> None:
        raise NotImplementedError

    def check_model(self, data: Any = None, *, records: int = 3, batch_size: int = 32) -> list[Any]:
        """The replay self-test through this engine's own loop (wrapped model, criterion, ``loss.backward()``,
        ``optimizer.step()``): see :func:`featuredp.testing.replay_engine_step`. Call it before training.

        ``data``: the records to replay (a dict of batch-first tensors ``"x"`` and ``"y"``, or a TabularDataset). By
        default the loader's own records, collated by its collate, and then every row of each replayed batch is
        also collated alone and compared with its row in the batch (the record-alone check, on every row rather
        than a secret one): a collate that pads to the batch's longest record is refused here, before training."""
        state = self._require_state()
        if state.private_steps:
            raise ValueError("check_model replays a step of a run that has not started; call it before training")
        if self._require_run().users is not None:
            raise ValueError("check_model replays the step with and without one record; a user-level run's "
                             "replay (with and without one user's records) is not built yet: its sensitivity is "
                             "pinned by tests/test_users.py (docs/users.md)")  # fmt: skip
        collated = data is None
        if collated:
            data = self._as_xy(self._collate([self._dataset[i] for i in range(len(self._dataset))]))
        n = int(next(iter(as_batch(data).values())).shape[0])
        rng = np.random.default_rng()
        reports = []
        self._every_row = as_batch(data) if collated else None
        try:
            for _ in range(int(records)):
                rows = rng.choice(n, size=min(int(batch_size), n - 1) + 1, replace=False)
                reports.append(replay_engine_step(self, data, record=int(rows[0]),
                                                  batch=[int(i) for i in rows[1:]]))  # fmt: skip
        finally:
            self._every_row = None
        return reports

    def _replay_step(self, data: Batch) -> None:
        """One step of the user's loop on the batch the private sampler draws from ``data`` (the replay test's);
        Algorithm 1's public batch reads ``data`` too."""
        idx, groups = self._draw_indices(self._require_run(), self._require_state())
        batch = gather(data, idx)
        own = self._public_batch, self._one_record
        self._public_batch = lambda idx: gather(data, idx)  # type: ignore[method-assign]
        if self._every_row is not None and _same_records(data, self._every_row):
            # check_model on the loader's own records: each record alone through the loader's collate (not in the
            # replay's swap run, whose record x holds another record's values)
            self._one_record = lambda index: self._as_xy(own[1](index))  # type: ignore[method-assign]
        else:
            self._one_record = lambda index: gather(data, np.asarray([index]))  # type: ignore[method-assign]
        try:
            self._drawn(idx, batch, groups)
            self._optimizer.zero_grad()
            out = self._model(batch["x"])
            if batch["y"].dim() == 2 and out.dim() == 3:  # a token batch: the loop flattens, as an LM loop does
                torch.nn.functional.cross_entropy(out.flatten(0, 1), batch["y"].flatten()).backward()
            else:
                self._criterion(out, batch["y"]).backward()
            self._optimizer.step()
        finally:
            del self._public_batch, self._one_record  # the methods again
            assert (self._public_batch, self._one_record) == own

    def _public_batch(self, idx: np.ndarray) -> Batch:
        """The loader's records at ``idx`` collated as its loader collates them: one index per tensor where the
        collate stacks records unchanged (a ``TensorDataset``), item by item otherwise."""
        if self._per_record_collate:
            return self._as_xy(index_records(self._dataset, idx))
        return self._as_xy(self._collate([self._dataset[int(i)] for i in idx]))

    @staticmethod
    def _as_xy(batch: Any) -> Batch:
        """A collated batch as a dict: its own keys, or ``x``, ``y`` for a pair."""
        if isinstance(batch, dict):
            return dict(batch)
        x, y = batch
        return {"x": x, "y": y}



def _same_records(a: Batch, b: Batch) -> bool:
    """Whether two dicts of tensors hold the same records (the replay's data, before any swap)."""
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)



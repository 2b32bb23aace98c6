"""Which rows of which draw a loss in the user's loop holds, and whether each record alone makes the same loss.

:class:`DrawnRows` is the part of :class:`featuredp.privacy_engine.PrivacyEngine` that reads a loss's batch against
the private loader's draws: its provenance (every tensor one of the last draw's, moved, cast or reshaped
batch-first; all its rows or a chunk not yet in a backward) and the record-alone check (on the first draw and a
secret share of the others, one secret record collated alone must make the same loss and gradient as its row in the
batch). Both refuse in one line; the engine calls them from its backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from featuredp.batches import Batch
from featuredp.own_loop_checks import loss_and_gradient, same_up_to_rounding
from featuredp.private_loader import Draw, Draws, RowsUsedError, at

__all__ = ["RECORD_ALONE_RATE", "DrawnRows"]

#: the share of draws (after the first, always checked) on which a secret record is collated alone and compared
RECORD_ALONE_RATE = 0.25


class DrawnRows:
    """The provenance of a loss's rows and the record-alone check, for an engine that holds the draws
    (``_draws``), the secret coins of the check (``_check_coins``), the loader's dataset and collate, and its run."""

    _draws: Draws
    _check_coins: np.random.Generator
    _every_row: Batch | None
    _dataset: Any
    _collate: Callable[[list[Any]], Any]
    #: the loader's rows are its records whatever the batch (a TensorDataset, default collate): nothing to check
    _per_record_collate: bool = False

    def _require_run(self) -> Any:
        raise NotImplementedError

    def _provenance(self, batch: Batch) -> tuple[Draw, np.ndarray, dict[str, tuple[Any, ...]]]:
        """The current draw and which of its rows the loss's batch holds, if every tensor of the batch is one of the
        draw's (moved, cast, reshaped batch-first; all rows or a chunk not yet in a backward); refused in one line
        otherwise. Returns the draw, the rows and where each tensor came from."""
        draw = self._draws.current
        if draw is None:
            raise RuntimeError("this batch was not drawn by the data loader make_private returned: iterate that "
                               "loader (not the original one, not a validation set) for every private step")
        if draw.stepped:
            raise RuntimeError("this batch was already trained on: featuredp takes one optimizer.step() per batch "
                               "the private loader draws (draw the next batch)")  # fmt: skip
        try:
            rows, paths = self._draws.rows_of(batch, draw)
        except RowsUsedError:
            raise RuntimeError(
                "loss.backward() was called twice on rows of one drawn batch before optimizer.step(): each record of a "
                "draw counts once (physical chunks of one draw are fine: BatchMemoryManager)") from None
        except LookupError as exc:
            raise RuntimeError(
                f"the batch's tensor {exc.args[0]!r} is not the private loader's last batch (a batch of another "
                "loader, an older batch, or one changed in the loop): only .to(device), a dtype cast and a "
                "batch-first reshape are allowed; put transforms in the dataset or the collate, per record"
            ) from None
        return draw, rows, paths

    def _record_alone_check(self, draw: Draw, rows: np.ndarray, batch: Batch, paths: dict[str, tuple[Any, ...]],
                            loss_fn: Callable[..., torch.Tensor], draws: Batch) -> None:  # fmt: skip
        """On the first draw and a secret quarter of the others: one secret record of the batch, collated alone by
        the loader's collate, must make the same loss and gradient as its row in the batch (not where the collate
        is ``default_collate`` of a ``TensorDataset``, which stacks each record's rows unchanged). A collate that
        pads to the batch's longest record, or any collate that lets records mix, changes what the model makes of
        a row with the batch, and so one record's clipped contribution: refused."""
        if self._every_row is not None:  # check_model on the loader's own records: every row
            for row in range(len(rows)):
                self._compare_alone(draw, rows, row, batch, paths, loss_fn, draws)
            return
        if self._per_record_collate:
            return
        if draw.number > 1 and self._check_coins.random() >= RECORD_ALONE_RATE:
            return
        self._compare_alone(draw, rows, int(self._check_coins.integers(len(rows))), batch, paths, loss_fn, draws)

    def _compare_alone(self, draw: Draw, rows: np.ndarray, row: int, batch: Batch, paths: dict[str, tuple[Any, ...]],
                       loss_fn: Callable[..., torch.Tensor], draws: Batch) -> None:  # fmt: skip
        """Row ``row`` of the loss's batch (row ``rows[row]`` of the draw) collated alone against itself in the batch
        (loss and gradient)."""
        alone_items = self._one_record(int(draw.indices[rows[row]]))
        alone: Batch = {}
        for key, t in batch.items():
            leaf = at(alone_items, paths[key])
            leaf = leaf if leaf.dim() == t.dim() else leaf.reshape(1, -1)
            alone[key] = leaf.to(device=t.device, dtype=t.dtype)
        in_batch = {k: v[row:row + 1] for k, v in batch.items()}
        mine = {k: v[row:row + 1] for k, v in draws.items()}
        model = self._require_run().model
        a, b = loss_and_gradient(model, loss_fn, in_batch, mine), loss_and_gradient(model, loss_fn, alone, mine)
        if a is None or b is None or not same_up_to_rounding(a, b):
            raise RuntimeError(
                "the data loader's collate makes a record's loss or gradient depend on the other records of its batch "
                "(for example padding to the batch's longest text with a model that averages over positions): "
                "collate each record the same way whatever the batch (pad to a fixed length, or mask the padding "
                "in the model)")  # fmt: skip

    def _one_record(self, index: int) -> Any:
        """The record at ``index`` collated alone by the loader's collate."""
        return self._collate([self._dataset[index]])

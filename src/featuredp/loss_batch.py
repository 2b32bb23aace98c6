"""The loss's batch in the user's loop, as the clipping strategy reads it.

A ``loss.backward()`` in the user's loop names a batch only through the model's call (its positional and keyword
tensors) and the loss's target. :func:`loss_batch` turns them into the dict of batch-first tensors and the
per-example loss a strategy differentiates (a ``labels.view(-1)`` target made batch-first again);
:func:`with_draw_columns` adds what a feature map's loss reads besides the model's input (a text's Ψ view),
taken from the draw itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from featuredp.batches import Batch
from featuredp.dp_wrappers import DPLoss, PerExampleLoss
from featuredp.losses import LossSplit
from featuredp.private_loader import Draw, leaves

__all__ = ["loss_batch", "with_draw_columns"]


def loss_batch(loss: DPLoss, split: LossSplit | None) -> tuple[Batch, Callable[..., torch.Tensor]]:
    """The loss's batch as a dict of batch-first tensors, and the per-example loss the strategy differentiates
    (the split's with a feature map)."""
    args, kwargs = loss.inputs
    target = loss.target
    size = next((int(v.shape[0]) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
    tail = tuple(target.shape[1:])
    if size is not None and target.dim() >= 1 and int(target.shape[0]) != size:
        if target.numel() % max(size, 1) or size == 0:
            raise TypeError(f"the target's first dimension ({target.shape[0]}) is not the batch's ({size}) or a "
                            "multiple of it")  # fmt: skip
        target = target.reshape(size, -1)  # labels.view(-1) of an LM loop: batch-first again, row i = example i
    if split is not None:  # ℓ and ℓ_pub are the split's (cross-entropy on Ψ(x) for column maps)
        if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
            raise TypeError("with a feature map the model must be called as model(x) on one tensor x")
        return {"x": args[0], "y": target}, split.loss
    keys = [f"arg{i}" for i in range(len(args))]
    tensors = {k: v for k, v in zip(keys, args, strict=True) if isinstance(v, torch.Tensor)}
    tensors.update({f"kw:{k}": v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    constants = ({k: v for k, v in zip(keys, args, strict=True) if not isinstance(v, torch.Tensor)},
                 {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)})  # fmt: skip
    return {**tensors, "y": target}, PerExampleLoss(loss.criterion, loss.transform, len(args), constants, tail)


def with_draw_columns(batch: Batch, draw: Draw, rows: np.ndarray, paths: dict[str, tuple[Any, ...]]
                      ) -> tuple[Batch, dict[str, tuple[Any, ...]]]:  # fmt: skip
    """The loss's batch (``x``, ``y``) with the draw's other columns at the same rows: what a feature map's loss
    reads besides the model's input (a text batch's ``x_pub``/``y_pub``, Ψ of each text), taken from the draw
    itself, so that it is the same records' whatever the loop passed."""
    batch, paths = dict(batch), dict(paths)
    device = batch["x"].device
    index = torch.as_tensor(rows, dtype=torch.long)
    for path, t in leaves(draw.batch):
        key = path[-1] if path else None
        if len(path) == 1 and isinstance(key, str) and key not in batch and t.dim() >= 1 and t.shape[0] == draw.size:
            batch[key] = t.index_select(0, index.to(t.device)).to(device)
            paths[key] = path
    return batch, paths

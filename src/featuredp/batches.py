"""Batches: dicts of batch-first tensors, and the helpers every layer uses on them.

A batch is ``{"x": float features, "y": int64 labels, "x_cat": int64 codes (-1 =
masked), ...}`` with the examples along the first dimension. Models are called
through :func:`forward`: models that need the whole dict set ``takes_batch = True``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from featuredp.errors import DataValidationError
from featuredp.features.base import Batch

__all__ = ["Batch", "as_batch", "correct", "evaluate", "forward", "gather", "resolve_device", "to_device"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"`` (or None: the CPU) as a device that exists.

    A device that is not there is a one-line ``ValueError`` naming it, before any work starts.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps") if mps is not None and mps.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be cpu, cuda, cuda:N, mps or auto, got {device!r} ({exc})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available on this machine (use --device cpu or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device={device!r}: Apple MPS is not available on this machine (use --device cpu)")
    elif dev.type != "cpu":
        raise ValueError(f"device must be cpu, cuda, cuda:N, mps or auto, got {device!r}")
    return dev


def to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch's tensors on ``device`` (no copy for tensors already there)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def forward(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Logits of ``model`` on ``batch`` (whole dict for ``takes_batch`` models, else ``batch["x"]``)."""
    if getattr(model, "takes_batch", False):
        return model(batch)
    return model(batch["x"])


def as_batch(data: Any) -> Batch:
    """A TabularDataset (X, y, X_cat) or a dict of batch-first tensors/arrays → dict of tensors."""
    if isinstance(data, dict):
        out = {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)) for k, v in data.items()}
    elif hasattr(data, "X") and hasattr(data, "y"):
        out = {"x": torch.as_tensor(np.asarray(data.X, dtype=np.float32)),
               "y": torch.as_tensor(np.asarray(data.y, dtype=np.int64))}
        if getattr(data, "X_cat", None) is not None:
            out["x_cat"] = torch.as_tensor(np.asarray(data.X_cat, dtype=np.int64))
    else:
        raise TypeError(f"data must be a TabularDataset or a dict of tensors, got {type(data).__name__}")
    if not out:
        raise DataValidationError("data holds no tensors")
    sizes = {k: int(v.shape[0]) for k, v in out.items()}
    if len(set(sizes.values())) != 1:
        raise DataValidationError(f"all data tensors must have the same number of records, got {sizes}")
    for k, v in out.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise DataValidationError(f"data[{k!r}] contains NaN or infinite values")
    return out


def gather(data: Batch, idx: np.ndarray) -> Batch:
    """The records ``idx`` (numpy indices, as the samplers draw them) of every tensor, on the tensors' device."""
    it = torch.from_numpy(np.asarray(idx, dtype=np.int64))
    devices = {v.device for v in data.values()}
    if len(devices) == 1:
        it = it.to(next(iter(devices)))
        return {k: v.index_select(0, it) for k, v in data.items()}
    return {k: v.index_select(0, it.to(v.device)) for k, v in data.items()}


def _outputs(model: nn.Module, data: Any, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, labels) of ``data`` in chunks of ``batch_size``, the model in eval mode and without gradients
    (its mode is restored afterwards)."""
    batch = as_batch(data)
    n = next(iter(batch.values())).shape[0]
    device = next((t.device for t in (*model.parameters(), *model.buffers())), torch.device("cpu"))
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for s in range(0, n, batch_size):
                b = {k: v[s : s + batch_size].to(device) for k, v in batch.items()}
                yield forward(model, b), b["y"]
    finally:
        model.train(was)


def evaluate(model: nn.Module, data: Any, *, batch_size: int = 8192) -> dict[str, float]:
    """Accuracy and mean cross-entropy of a classifier on ``data`` (full records)."""
    n = len(as_batch(data)["y"])
    correct, total_loss = 0, 0.0
    for logits, y in _outputs(model, data, batch_size):
        correct += int((logits.argmax(-1) == y).sum())
        total_loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
    return {"accuracy": correct / max(n, 1), "loss": total_loss / max(n, 1)}


def correct(model: nn.Module, data: Any, *, batch_size: int = 8192) -> np.ndarray:
    """Per record of ``data``, 1.0 where the classifier's prediction is right, else 0.0 (a float array)."""
    parts = [(logits.argmax(-1) == y).cpu().numpy() for logits, y in _outputs(model, data, batch_size)]
    return np.concatenate(parts).astype(float) if parts else np.zeros(0)

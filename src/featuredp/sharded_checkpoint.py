"""Checkpoints of a sharded model (FSDP2): its weights and optimizer states in ``torch.distributed.checkpoint``.

A run's checkpoint is, on every rank, a private file of its own (:func:`featuredp.distributed.save_rank_checkpoint`:
its sampler, noise and stream state, never sent to another rank). When the model is sharded, its weights and the
optimizers' moments go instead into a DCP folder beside that file (``checkpoint.pt.shards/<name>/``), written by
every rank at once, and the rank files name it. So:

* the folder is fresh for each save and only named once every rank's file is written: a crash mid-save leaves
  the previous checkpoint whole (an unnamed folder is removed at the next save);
* it is owner-only (0700), like the rank files;
* DCP reads its ``.metadata`` with ``pickle``; its SHA-256 rides in the rank files (read with the safe loader),
  and a folder whose metadata differs is refused before DCP reads it;
* every refusal is agreed: a rank that cannot read the folder stops every rank, none waits in DCP's collectives.

The weights are the same tensors the run releases at every step (post-processing of its noisy sums); the
accounting, the ledger's token and the keys stay in the rank files (docs/distributed.md, "Checkpoints").
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featuredp.clipping.fsdp import Lockstep, is_sharded
from featuredp.distributed import DistContext, save_rank_checkpoint

__all__ = ["SHARDS_SUFFIX", "load_shards", "save_checkpoint_files", "shards_folder"]

#: a checkpoint ``X``'s sharded weights and optimizer states live in the folder ``X`` + this suffix
SHARDS_SUFFIX = ".shards"


def shards_folder(path: str | os.PathLike[str]) -> Path:
    """The folder beside the checkpoint ``path`` (rank 0's file) that holds its DCP saves."""
    p = Path(path)
    return p.with_name(p.name + SHARDS_SUFFIX)


def _metadata_digest(folder: Path) -> str:
    return hashlib.sha256((folder / ".metadata").read_bytes()).hexdigest()


def _rank0(value: Any) -> Any:
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _states(model: nn.Module, optimizers: Mapping[str, torch.optim.Optimizer], weights: bool) -> dict[str, Any]:
    # DCP fills an optimizer without state by a step of zero gradients at lr 0 (the parameters do not move), on
    # the saving and the loading side alike, so both hold the same keys.
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {**({"model": get_model_state_dict(model)} if weights else {}),
            **{key: get_optimizer_state_dict(model, opt) for key, opt in optimizers.items()}}  # fmt: skip


def _save_shards(path: str | os.PathLike[str], model: nn.Module, optimizers: Mapping[str, torch.optim.Optimizer],
                 step: int, weights: bool) -> dict[str, Any]:  # fmt: skip
    """Save ``model`` and ``optimizers`` (their sharded states) with DCP into a fresh folder under
    :func:`shards_folder`; a collective. Returns what the rank files record: the folder's name and the SHA-256 of
    its metadata, the same on every rank."""
    import torch.distributed.checkpoint as dcp

    root = shards_folder(path)
    name = None
    if torch.distributed.get_rank() == 0:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"step{step:08d}-{os.urandom(4).hex()}"
        (root / name).mkdir(mode=0o700)
    name = _rank0(name)
    dcp.save(_states(model, optimizers, weights), checkpoint_id=root / name)
    digest = _rank0(_metadata_digest(root / name) if torch.distributed.get_rank() == 0 else None)
    return {"name": name, "metadata_sha256": digest, "weights": weights, "optimizers": sorted(optimizers)}


def save_checkpoint_files(ctx: DistContext | None, path: str | os.PathLike[str], payload: dict[str, Any],
                          model: nn.Module | None, optimizers: Mapping[str, torch.optim.Optimizer], *,
                          weights: bool = True, barrier: bool = True) -> None:  # fmt: skip
    """Write a checkpoint: ``payload`` in each rank's private file (:func:`save_rank_checkpoint`) and, for a
    sharded ``model``, its weights and ``optimizers``' states in a fresh DCP folder the files name (``"shards"``);
    the folders of earlier saves are removed once every rank's file names the new one. ``payload`` must then hold
    neither the weights nor those optimizers' states. ``model=None``: nothing sharded to save; ``weights=False``:
    the optimizers' states only (a caller that saves the weights itself). ``barrier=False`` (an unsharded model
    only; DCP's save is a collective): :func:`save_rank_checkpoint`'s."""
    if model is not None and is_sharded(model):
        step = int(payload.get("step", payload.get("state", {}).get("private_steps", 0)))
        payload = {**payload, "shards": _save_shards(path, model, optimizers, step, weights)}
    # Sharded, it ends with a barrier: every rank's file names the new folder before an old one is removed.
    save_rank_checkpoint(ctx, path, payload, barrier=barrier or "shards" in payload)
    if "shards" in payload and torch.distributed.get_rank() == 0:
        for old in shards_folder(path).iterdir():
            if old.name != payload["shards"]["name"]:
                shutil.rmtree(old, ignore_errors=True)


def load_shards(path: str | os.PathLike[str], shards: Any, model: nn.Module,
                optimizers: Mapping[str, torch.optim.Optimizer]) -> None:  # fmt: skip
    """Load the DCP folder a checkpoint's rank files name (``shards``, as saved) into ``model`` and
    ``optimizers``; a collective. Refused on every rank, before DCP reads anything, if any rank's file names
    another folder, the folder is missing, or its metadata is not the one saved."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    if not is_sharded(model):
        raise ValueError(f"the checkpoint {path} holds a sharded model's weights: resume it with sharding='fsdp' "
                         "on the same number of ranks")  # fmt: skip
    shards = shards if isinstance(shards, dict) else {}
    names: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(names, shards.get("name"))
    folder = shards_folder(path) / str(shards.get("name"))
    error: Exception | None = None
    try:
        if not {"name", "metadata_sha256"} <= set(shards):
            raise ValueError(f"the checkpoint {path} names no sharded weights folder")
        if len(set(names)) != 1:
            raise ValueError(f"the ranks' checkpoint files name different weights folders ({sorted(set(names))}): "
                             "a save was cut off between ranks; resume from an earlier copy of the whole "
                             "checkpoint or start a new run")  # fmt: skip
        if not (folder / ".metadata").is_file():
            raise FileNotFoundError(f"the sharded weights of checkpoint {path} are missing: {folder} (on several "
                                    "nodes the checkpoint folder must be on a shared filesystem)")  # fmt: skip
        if _metadata_digest(folder) != shards["metadata_sha256"]:
            raise ValueError(f"{folder}/.metadata is not the file this checkpoint saved (its SHA-256 differs): "
                             "refused before it is unpickled")  # fmt: skip
    except Exception as exc:
        error = exc
    Lockstep().raise_if_any(error, lambda: ValueError("another rank could not read the checkpoint's sharded weights"))
    # An optimizer the save did not hold is left as it is (as an unsharded checkpoint without one leaves it).
    optimizers = {k: v for k, v in optimizers.items() if k in shards.get("optimizers", optimizers)}
    states = _states(model, optimizers, bool(shards.get("weights", True)))
    dcp.load(states, checkpoint_id=folder)
    if "model" in states:
        set_model_state_dict(model, states["model"])
    for key, opt in optimizers.items():
        set_optimizer_state_dict(model, opt, states[key])

"""Sharding a model with FSDP2 for a private run: which modules become FSDP units.

:func:`shard_model` wraps a model with ``torch.distributed.fsdp.fully_shard`` the way featuredp's private step
needs it (docs/distributed.md, "Models larger than one device"): every module that holds trainable parameters of
its own, none of them shared with a module outside it, becomes a unit; the root holds the rest (a token embedding
tied to the output head stays whole in the root, since FSDP2 gives a shared parameter to one unit). Ghost clipping
then sees each unit's unsharded parameters during its forward and backward only (:mod:`featuredp.clipping.fsdp`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from featuredp.clipping.fsdp import is_sharded, local_tensor, whole

__all__ = ["load_local_state", "local_state", "rewrap_optimizer_state", "shard_model", "units", "whole_state_dict"]


def units(model: nn.Module) -> list[str]:
    """The names of the modules :func:`shard_model` wraps before the root, in ``named_modules`` order."""
    users: dict[int, set[int]] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            users.setdefault(id(p), set()).add(id(m))
    out = []
    for name, m in model.named_modules():
        if not name:
            continue
        own = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if own and all(users[id(p)] == {id(m)} for p in m.parameters(recurse=False)):
            out.append(name)
    return out


def shard_model(model: nn.Module, *, mesh: Any = None) -> nn.Module:
    """``model`` wrapped in place with ``fully_shard`` (each of :func:`units`, then the root) over ``mesh`` (None:
    every rank of the default process group), and returned. A model already sharded is returned as it is."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("sharding='fsdp' needs torch.distributed initialised: launch with torchrun")
    if is_sharded(model):
        return model
    from torch.distributed.fsdp import fully_shard

    modules = dict(model.named_modules())
    for name in units(model):
        fully_shard(modules[name], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def whole_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` on the CPU with every sharded tensor gathered whole: what ``model.pt`` holds, the
    same file as an unsharded run's. A collective for a sharded model (every rank calls it)."""
    return {k: whole(v).detach().cpu() for k, v in model.state_dict().items()}


# -- checkpoints: each rank keeps its own shards (its own private file, featuredp.distributed) -----------------------


def local_state(obj: Any) -> Any:
    """``obj`` (a state dict, possibly nested) with every DTensor replaced by its local shard: plain tensors, which
    ``torch.load(weights_only=True)`` reads back; a rank's checkpoint holds its own shards only."""
    if isinstance(obj, torch.Tensor):
        return local_tensor(obj)
    if isinstance(obj, dict):
        return {k: local_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(local_state(v) for v in obj)
    return obj


def load_local_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`local_state` of a sharded model's ``state_dict`` into its shards (the same sharding: the same
    number of ranks), refusing a shard of another shape."""
    own = model.state_dict()
    if set(own) != set(state):
        raise ValueError(f"the checkpoint's model holds {sorted(set(state) ^ set(own))[:5]} where this model differs")
    with torch.no_grad():
        for name, value in own.items():
            local = local_tensor(value)
            if tuple(local.shape) != tuple(state[name].shape):
                raise ValueError(f"the checkpoint's shard of {name!r} has shape {tuple(state[name].shape)}, this "
                                 f"rank's {tuple(local.shape)}: resume with the same number of ranks")  # fmt: skip
            local.copy_(state[name])


def rewrap_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict`` of :func:`local_state`: each state tensor of a sharded parameter (a moment of its
    shard's shape) becomes a DTensor like its parameter again."""
    from torch.distributed.tensor import DTensor

    for p, state in optimizer.state.items():
        if not isinstance(p, DTensor):
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.shape == p.to_local().shape:
                state[key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                                stride=p.stride())  # fmt: skip

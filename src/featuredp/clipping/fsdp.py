"""What ghost clipping needs to know about a model sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Under ``fully_shard`` a rank holds a shard (a DTensor) of each parameter between calls. Around a wrapped module's
forward and backward FSDP all-gathers the *unsharded* parameter (a plain ``nn.Parameter`` of the full shape, one
object per parameter for the model's life, its storage freed between uses) and reshards it after. Ghost clipping
works from the layers' inputs and output gradients, which FSDP leaves whole, so its per-example norms are the
unsharded model's and its clipped sums come out at each parameter's full shape: rank r's sum over rank r's records.
Three things differ from one process, and live here:

* **Layer types.** ``fully_shard`` swaps a module's class for a subclass (``FSDPLinear``, MRO ``FSDPLinear,
  FSDPModule, Linear``); :func:`plain_type` is the class the ghost rules know.
* **What the forward differentiates.** Gradients taken against the sharded DTensors are ``None`` (they are not in
  the graph), and a ``.backward()`` would reduce-scatter across ranks, which a per-example computation must not
  do. :func:`forward_parameters` gives the unsharded parameters (the first-call validation and the every-step
  check take their batch-of-one gradients against these: local, full shape, no collective).
* **Lockstep.** Every forward and backward of a wrapped module is a collective (its all-gather). Each rank must
  make the same number of them in the same order, whatever its own records: the Poisson batch sizes, the checks'
  secret choices and their outcomes differ from rank to rank, so :class:`Lockstep` agrees on counts and verdicts
  (an all-reduce) and pads with passes over zero rows. A check that fails on one rank raises on every rank, so no
  rank waits for a collective that will never come.

The hook guard lets exactly one autograd hook through in a private forward: FSDP's own pre-backward hook
(``FSDPState._pre_backward``, which all-gathers the parameters again for the backward and leaves gradients alone);
:func:`is_fsdp_hook` is that test.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from featuredp.clipping.contributions import Contribution

__all__ = [
    "Lockstep",
    "check_meshes",
    "forward_parameters",
    "fsdp_module_type",
    "is_fsdp_hook",
    "is_sharded",
    "local_tensor",
    "plain_type",
    "reduce_to_shard",
    "sharded_parameters",
    "sharded_sums",
    "whole",
]


@functools.cache
def fsdp_module_type() -> type | None:
    """``torch.distributed.fsdp.FSDPModule``, or None where this torch build has no distributed support."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.fsdp import FSDPModule  # absent from builds without distributed

    return FSDPModule


@functools.cache
def _dtensor_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor  # absent from builds without distributed

    return DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (this rank's elements), any other tensor as it is. Checks that read a sharded
    parameter's values read these: a DTensor's own comparisons are collectives."""
    cls = _dtensor_type()
    return t.to_local() if cls is not None and isinstance(t, cls) else t  # type: ignore[attr-defined]


def whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole on every rank (a collective), any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def plain_type(module: nn.Module) -> type:
    """The module's class as written, below ``fully_shard``'s subclass (``FSDPLinear`` → ``nn.Linear``)."""
    cls = type(module)
    fsdp = fsdp_module_type()
    if fsdp is None or not isinstance(module, fsdp):
        return cls
    return next(c for c in cls.__mro__[1:] if not issubclass(c, fsdp))


def is_sharded(model: nn.Module) -> bool:
    """True if ``fully_shard`` wrapped the model or any of its modules."""
    fsdp = fsdp_module_type()
    return fsdp is not None and any(isinstance(m, fsdp) for m in model.modules())


def is_fsdp_hook(hook: Any) -> bool:
    """True for FSDP2's pre-backward hook (a bound ``FSDPState._pre_backward``), the one hook a private forward
    may register: it unshards the parameters for the backward and returns no gradient."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    return getattr(hook, "__func__", None) is FSDPState._pre_backward and isinstance(
        getattr(hook, "__self__", None), FSDPState
    )


def _fsdp_params(model: nn.Module) -> list[Any]:
    fsdp = fsdp_module_type()
    out = []
    for m in model.modules():
        if fsdp is not None and isinstance(m, fsdp):
            group = m._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
            if group is not None:
                out.extend(group.fsdp_params)
    return out


def sharded_parameters(model: nn.Module, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``params`` with each unsharded FSDP parameter replaced by its sharded DTensor: what the optimizer holds.

    Between a forward and its backward a module's attribute is the unsharded parameter (FSDP2 keeps the root's
    unsharded after the forward), so names read from ``named_parameters`` then would miss the shards."""
    by_id = {}
    for fp in _fsdp_params(model):
        by_id[id(fp.sharded_param)] = fp.sharded_param
        unsharded = getattr(fp, "_unsharded_param", None)
        if unsharded is not None:
            by_id[id(unsharded)] = fp.sharded_param
    return {name: by_id.get(id(p), p) for name, p in params.items()}


def forward_parameters(model: nn.Module, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``params`` (name → the model's trainable parameter) with each FSDP-sharded parameter replaced by the
    unsharded parameter its module computes with: what a forward's graph differentiates.

    FSDP creates an unsharded parameter at a module's first all-gather and keeps that object (its storage freed
    between uses); modules not yet run are unsharded and resharded once here, one FSDP unit at a time, so the
    memory is that of the largest unit. Every rank calls this at the same point (it is a collective)."""
    fsdp_params = _fsdp_params(model)
    missing = [fp for fp in fsdp_params if not hasattr(fp, "_unsharded_param")]
    if missing:
        fsdp = fsdp_module_type()
        for m in model.modules():
            if fsdp is not None and isinstance(m, fsdp):
                m.unshard()  # type: ignore[operator]
                m.reshard()  # type: ignore[operator]
    by_id = {id(fp.sharded_param): fp.unsharded_param for fp in fsdp_params}
    return {name: by_id.get(id(p), p) for name, p in params.items()}


def reduce_to_shard(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The sum over every rank of ``full`` (this rank's full-shape tensor), as a DTensor sharded as ``like`` (the
    parameter's DTensor): this rank's box of the sum. Every rank's records are its own (FSDP and HSDP alike), so the
    sum is over all the ranks of ``like``'s mesh, which must be every rank (:func:`check_meshes`). FSDP's usual
    ``Shard(0)`` on one mesh dimension is a reduce-scatter (rows padded to a multiple of the ranks, as ``torch.chunk``
    cuts them); any other placement an all-reduce of ``full`` in place, then this rank's box."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(like, DTensor):
        raise TypeError(f"like must be a DTensor (a sharded parameter), got {type(like).__name__}")
    mesh, placements = like.device_mesh, like.placements
    shape, offset = compute_local_shape_and_global_offset(like.shape, mesh, placements)
    rows_sharded = len(placements) == 1 and type(placements[0]) is Shard and placements[0].dim == 0
    if mesh.ndim == 1 and rows_sharded and full.dim():
        ranks, rows = mesh.size(), full.shape[0]
        per = -(-rows // ranks)
        pad = full.new_zeros((per * ranks - rows, *full.shape[1:]))
        padded = torch.cat([full, pad]) if len(pad) else full
        out = full.new_empty((per, *full.shape[1:]))
        torch.distributed.reduce_scatter_tensor(out, padded.contiguous(), group=mesh.get_group())
        box = out[: shape[0]].contiguous()
    else:
        torch.distributed.all_reduce(full)
        box = full[tuple(slice(o, o + n) for o, n in zip(offset, shape))].contiguous()
    return DTensor.from_local(box, mesh, placements, run_check=False, shape=like.shape,
                              stride=like.stride())  # fmt: skip


def check_meshes(params: Mapping[str, torch.Tensor]) -> None:
    """Refuse, in one line, a parameter sharded over fewer than every rank: each rank's records are summed over all
    of them, and the noise key is agreed over all of them."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    world = torch.distributed.get_world_size()
    for name, p in params.items():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None and mesh.size() != world:
            raise ValueError(f"parameter {name!r} is sharded over {mesh.size()} of the {world} ranks: a sharded "
                             "private run spans every rank (shard over a mesh of all of them; HSDP: a 2-D mesh)")


def sharded_sums(params: dict[str, torch.Tensor], combined: Mapping[str, Contribution], factors: torch.Tensor,
                 shards: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # fmt: skip
    """Each parameter's clipped sum Σ_i factors_i·g_i over this rank's records (from its ``combined`` contribution;
    zeros where none), summed over the ranks, as its DTensor shard like ``shards[name]``. In the parameters' order
    (every rank makes the same collectives), one full-shape sum alive at a time."""
    out = {}
    for name, p in params.items():
        c = combined.get(name)
        full = c.weighted_sum(factors).to(p.dtype) if c is not None else torch.zeros_like(p)
        out[name] = reduce_to_shard(full, shards[name])
    return out


class Lockstep:
    """Agreement across the ranks of a sharded model, so every rank makes the same collectives.

    ``group``: the process group that shards the model (None: the default one). Without ``torch.distributed``
    initialised (one process), every agreement is the rank's own value.
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def _reduce(self, value: float, op: Any) -> float:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=op, group=self.group)
        return float(t.item())

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any."""
        return self._reduce(float(flag), torch.distributed.ReduceOp.MAX) > 0

    def first(self, value: int) -> int:
        """Rank 0's ``value``, on every rank (a secret choice made once for all)."""
        joined = torch.distributed.is_available() and torch.distributed.is_initialized()
        mine = value if not joined or torch.distributed.get_rank(self.group) == 0 else 0
        return int(self._reduce(float(mine), torch.distributed.ReduceOp.SUM))

    def max(self, count: int) -> int:
        """The largest ``count`` over the ranks."""
        return int(self._reduce(float(count), torch.distributed.ReduceOp.MAX))

    def raise_if_any(self, error: BaseException | None, agreed: Callable[[], BaseException]) -> None:
        """Raise on every rank if any rank has an ``error``: this rank's own, or ``agreed()`` where it has none (a
        rank that raised alone would leave the others waiting in their next collective)."""
        if self.any(error is not None):
            raise error if error is not None else agreed()

"""Data-parallel training on ``torch.distributed``: which rank owns which records, and the collectives.

The rules that keep one multi-process run the *same* mechanism as one process (docs/distributed.md):

* the index space 0..N−1 is partitioned into W contiguous shards; rank r Poisson-samples only its
  shard, at the global rate p, from its own secret stream (independent across ranks, never a shared
  seed), so the union of the ranks' batches is exactly a Poisson batch of the whole dataset;
* the per-rank clipped sums are all-reduced, and Gaussian noise of total std σC is added exactly
  once, by rank 0, before the all-reduce; every rank then holds the same noisy sum and divides by
  the global expected batch size p·N;
* every rank joins every collective, even with an empty local batch (no skipped steps, no deadlock);
* accounting is that of one process with the same (σ, p, T, N); only rank 0 prints and writes;
* every rank runs the same plan: before the first private step the ranks compare their settings
  (:func:`agree_across_ranks`) and all refuse, naming the field, if any differs;
* each rank keeps its own keys: its checkpoint is a file of its own (:func:`rank_checkpoint_path`),
  and no rank's sampler or noise state is ever sent to another rank.

The ranks are trusted: each sees its own unnoised clipped sum (secure aggregation is out of scope).

One rule is about the device, not the ranks: on CUDA a private step runs in exact float32
(:func:`exact_float32`), as it does on the CPU.

>>> shard_bounds(10, 0, 3), shard_bounds(10, 2, 3)
((0, 3), (6, 10))
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from featuredp._io import atomic_save_torch, load_torch_safely
from featuredp.errors import DataValidationError

__all__ = [
    "DistContext",
    "agree_across_ranks",
    "all_reduce_mean",
    "all_reduce_sum",
    "context",
    "exact_float32",
    "load_rank_checkpoint",
    "model_device",
    "on_main_rank",
    "rank_checkpoint_path",
    "save_rank_checkpoint",
    "shard_bounds",
    "whole_size",
]

# A rank that died must not leave the others waiting forever.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)


@contextlib.contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """On CUDA: float32 matrix products and convolutions without TF32, and deterministic cuDNN algorithms, for
    the duration (restored after). A no-op elsewhere.

    By default cuDNN convolutions round their inputs to TF32 (10-bit mantissa) and may pick kernels that sum in a
    different order on each call, so two backward passes of the same example differ by ~1e-3 of the gradient.
    Ghost clipping measures each example's norm in one pass and sums the clipped gradients in another: with
    TF32 a contribution could exceed C by that much, and the every-step separability check (which recomputes
    examples alone and compares) cannot tell rounding from mixing. ``precision="bf16"`` is the fast mode.
    """
    if device.type != "cuda":
        yield
        return
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark)
    matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = False, False, True, False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = saved


@dataclass(frozen=True)
class DistContext:
    """This process's place in a data-parallel run."""

    rank: int
    world_size: int
    backend: str

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that adds the noise, prints, and writes files."""
        return self.rank == 0


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """The contiguous index range ``[start, stop)`` of rank ``rank``'s shard of ``n`` records."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return rank * n // world_size, (rank + 1) * n // world_size


def context(device: torch.device, *, mode: str = "auto") -> DistContext | None:
    """The distributed context of this process, initialising the process group if the launcher asked for one.

    ``mode="auto"``: distributed when the user already initialised ``torch.distributed`` or when a
    launcher (``torchrun``) set ``WORLD_SIZE`` > 1; ``"off"``: never. The backend is NCCL on CUDA
    and gloo otherwise.
    """
    if mode == "off" or not dist.is_available():
        return None
    if mode != "auto":
        raise ValueError(f"distributed must be 'auto' or 'off', got {mode!r}")
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend=backend, timeout=DEFAULT_TIMEOUT)
        atexit.register(_destroy_at_exit)
    world = dist.get_world_size()
    if world <= 1:
        return None
    return DistContext(rank=dist.get_rank(), world_size=world, backend=str(dist.get_backend()))


def _destroy_at_exit() -> None:
    # A process that exits with a live gloo group can die with SIGABRT ("terminate called without an active
    # exception"): gloo's worker threads still hold work that references Python objects while the
    # interpreter is being torn down (pytorch/pytorch#179291). Destroying the group we created while the
    # interpreter is alive avoids it; a group the user destroyed already is left alone.
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    # One collective for all parameters: per-tensor all-reduces cost a round trip each.
    return torch.cat([t.reshape(-1) for t in tensors.values()]) if tensors else torch.zeros(0)


def _unflat(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for k, t in like.items():
        out[k] = flat[start : start + t.numel()].view(t.shape)
        start += t.numel()
    return out


def all_reduce_sum(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The element-wise sum of ``tensors`` over all ranks (new tensors; every rank gets the same)."""
    flat = _flat(tensors)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return _unflat(flat, tensors)


def all_reduce_mean(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The element-wise mean of ``tensors`` over all ranks."""
    total = all_reduce_sum(tensors)
    world = dist.get_world_size()
    return {k: v.div_(world) for k, v in total.items()}


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (the ranks must start from the same model)."""
    with torch.no_grad():
        for t in (*module.parameters(), *module.buffers()):
            dist.broadcast(t.data, src=0)


def rank_checkpoint_path(path: str | os.PathLike[str], rank: int) -> Path:
    """The checkpoint file of rank ``rank``: ``path`` itself for rank 0, ``<stem>.rank<r><suffix>`` beside it for
    the others. Each rank writes and reads only its own (its streams' states and keys stay on that rank).

    >>> rank_checkpoint_path("run/checkpoint.pt", 0).name, rank_checkpoint_path("run/checkpoint.pt", 3).name
    ('checkpoint.pt', 'checkpoint.rank3.pt')
    """
    p = Path(path)
    return p if rank == 0 else p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


def agree_across_ranks(settings: dict[str, Any]) -> None:
    """Refuse, on every rank, a data-parallel run whose ranks hold different ``settings`` (ARCHITECTURE rule 15).

    Every rank passes the same keys (plan fields, step settings, the data's size); the values are
    all-gathered and compared. A rank that reports ε for one sampling rate while another samples at a
    higher one, or clips at another C, would make the reported guarantee false: every rank raises the
    same one-line ``ValueError`` naming the first fields that differ and each rank's value, so none is
    left waiting in a later collective.
    """
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {k: repr(v) for k, v in settings.items()})
    keys = sorted(set().union(*(g.keys() for g in gathered)))
    differ = [k for k in keys if len({g.get(k, "<missing>") for g in gathered}) > 1]
    if differ:
        shown = "; ".join(
            f"{k}: " + ", ".join(f"rank {r} {g.get(k, '<missing>')}" for r, g in enumerate(gathered))
            for k in differ[:3]
        )
        more = f" (and {len(differ) - 3} more fields)" if len(differ) > 3 else ""
        raise ValueError(
            f"the {world} processes of this data-parallel run do not run the same plan: {shown}{more}; every rank "
            "must hold the same data (or its shard) and the same settings, or the reported epsilon is false"
        )


def whole_size(ctx: DistContext | None, declared: int, local: int, device: torch.device) -> int:
    """``declared``, the size of the whole dataset, checked against the sum of the ranks' ``local`` shard sizes;
    every rank learns both sums, so every rank refuses together (no rank left waiting in a collective)."""
    total, empty = local, int(local == 0)
    if ctx is not None:
        count = torch.tensor([local, empty], dtype=torch.float64, device=device)
        dist.all_reduce(count)
        total, empty = int(count[0].item()), int(count[1].item())
    if empty:
        raise DataValidationError(f"{empty} rank(s) got an empty shard: give every rank at least one record")
    if total != declared:
        raise DataValidationError(
            f"dataset_size={declared} was declared but the ranks' shards hold {total} records in all"
        )
    return declared


def on_main_rank(ctx: DistContext | None, action: Callable[[], Any]) -> Any:
    """``action()`` on rank 0 alone (a ledger reservation); every rank learns whether it raised, and raises too."""
    if ctx is None:
        return action()
    result, refusal = None, None
    if ctx.is_main:
        try:
            result = action()
        except Exception as exc:  # told to the other ranks, so that none waits in a collective
            refusal = exc
    told: list[Any] = [None if refusal is None else f"{type(refusal).__name__}: {refusal}"]
    dist.broadcast_object_list(told, src=0)
    if refusal is not None:
        raise refusal
    if told[0] is not None:
        raise ValueError(f"rank 0 refused the run: {told[0]}")
    return result


def save_rank_checkpoint(ctx: DistContext | None, path: str | os.PathLike[str], state: dict[str, Any], *,
                         barrier: bool = True) -> None:  # fmt: skip
    """Write ``state`` owner-readable only (0600): one process's file, or in a data-parallel run each rank its own
    (:func:`rank_checkpoint_path`). No rank ever receives another rank's sampler or noise state (ARCHITECTURE
    rule 13). ``barrier=False``: no rank waits for the others (the own loop, where a user may save on one rank
    only: that rank's file is written, and the others' resume is refused in one line, never a hang)."""
    if ctx is None:
        atomic_save_torch(path, state, private=True)
        return
    mine = rank_checkpoint_path(path, ctx.rank)
    atomic_save_torch(mine, {"world_size": ctx.world_size, "rank": ctx.rank, "state": state}, private=True)
    if barrier:
        dist.barrier()  # every rank's file is complete before any rank goes on


def load_rank_checkpoint(ctx: DistContext | None, path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """This process's checkpoint state (None: none to resume from); a file of another number of processes is
    refused."""
    rank = 0 if ctx is None else ctx.rank
    mine = Path(path) if ctx is None else rank_checkpoint_path(path, rank)
    if not mine.exists():
        if ctx is not None and Path(path).exists():
            mine = Path(path)  # rank 0's file names the world size: the refusal below says what is wrong
        else:
            return None
    ck = load_torch_safely(mine, what="checkpoint")
    world = 1 if ctx is None else ctx.world_size
    saved = int(ck.get("world_size", 1)) if "world_size" in ck else 1
    if saved != world:
        raise ValueError(
            f"the checkpoint was written by a run of {saved} process(es) and this run has {world}: every rank's "
            "private streams continue only on the same number of processes; resume with the same "
            "--nproc-per-node (and nodes) or start a new run"
        )
    if "ranks" in ck:  # written by featuredp <= 0.3, which gathered every rank's state into one file
        return dict(ck["ranks"][rank])
    if "state" in ck and "rank" in ck:  # a rank's file (an own-loop checkpoint holds a "state" of its own)
        if int(ck["rank"]) != rank:
            raise ValueError(f"checkpoint {mine} holds rank {ck['rank']}'s state, not rank {rank}'s: every rank "
                             f"saves its own file (call save_checkpoint on every rank, with the same path)")
        return dict(ck["state"])
    return dict(ck)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a model with neither)."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")

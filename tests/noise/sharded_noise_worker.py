"""One rank of the FSDP2 test in tests/noise/test_sharded_noise.py, launched by ``torchrun`` (gloo, CPU).

``python -m torch.distributed.run --nproc-per-node 2 ... tests/noise/sharded_noise_worker.py OUT_DIR``: an MLP is
wrapped with ``fully_shard`` (the first weight sharded on its columns, evenly as FSDP2 requires off dim 0; the rest
on rows, unevenly; the last layer so small that rank 1's shards are empty), one backward gives sharded gradients,
and each rank noises its own shards with :class:`ShardedNoise`. Rank 0 writes the gathered (``full_tensor``)
results to OUT_DIR/fsdp.pt. Not a test module."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

from featuredp.noise.sharded import ShardedNoise, flat_layout, local_flat_ranges

torch.set_num_threads(1)

KEY = bytes(range(32))  # the test's key: the test redraws with it in one process
STD = 0.7


def build_model() -> nn.Sequential:
    """The unsharded model (the test builds the same one)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 17), nn.ReLU(), nn.Linear(17, 5), nn.ReLU(), nn.Linear(5, 1))


def batch() -> torch.Tensor:
    """The inputs of the one backward (the test uses the same)."""
    return torch.randn(6, 32, generator=torch.Generator().manual_seed(1))


def _full(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.full_tensor() for n, t in tensors.items()}  # type: ignore[attr-defined]


def _one_process(state: dict, grads: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """What one process with ``state``'s key adds at ``step`` to the whole gradients (rank 0 only)."""
    src = ShardedNoise(bytes(32))
    src.load_state_dict({**state, "step": step})
    return src.add(grads, STD)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = build_model()
    w0 = model[0].weight
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh, shard_placement_fn=lambda p: Shard(1) if p is w0 else None)
    fully_shard(model, mesh=mesh)
    model(batch()).sum().backward()
    params = {n: p for n, p in model.named_parameters()}
    grads = {n: p.grad for n, p in params.items()}
    layout = flat_layout(params)  # from the DTensors' full shapes: the same on every rank

    noise = ShardedNoise(KEY, group=dist.group.WORLD)  # a given key: the ranks check that they agree
    noised_grads = noise.add(grads, STD, layout=layout)  # step 0
    noised_params = noise.add({n: p.detach() for n, p in params.items()}, STD, layout=layout)  # step 1
    local_numel: list[int | None] = [None] * world
    dist.all_gather_object(local_numel, sum(g.to_local().numel() for g in grads.values()))
    all_ranges: list[dict | None] = [None] * world
    dist.all_gather_object(all_ranges, {n: local_flat_ranges(g) for n, g in grads.items()})

    # A key drawn by the source itself: with the group, rank 0's key on every rank (also after a re-key); without
    # it, each rank's own (the union is then no one process's draw).
    agreed, alone = ShardedNoise(group=dist.group.WORLD), ShardedNoise()
    agreed_out, alone_out = _full(agreed.add(grads, STD)), _full(alone.add(grads, STD))
    before_rekey = agreed.state_dict()
    agreed.rekey()
    rekeyed_out = _full(agreed.add(grads, STD))
    try:
        ShardedNoise(bytes([rank]) * 32, group=dist.group.WORLD)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    refusals: list[str | None] = [None] * world
    dist.all_gather_object(refusals, refused)

    full_grads, full_params = _full(grads), _full({n: p.detach() for n, p in params.items()})
    results = {
        "placements": {n: str(p.placements) for n, p in params.items()},
        "dtensors": all(isinstance(v, DTensor) for v in [*noised_grads.values(), *noised_params.values()]),
        "local_numel": local_numel,
        "ranges": all_ranges,
        "grads": full_grads,
        "params": full_params,
        "noised_grads": _full(noised_grads),
        "noised_params": _full(noised_params),
        "refusals": refusals,
    }
    if rank == 0:
        results["agreed"] = _same(agreed_out, _one_process(before_rekey, full_grads, 0))
        results["rekeyed"] = _same(rekeyed_out, _one_process(agreed.state_dict(), full_grads, 1))
        results["alone"] = _same(alone_out, _one_process(alone.state_dict(), full_grads, 0))
        torch.save(results, out / "fsdp.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

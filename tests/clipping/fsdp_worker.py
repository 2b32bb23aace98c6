"""One rank of tests/clipping/test_fsdp.py, launched by ``torchrun`` (gloo, CPU, 2 ranks). Not a test module.

``python -m torch.distributed.run --nproc-per-node 2 ... fsdp_worker.py OUT_DIR``: for an MLP, a GroupNorm CNN and
a causal transformer with tied embeddings, each sharded with :func:`featuredp.sharding.shard_model`, three DP-SGD
steps (ghost clipping with the chunk check on every step, :class:`ShardedNoise` with a fixed key, SGD) on fixed
global batches split unevenly over the ranks (rank 1 holds no record on the last step). Then the cases that must
refuse on *every* rank (a model that mixes examples, a parameter without a ghost rule), each within the test's
timeout. Rank 0 writes the gathered parameters and what each rank saw to OUT_DIR/fsdp.pt.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from featuredp.clipping import GhostGradients, trainable_parameters
from featuredp.models.cnn import SmallCNN
from featuredp.models.transformer import CausalTransformer
from featuredp.noise.sharded import ShardedNoise, flat_layout
from featuredp.sharding import shard_model

torch.set_num_threads(1)

KEY = bytes(range(32))
C, SIGMA, LR = 0.5, 0.8, 0.3
# Each step's global batch: rows [0, cut) on rank 0 and [cut, n) on rank 1 (the test's one process takes all n).
STEPS = [(9, 6), (5, 1), (4, 4)]


def build(kind: str) -> nn.Module:
    """The unsharded model (the test builds the same)."""
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    if kind == "cnn":
        return SmallCNN(in_channels=1, image_size=8, num_classes=3, widths=(4, 8), groups=2)
    return CausalTransformer(vocab_size=11, max_len=6, d_model=8, n_layers=1, n_heads=2)


def data(kind: str, step: int, n: int) -> dict[str, torch.Tensor]:
    """Step ``step``'s global batch of ``n`` records."""
    g = torch.Generator().manual_seed(100 + step)
    if kind == "mlp":
        return {"x": torch.randn(n, 6, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}
    if kind == "cnn":
        return {"x": torch.randn(n, 1, 8, 8, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}
    return {"x": torch.randint(0, 11, (n, 5), generator=g)}


def loss(kind: str):
    """The per-example loss of ``kind``'s model."""
    if kind == "lm":

        def lm(m: nn.Module, b: dict, d: dict) -> torch.Tensor:
            logits = m(b["x"][:, :-1])
            return nn.functional.cross_entropy(logits.transpose(1, 2), b["x"][:, 1:], reduction="none").mean(1)

        return lm

    def xent(m: nn.Module, b: dict, d: dict) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    return xent


def train(model: nn.Module, kind: str, rows: list[slice], strategy: GhostGradients) -> list[torch.Tensor]:
    """Three private steps on ``rows`` of each step's batch; the local norms of each step."""
    noise = ShardedNoise(KEY)
    params = trainable_parameters(model)
    layout = flat_layout(params)  # the parameters' order and full shapes: the same in one process and on each rank
    norms = []
    for step, ((n, _), sl) in enumerate(zip(STEPS, rows)):
        batch = {k: v[sl] for k, v in data(kind, step, n).items()}
        sums, got = strategy.clipped_sum(model, loss(kind), batch, {}, C)
        noisy = noise.add(sums, SIGMA * C, layout=layout)
        with torch.no_grad():
            for name, p in params.items():
                p.add_(noisy[name], alpha=-LR / 6.0)
        norms.append(got)
    return norms


class Mixing(nn.Module):
    """Centres each batch over its examples: one record moves every other's gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h - h.mean(0, keepdim=True))


class Unruled(nn.Module):
    """A parameter outside any layer with a ghost rule."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) * self.scale


def refusal(model: nn.Module, rows: slice) -> str:
    """The error a sharded clipped sum of ``model`` raises on this rank (empty if none)."""
    shard_model(model)
    batch = {k: v[rows] for k, v in data("mlp", 0, 9).items()}
    try:
        GhostGradients().clipped_sum(model, loss("mlp"), batch, {}, C)
    except (ValueError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def rows_of(rank: int, world: int) -> list[slice]:
    """This rank's rows of each step's batch: the cuts of :data:`STEPS` on 2 ranks, even parts on more."""
    if world == 2:
        return [slice(0, cut) if rank == 0 else slice(cut, n) for n, cut in STEPS]
    return [slice(rank * n // world, (rank + 1) * n // world) for n, _ in STEPS]


def main(out: Path) -> None:
    """2 ranks: FSDP, every model, and the refusals. 4 ranks: HSDP (a 2 × 2 mesh: two replicas of a 2-way
    sharding, each rank its own records), the MLP and the tied transformer."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = None
    if world == 4:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    results: dict = {}
    for kind in ("mlp", "cnn", "lm") if world == 2 else ("mlp", "lm"):
        model = shard_model(build(kind), mesh=mesh)
        strategy = GhostGradients(physical_batch_size=2)  # chunks of 2: the ranks' chunk counts differ
        strategy._chunk_check_rate = 1.0  # every step: its passes must line up too
        norms = train(model, kind, rows_of(rank, world), strategy)
        full = {n: p.full_tensor() for n, p in model.named_parameters()}  # type: ignore[attr-defined]
        gathered: list = [None] * world
        dist.all_gather_object(gathered, [v.tolist() for v in norms])
        results[kind] = {"params": full, "norms": gathered,
                         "placements": {n: str(p.placements) for n, p in model.named_parameters()}}  # fmt: skip
        if world == 4:  # a DCP checkpoint of the 2 × 2 mesh read back into a fresh HSDP model
            from featuredp.sharded_checkpoint import _save_shards, load_shards

            saved = _save_shards(out / f"hsdp-{kind}.pt", model, {}, step=3, weights=True)
            fresh = shard_model(build(kind), mesh=mesh)
            load_shards(out / f"hsdp-{kind}.pt", saved, fresh, {})
            results[kind]["reloaded"] = {n: p.full_tensor() for n, p in fresh.named_parameters()}  # type: ignore[attr-defined]
    if world == 2:
        refusals = {"mixing": refusal(Mixing(), slice(0, 6) if rank == 0 else slice(6, 9)),
                    "unruled": refusal(Unruled(), slice(0, 6) if rank == 0 else slice(6, 9))}  # fmt: skip
        everyone: list = [None] * world
        dist.all_gather_object(everyone, refusals)
        results["refusals"] = everyone
    if rank == 0:
        torch.save(results, out / f"fsdp{world}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

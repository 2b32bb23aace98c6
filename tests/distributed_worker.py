"""One rank of a data-parallel test run, launched by ``torchrun`` from tests/test_distributed.py.

``python -m torch.distributed.run --nproc-per-node 2 ... tests/distributed_worker.py SCENARIO OUT_DIR``
writes what the test checks into OUT_DIR (rank 0, or one file per rank). Not a test module itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _fdp_synth

import featuredp.distributed as fdist
from _fdp_synth import ZeroSplit, make_tabular
from featuredp.engine import Trainer
from featuredp.features import Columns, LabelPrivate
from featuredp.models import LogisticRegression
from featuredp.sampling import BMinSepSampler, PoissonSampler

torch.set_num_threads(1)


def _model(seed: int = 0) -> LogisticRegression:
    torch.manual_seed(seed)
    return LogisticRegression(7, 2)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _record_batches(sampler: type = PoissonSampler) -> list[np.ndarray]:
    seen: list[np.ndarray] = []
    real = sampler.sample

    def spy(self: object) -> np.ndarray:
        idx = real(self)
        seen.append(idx.copy())
        return idx

    sampler.sample = spy  # type: ignore[method-assign]
    return seen


def main(scenario: str, out: Path) -> None:  # noqa: C901  (one branch per scenario)
    rank = int(os.environ["RANK"])
    data = make_tabular(200, seed=3)
    if scenario == "sum":
        # σ = 0, lr = 1, no momentum: the update is −(Σ over the union of the ranks' batches of clip_C ∇ℓ)/m.
        seen = _record_batches()
        model = _model()
        before = _flat(model)
        Trainer(model, "dpsgd", steps=1, batch_size=40, noise_multiplier=0.0, max_grad_norm=0.5, lr=1.0,
                momentum=0.0, strategy="vmap", progress=False).fit(data)  # fmt: skip
        union: list[np.ndarray | None] = [None, None]
        torch.distributed.all_gather_object(union, seen[0])
        if rank == 0:
            torch.save({"before": before, "after": _flat(model), "indices": np.concatenate(union).tolist()},
                       out / "sum.pt")  # fmt: skip
    elif scenario.startswith("noise"):
        if scenario == "noise-every-rank":  # a broken variant: every rank adds σC itself
            fdist.DistContext.is_main = property(lambda self: True)  # type: ignore[assignment]
        gen = torch.Generator().manual_seed(0)
        batch = {"x": torch.randn(100, 300, generator=gen), "y": torch.randint(0, 2, (100,), generator=gen)}
        torch.manual_seed(0)
        model = LogisticRegression(300, 5)
        before = _flat(model)
        Trainer(model, "dpsgd", loss_split=ZeroSplit(LabelPrivate()), steps=1, batch_size=10, noise_multiplier=2.0,
                max_grad_norm=0.5, lr=1.0, momentum=0.0, strategy="vmap", progress=False).fit(batch)  # fmt: skip
        if rank == 0:
            torch.save({"noise": (before - _flat(model)).double()}, out / f"{scenario}.pt")
    elif scenario == "bandmf":
        # The correlated-noise scenarios are seeded (seed=7, per-rank streams) so that their statistical checks give
        # one answer: unseeded, each p > 1e-3 check would fail one CI run in a thousand.
        # Cyclic Poisson over the ranks' shards, and the correlated noise added once: the batches of a 200-step
        # run, then the first update of a run whose gradients are all zero (w_1 = z_1: std σC/m on every rank).
        seen = _record_batches(BMinSepSampler)
        Trainer(_model(), "dpsgd", steps=200, batch_size=25, noise_multiplier=4.0, delta=1e-4, noise="bandmf", seed=7,
                bands=4, strategy="vmap", progress=False).fit(data)  # fmt: skip
        torch.save([s.tolist() for s in seen], out / f"bandmf{rank}.pt")
        gen = torch.Generator().manual_seed(0)
        batch = {"x": torch.randn(100, 300, generator=gen), "y": torch.randint(0, 2, (100,), generator=gen)}
        torch.manual_seed(0)
        model = LogisticRegression(300, 5)
        before = _flat(model)
        Trainer(model, "dpsgd", loss_split=ZeroSplit(LabelPrivate()), steps=4, batch_size=10, noise_multiplier=2.0,
                max_grad_norm=0.5, delta=1e-4, lr=1.0, momentum=0.0, strategy="vmap", noise="bandmf", bands=2, seed=7,
                progress=False).fit(batch, max_steps=1)  # fmt: skip
        flats: list[torch.Tensor | None] = [None, None]
        torch.distributed.all_gather_object(flats, _flat(model))
        if rank == 0:
            torch.save({"noise": (before - _flat(model)).double(), "same": bool(torch.equal(flats[0], flats[1]))},
                       out / "bandmf-noise.pt")  # fmt: skip
    elif scenario == "blt":
        # BLT over the ranks' shards: epochs of ⌊200/25⌋ = 8 partitions taken whole; then two updates of a run whose
        # gradients are all zero: w_1 = z_1 and w_2 = z_2 − c_1·w_1, the buffers kept once (on rank 0).
        seen = _record_batches(BMinSepSampler)
        Trainer(_model(), "dpsgd", steps=24, batch_size=25, noise_multiplier=4.0, delta=1e-4, noise="blt", seed=7,
                strategy="vmap", progress=False).fit(data)  # fmt: skip
        torch.save([s.tolist() for s in seen], out / f"blt{rank}.pt")
        gen = torch.Generator().manual_seed(0)
        batch = {"x": torch.randn(100, 300, generator=gen), "y": torch.randint(0, 2, (100,), generator=gen)}
        torch.manual_seed(0)
        model = LogisticRegression(300, 5)
        snaps = [_flat(model)]
        trainer = Trainer(model, "dpsgd", loss_split=ZeroSplit(LabelPrivate()), steps=20, batch_size=10,
                          noise_multiplier=2.0, max_grad_norm=0.5, delta=1e-4, lr=1.0, momentum=0.0, strategy="vmap",
                          noise="blt", seed=7, progress=False)  # fmt: skip
        trainer.fit(batch, max_steps=1)
        snaps.append(_flat(model))
        trainer.fit(batch, max_steps=1)
        snaps.append(_flat(model))
        flats: list[torch.Tensor | None] = [None, None]
        torch.distributed.all_gather_object(flats, _flat(model))
        if rank == 0:
            assert trainer.plan is not None and trainer.plan.noise_coeffs is not None
            torch.save({"updates": [(snaps[i] - snaps[i + 1]).double() for i in range(2)],
                        "params": list(trainer.plan.noise_coeffs), "same": bool(torch.equal(flats[0], flats[1]))},
                       out / "blt-noise.pt")  # fmt: skip
    elif scenario == "inclusion":
        seen = _record_batches()
        Trainer(_model(), "dpsgd", steps=300, batch_size=50, noise_multiplier=1.0, strategy="vmap",
                progress=False).fit(data)  # fmt: skip
        torch.save([s.tolist() for s in seen], out / f"inclusion{rank}.pt")
    elif scenario == "empty":
        seen = _record_batches()
        res = Trainer(_model(), "fdp", feature_map=Columns(["sex"]), steps=30, batch_size=1, noise_multiplier=1.0,
                      delta=1e-4, progress=False).fit(data)  # fmt: skip
        empties = sum(len(s) == 0 for s in seen)
        totals: list[int | None] = [None, None]
        torch.distributed.all_gather_object(totals, empties)
        if rank == 0:
            (out / "empty.json").write_text(json.dumps({"steps": res.steps, "empty": totals}))
    elif scenario == "epsilon":
        res = Trainer(_model(), "fdp", feature_map=Columns(["sex", "race"]), steps=17, batch_size=20,
                      noise_multiplier=1.3, delta=1e-4, progress=False).fit(data)  # fmt: skip
        if rank == 0:
            (out / "epsilon.json").write_text(json.dumps({"epsilon": res.epsilon, "steps": res.steps}))
    elif scenario in ("whole", "crash", "resume"):
        trainer = Trainer(_model(), "fdp", feature_map=Columns(["sex", "race"]), steps=12, batch_size=20,
                          noise_multiplier=1.0, delta=1e-4, seed=11, public_seed=2, progress=False)  # fmt: skip
        ck = out / "ck.pt"
        if scenario == "crash":  # killed right after the checkpoint of step 5
            from featuredp.run import PrivateRun

            real = PrivateRun.save_checkpoint

            def save_then_die(self: PrivateRun, path: Path, state: object) -> None:
                real(self, path, state)  # type: ignore[arg-type]
                os._exit(17)

            PrivateRun.save_checkpoint = save_then_die  # type: ignore[method-assign]
            trainer.fit(data, checkpoint=ck, checkpoint_every=5)
        else:
            if scenario == "resume":  # every state restored exactly: the re-key of a resume is off here
                from featuredp.run_state import RunState

                RunState.rekey_private = lambda self: None  # type: ignore[method-assign]
            trainer.fit(data, checkpoint=ck if scenario == "resume" else None, resume=scenario == "resume")
            if rank == 0:
                torch.save(_flat(trainer.model), out / f"{scenario}.pt")
    elif scenario == "shards":
        # The same seeded DP-SGD run twice: every rank holding the whole data, then only its row range.
        whole = {"x": torch.as_tensor(data.X), "y": torch.as_tensor(data.y)}
        start, stop = fdist.shard_bounds(200, rank, 2)
        shard = {k: v[start:stop] for k, v in whole.items()}
        models = {}
        for name, d, sharded in (("whole", whole, False), ("sharded", shard, True)):
            models[name] = _model()
            Trainer(models[name], "dpsgd", steps=6, batch_size=40, noise_multiplier=1.0, max_grad_norm=0.5, delta=1e-4,
                    dataset_size=200, seed=5, progress=False).fit(d, sharded=sharded)  # fmt: skip
        refused = ""
        try:
            Trainer(_model(), "dpsgd", steps=1, batch_size=40, noise_multiplier=1.0, delta=1e-4, dataset_size=199,
                    progress=False).fit(shard, sharded=True)  # fmt: skip
        except ValueError as exc:
            refused = str(exc)
        if rank == 0:
            torch.save({"whole": _flat(models["whole"]), "sharded": _flat(models["sharded"]), "refused": refused},
                       out / "shards.pt")  # fmt: skip
    elif scenario in ("disagree-n", "disagree-c"):
        # An attacker's rank: a shorter copy of the data (it would sample at a higher rate than rank 0 accounts
        # for), or another clipping norm (sensitivity no longer C). Every rank must refuse before any step.
        d = make_tabular(160, seed=3) if scenario == "disagree-n" and rank == 1 else data
        c = 5.0 if scenario == "disagree-c" and rank == 1 else 0.5
        model = _model()
        before = _flat(model)
        try:
            Trainer(model, "dpsgd", steps=3, batch_size=20, noise_multiplier=1.0, max_grad_norm=c, delta=1e-4,
                    progress=False).fit(d)  # fmt: skip
            refused = ""
        except ValueError as exc:
            refused = str(exc)
        (out / f"{scenario}{rank}.json").write_text(
            json.dumps({"refused": refused, "unchanged": bool(torch.equal(before, _flat(model)))}))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    torch.distributed.barrier()  # every rank leaves together
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

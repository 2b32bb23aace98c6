"""One rank of tests/test_fsdp_run.py: ``Trainer(..., sharding="fsdp")`` under ``torchrun`` (2 gloo ranks, CPU).

``python -m torch.distributed.run --nproc-per-node 2 ... tests/fsdp_run_worker.py SCENARIOS OUT_DIR`` (``all``, or
names of :data:`SCENARIOS` joined by commas: one launch for all, since each costs seconds); rank 0 writes what the
test checks to OUT_DIR/SCENARIO.pt. Not a test module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _fdp_synth

from _fdp_synth import ZeroSplit, make_tabular
from distributed_worker import _record_batches as record_batches
from featuredp.clipping.fsdp import is_sharded
from featuredp.engine import Trainer
from featuredp.features import Columns, LabelPrivate

torch.set_num_threads(1)


def mlp() -> nn.Sequential:
    """The model of every scenario (the test builds the same)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 2))


def full(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (a collective on a sharded model)."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
    return out


def _sum(scenario: str, data: Any, out: Path) -> dict:
    # σ = 0, lr = 1: the update is −(Σ over the union of the ranks' batches of clip_C ∇ℓ)/m.
    seen = record_batches()  # distributed_worker's spy on the private draws
    model = mlp()
    before = full(model)
    Trainer(model, "dpsgd", steps=1, batch_size=40, noise_multiplier=0.0, max_grad_norm=0.5, lr=1.0,
            momentum=0.0, sharding="fsdp", progress=False).fit(data)  # fmt: skip
    union: list = [None, None]
    torch.distributed.all_gather_object(union, seen[0])
    result = {
        "before": before,
        "after": full(model),
        "indices": np.concatenate(union).tolist(),
        "sharded": is_sharded(model),
        "local": [tuple(p.to_local().shape) for p in model.parameters()],
    }
    return result


def _noise(scenario: str, data: Any, out: Path) -> dict:
    # Gradients all zero: the update is the noise, which must be one process's draw under the run's one key.
    batch = {"x": torch.randn(60, 7, generator=torch.Generator().manual_seed(0)),
             "y": torch.randint(0, 2, (60,), generator=torch.Generator().manual_seed(1))}  # fmt: skip
    model = mlp()
    before = full(model)
    trainer = Trainer(model, "dpsgd", loss_split=ZeroSplit(LabelPrivate()), steps=1, batch_size=10,
                      noise_multiplier=2.0, max_grad_norm=0.5, lr=1.0, momentum=0.0, delta=1e-5,
                      sharding="fsdp", progress=False)  # fmt: skip
    res = trainer.fit(batch)
    keys: list = [None, None]  # each rank's key: one for all (ShardedNoise agrees on it over the group)
    torch.distributed.all_gather_object(keys, bytes(trainer.run.state.noise.state_dict()["sharded_key"].tolist()))
    result = {"before": before, "after": full(model), "keys": keys, "epsilon": res.epsilon}
    return result


def _fdp(scenario: str, data: Any, out: Path) -> dict:
    # Algorithm 1 (its public term through FSDP too) and FDP (DP-SGD), σ = 0: the same run as data-parallel.
    models = {}
    for sharding in ("none", "fsdp"):
        models[sharding] = mlp()
        Trainer(models[sharding], scenario, feature_map=Columns(["sex", "race"]), steps=3, batch_size=20,
                noise_multiplier=0.0, max_grad_norm=0.5, lr=0.5, delta=1e-4, seed=11, public_seed=2,
                strategy="ghost", sharding=sharding, progress=False).fit(data)  # fmt: skip
    result = {"ddp": full(models["none"]), "fsdp": full(models["fsdp"])}
    return result


def _fdp_models(scenario: str, data: Any, out: Path) -> dict:
    # DP-SGD, Algorithm 1 and FDP (DP-SGD) in the Trainer on a GroupNorm CNN (Ψ = pixelated image) and on a causal
    # transformer with a tied embedding (Ψ = the text with its spans redacted), σ = 0: as the data-parallel run.
    from featuredp.experiments.text_data import load_text_data, text_model_spec
    from featuredp.features import Pixelate
    from featuredp.features.tokens import TokenView
    from featuredp.losses import CausalLMSplit
    from featuredp.models import build_model
    from featuredp.models.cnn import SmallCNN
    from featuredp.testing import replay_step

    g = torch.Generator().manual_seed(5)
    images = {"x": torch.randn(120, 1, 8, 8, generator=g), "y": torch.randint(0, 3, (120,), generator=g)}
    texts = load_text_data(n_train=48, n_test=10, max_len=96, canary_repeats=())
    spec = text_model_spec(texts, {"kind": "causal_transformer", "d_model": 16, "n_layers": 1, "n_heads": 2})
    cases = {
        "cnn": (lambda: _seeded(lambda: SmallCNN(in_channels=1, image_size=8, num_classes=3, widths=(4, 8), groups=2)),
                images, {"feature_map": Pixelate(2)}),
        "lm": (lambda: build_model(spec, seed=0), texts.train.batch(),
               {"loss_split": CausalLMSplit(TokenView(texts.psi))}),
    }  # fmt: skip
    result: dict = {}
    for kind, (build, batch, split) in cases.items():
        for method in ("dpsgd", "fdp", "fdp_dpsgd"):
            models = {}
            for sharding in ("none", "fsdp"):
                models[sharding] = build()
                Trainer(models[sharding], method, steps=3, batch_size=16, noise_multiplier=0.0, max_grad_norm=0.5,
                        lr=0.5, delta=1e-4, seed=11, public_seed=2, strategy="ghost", sharding=sharding,
                        progress=False, **split).fit(batch)  # fmt: skip
            result[f"{kind}-{method}"] = {"ddp": full(models["none"]), "fsdp": full(models["fsdp"]),
                                          "start": full(build())}  # fmt: skip
            trainer = Trainer(build(), method, steps=3, batch_size=16, noise_multiplier=1.0, max_grad_norm=0.5,
                              delta=1e-4, strategy="ghost", sharding="fsdp", progress=False, **split)  # fmt: skip
            report = replay_step(trainer, batch, record=3, batch=[0, 1, 2, 20, 31, 40])
            result[f"{kind}-{method}"]["replay"] = (report.outcome, report.refusal,
                                                    [(c.name, c.ok) for c in report.checks])  # fmt: skip
    return result


def _seeded(build: Any) -> nn.Module:
    torch.manual_seed(0)
    return build()


def _momenta(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every momentum buffer of ``optimizer``, whole (a collective on a sharded model)."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                out.append((buf.full_tensor() if hasattr(buf, "full_tensor") else buf).detach().clone())
    return out


def _resume(scenario: str, data: Any, out: Path) -> dict:
    # Killed after step 2's checkpoint (DCP folder beside the rank files), resumed to step 4: the weights and
    # momenta of step 2, ε of 4 steps, the noise key fresh after the resume; then a swapped DCP metadata file.
    from featuredp.run import PrivateRun

    ck = out / "ck.pt"
    kw = dict(feature_map=Columns(["sex", "race"]), steps=4, batch_size=20, noise_multiplier=1.0, delta=1e-4,
              strategy="ghost", sharding="fsdp", progress=False)  # fmt: skip
    first = Trainer(mlp(), "fdp", **kw)
    first.fit(data, checkpoint=ck, max_steps=2)
    key_before = first.run.state.noise.state_dict()["sharded_key"].clone()
    saved = {"weights": full(first.model), "momenta": _momenta(first.run.state.optimizer)}
    restored: dict = {}
    real = PrivateRun.resume

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        restored.update(weights=full(self.model), momenta=_momenta(args[2].optimizer))

    PrivateRun.resume = spy  # type: ignore[method-assign]
    second = Trainer(mlp(), "fdp", **kw)
    try:
        res = second.fit(data, checkpoint=ck, resume=True)
    finally:
        PrivateRun.resume = real  # type: ignore[method-assign]
    whole = Trainer(mlp(), "fdp", **kw).fit(data)
    folder = out / "ck.pt.shards"
    result = {"epsilon": res.epsilon, "steps": res.steps, "whole_epsilon": whole.epsilon,
              "rekeyed": not torch.equal(key_before, second.run.state.noise.state_dict()["sharded_key"]),
              "files": sorted(p.name for p in out.iterdir() if p.name.startswith("ck")),
              "saves": sorted(p.name for p in folder.iterdir()), "mode": folder.stat().st_mode & 0o777,
              "rank_file_keys": sorted(torch.load(ck, weights_only=True)["state"]),
              "saved": saved, "restored": restored}  # fmt: skip
    (metadata,) = folder.glob("*/.metadata")
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        metadata.write_bytes(metadata.read_bytes() + b"\0")
    torch.distributed.barrier()
    refusals: list = [None, None]
    try:
        Trainer(mlp(), "fdp", **kw).fit(data, checkpoint=ck, resume=True)
        refusal = ""
    except ValueError as exc:
        refusal = str(exc)
    torch.distributed.all_gather_object(refusals, refusal)
    result["swapped"] = refusals
    return result


def _crash_mid_save(scenario: str, data: Any, out: Path) -> dict:
    # A save cut off after DCP wrote its folder but before the rank files name it: the checkpoint before it resumes
    # whole (its weights, not the cut-off save's), and the next save removes the orphan folder.
    import featuredp.sharded_checkpoint as sharded_checkpoint
    from featuredp.run import PrivateRun

    ck = out / "crash.pt"
    kw = dict(steps=6, batch_size=20, noise_multiplier=1.0, delta=1e-4, strategy="ghost", sharding="fsdp",
              progress=False)  # fmt: skip
    first = Trainer(mlp(), "dpsgd", **kw)
    first.fit(data, checkpoint=ck, max_steps=2)
    saved = full(first.model)
    real_save = sharded_checkpoint.save_rank_checkpoint

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed mid-save")

    sharded_checkpoint.save_rank_checkpoint = killed  # type: ignore[assignment]
    try:
        first.fit(data, checkpoint=ck, max_steps=1)
    except KeyboardInterrupt:
        pass
    finally:
        sharded_checkpoint.save_rank_checkpoint = real_save  # type: ignore[assignment]
    folders_after_crash = len(list((out / "crash.pt.shards").iterdir()))
    restored: dict = {}
    real_resume = PrivateRun.resume

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        real_resume(self, *args, **kwargs)
        restored.update(full(self.model))

    PrivateRun.resume = spy  # type: ignore[method-assign]
    try:
        Trainer(mlp(), "dpsgd", **kw).fit(data, checkpoint=ck, resume=True, max_steps=1)
    finally:
        PrivateRun.resume = real_resume  # type: ignore[method-assign]
    return {"saved": saved, "restored": restored, "folders_after_crash": folders_after_crash,
            "folders_after_next_save": len(list((out / "crash.pt.shards").iterdir()))}  # fmt: skip


def _engine_checkpoint(scenario: str, data: Any, out: Path) -> dict:
    # The own loop's save_checkpoint/load_checkpoint under torchrun: each rank its own file, and a sharded
    # model's weights and every optimizer's moments in a DCP folder; a fresh engine loads them back.
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, TensorDataset

    from featuredp import PrivacyEngine

    dataset = TensorDataset(torch.as_tensor(data.X), torch.as_tensor(data.y))

    def private(mode: str) -> tuple:
        model = mlp()
        if mode == "ghost_fsdp":
            fully_shard(model[0])
            fully_shard(model[2])
            fully_shard(model)
        engine = PrivacyEngine()
        made = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                                   data_loader=DataLoader(dataset, batch_size=20), noise_multiplier=1.0,
                                   max_grad_norm=0.5, grad_sample_mode=mode)  # fmt: skip
        return (engine, *made)

    result: dict = {}
    for mode in ("ghost", "ghost_fsdp"):
        engine, model, optimizer, criterion, loader = private(mode)
        for step, (x, y) in enumerate(loader):
            if step == 2:
                break
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        path = out / f"engine-{mode}.pt"
        engine.save_checkpoint(path=path, module=model, optimizer=optimizer, checkpoint_dict={"epoch": 7})
        saved = {"weights": full(model), "momenta": _momenta(optimizer.original_optimizer),
                 "epsilon": engine.get_epsilon(1e-5)}  # fmt: skip
        engine2, model2, optimizer2, _, _ = private(mode)
        extra = engine2.load_checkpoint(path=path, module=model2, optimizer=optimizer2)
        restored = {"weights": full(model2), "momenta": _momenta(optimizer2.original_optimizer)}
        result[mode] = {
            "saved": saved,
            "extra": extra,
            "epsilon": engine2.get_epsilon(1e-5),
            "restored": restored,
            "files": sorted(p.name for p in out.iterdir() if p.name.startswith(f"engine-{mode}")),
        }
        if mode == "ghost_fsdp":  # saved without the optimizer, loaded with one: the weights, the optimizer as it is
            bare = out / "engine-bare.pt"
            engine.save_checkpoint(path=bare, module=model)
            engine3, model3, optimizer3, _, _ = private(mode)
            engine3.load_checkpoint(path=bare, module=model3, optimizer=optimizer3)
            result["bare"] = {"weights": full(model3), "momenta": _momenta(optimizer3.original_optimizer)}
        else:  # a loop that saves on rank 0 alone: no hang; the other rank's resume refused in one line
            lone = out / "engine-lone.pt"
            if torch.distributed.get_rank() == 0:
                engine.save_checkpoint(path=lone, module=model, optimizer=optimizer)
            torch.distributed.barrier()  # the test's own: rank 0 has written (no barrier inside save_checkpoint)
            engine4, model4, optimizer4, _, _ = private(mode)
            try:
                engine4.load_checkpoint(path=lone, module=model4, optimizer=optimizer4)
                refusal = ""
            except ValueError as exc:
                refusal = str(exc)
            refusals: list = [None, None]
            torch.distributed.all_gather_object(refusals, refusal)
            result["lone"] = refusals
    return result


def _replay(scenario: str, data: Any, out: Path) -> dict:
    # The replay self-test (featuredp.testing.replay_step) on sharded runs: one record moves the release by at
    # most the stated sensitivity, every draw held fixed.
    from featuredp.testing import replay_step

    result = {}
    for method in ("dpsgd", "fdp", "fdp_dpsgd"):
        fmap = None if method == "dpsgd" else Columns(["sex", "race"])
        trainer = Trainer(mlp(), method, feature_map=fmap, steps=3, batch_size=20, noise_multiplier=1.0,
                          max_grad_norm=0.5, delta=1e-4, strategy="ghost", sharding="fsdp", progress=False)  # fmt: skip
        report = replay_step(trainer, data, record=7, batch=[1, 2, 3, 50, 101, 150, 199])
        result[method] = (report.outcome, report.refusal, [(c.name, c.ok) for c in report.checks])
    # A broken variant the replay must catch: each rank's sum counted twice in the total over the ranks.
    import featuredp.clipping.fsdp as fsdp

    real = fsdp.reduce_to_shard
    fsdp.reduce_to_shard = lambda full, like: real(2 * full, like)  # type: ignore[assignment]
    trainer = Trainer(mlp(), "dpsgd", steps=3, batch_size=20, noise_multiplier=1.0, max_grad_norm=0.5,
                      delta=1e-4, sharding="fsdp", progress=False)  # fmt: skip
    report = replay_step(trainer, data, record=7, batch=[1, 2, 3, 50, 101, 150, 199])
    fsdp.reduce_to_shard = real  # type: ignore[assignment]
    result["doubled"] = (report.outcome, report.refusal, [(c.name, c.ok) for c in report.checks])
    return result


def _engine(scenario: str, data: Any, out: Path) -> dict:
    # Opacus's FSDP2 loop as its users write it: the module wrapped with fully_shard first, the optimizer over
    # its (sharded) parameters, grad_sample_mode="ghost_fsdp"; σ = 0 against the data-parallel engine.
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, TensorDataset

    from featuredp import PrivacyEngine

    dataset = TensorDataset(torch.as_tensor(data.X), torch.as_tensor(data.y))
    models = {}
    for mode in ("ghost", "ghost_fsdp"):
        model = mlp()
        if mode == "ghost_fsdp":
            fully_shard(model[0])
            fully_shard(model[2])
            fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        engine = PrivacyEngine(seed=4)
        model, optimizer, criterion, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=DataLoader(dataset, batch_size=20),
            noise_multiplier=0.0, max_grad_norm=0.5, grad_sample_mode=mode)  # fmt: skip
        for step, (x, y) in enumerate(loader):
            if step == 3:
                break
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        models[mode] = model
    result = {"ddp": full(models["ghost"]), "fsdp": full(models["ghost_fsdp"]), "steps": engine.steps}
    return result


def _misuse(scenario: str, data: Any, out: Path) -> dict:
    # The own loop's misuse on a sharded module (ghost_fsdp): a reused batch, a second step on one draw and the
    # original loader are refused on every rank in one line, and the loop goes on after each refusal (FSDP's state
    # is not left mid-step: the next proper steps train and are charged).
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, TensorDataset

    from featuredp import PrivacyEngine

    dataset = TensorDataset(torch.as_tensor(data.X), torch.as_tensor(data.y))
    model = mlp()
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    original = DataLoader(dataset, batch_size=20)
    engine = PrivacyEngine()
    model, optimizer, criterion, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), data_loader=original,
        noise_multiplier=1.0, max_grad_norm=0.5, grad_sample_mode="ghost_fsdp")  # fmt: skip

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()

    def refusal(action: Any) -> str:
        try:
            action()
        except RuntimeError as exc:
            return str(exc)
        return ""

    draws = iter(loader)
    xb, yb = next(draws)
    step(xb, yb)
    mine = {"reused": refusal(lambda: criterion(model(xb), yb).backward()),
            "second_step": refusal(optimizer.step),
            "original": ""}  # fmt: skip
    drawn = next(draws)  # a draw pending: a batch of the original loader is still not it
    mine["original"] = refusal(lambda: step(*next(iter(original))))
    before = full(model)
    step(*drawn)
    step(*next(draws))
    every: list = [None, None]
    torch.distributed.all_gather_object(every, mine)
    moved = any(not torch.equal(before[n], v) for n, v in full(model).items())
    return {"refusals": every, "steps": engine.steps, "moved": moved}


def _refused(scenario: str, data: Any, out: Path) -> dict:
    result = {}
    for name, kw in {"vmap": {"strategy": "vmap"}, "bandmf": {"noise": "bandmf"},
                     "user": {"user_key": "y"}}.items():  # fmt: skip
        try:
            Trainer(mlp(), "dpsgd", steps=2, batch_size=20, noise_multiplier=1.0, delta=1e-4, sharding="fsdp",
                    progress=False, **kw)  # fmt: skip
            result[name] = ""
        except ValueError as exc:
            result[name] = str(exc)
    return result


def _alloc(scenario: str, data: Any, out: Path) -> dict:
    # The largest float64 tensor any op makes while the noise is added in a private step (the noise is drawn in
    # float64): with sharding, a shard of the largest parameter (and whole blocks of the stream), never its full
    # shape; without, the full shape (rank 0 draws all the noise), which shows the measurement sees the noise.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            made = func(*args, **(kwargs or {}))
            for t in made if isinstance(made, tuple | list) else (made,):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                    self.largest = max(self.largest, t.numel())
            return made

    result: dict = {"full": 7 * 2**15}
    for sharding in ("none", "fsdp"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(7, 2**15), nn.Tanh(), nn.Linear(2**15, 2))
        trainer = Trainer(model, "dpsgd", steps=2, batch_size=20, noise_multiplier=1.0, max_grad_norm=0.5,
                          delta=1e-4, strategy="ghost", sharding=sharding, prefetch_noise=False,
                          progress=False)  # fmt: skip
        trainer.fit(data, max_steps=1)  # plans, validates
        noise, mode = trainer.run.state.noise, Largest()
        add = noise.add

        def watched(*args: Any, add: Any = add, mode: Any = mode, **kwargs: Any) -> Any:
            with mode:
                return add(*args, **kwargs)

        noise.add = watched
        trainer.fit(data, max_steps=1)
        del noise.add
        largest: list = [None, None]
        torch.distributed.all_gather_object(largest, mode.largest)
        result[sharding] = largest
    return result


SCENARIOS = {
    "alloc": _alloc,
    "sum": _sum,
    "noise": _noise,
    "fdp": _fdp,
    "fdp_dpsgd": _fdp,
    "fdp_models": _fdp_models,
    "resume": _resume,
    "engine_checkpoint": _engine_checkpoint,
    "crash_mid_save": _crash_mid_save,
    "replay": _replay,
    "engine": _engine,
    "refused": _refused,
    "misuse": _misuse,
}


def main(scenarios: str, out: Path) -> None:
    """Run each of ``scenarios`` (comma-separated names of :data:`SCENARIOS`, or ``all``) in this one launch."""
    rank = int(os.environ["RANK"])
    torch.distributed.init_process_group("gloo")
    for scenario in SCENARIOS if scenarios == "all" else scenarios.split(","):
        result = SCENARIOS[scenario](scenario, make_tabular(200, seed=3), out)
        if rank == 0:
            torch.save(result, out / f"{scenario}.pt")
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

"""Throughput and peak memory of private training steps: featuredp (ghost, vmap) side by side with Opacus.

Usage (Opacus is a benchmark-only dependency; ``--no-deps`` keeps it from replacing torch)::

    pip install --no-deps opacus==1.6.0 opt-einsum
    nice python benchmarks/throughput.py --batch-sizes 256,1024,4096 --rounds 3 --out benchmarks/results/throughput.json

For every batch size, all configurations are timed *interleaved* in rounds in one process (ratios to
non-private SGD within each round, medians over rounds); then each configuration runs once more in a fresh
subprocess to read its peak resident memory (``ru_maxrss``: torch's CPU allocations are invisible to
tracemalloc). Model: MLP 600→300→100 (ReLU) on synthetic Purchase100-shaped data, C = 0.01, σ = 1,
SGD lr 0.1 momentum 0.9, n = 16 × batch (sampling rate 1/16).

Configurations:

* ``nonprivate`` — the engine's non-private SGD step (the reference);
* ``dpsgd-ghost``, ``dpsgd-vmap``, ``fdp-ghost``, ``fdp-vmap`` — the engine's step with featuredp's
  strategies (FDP = ℓ(x) − ℓ(x_padded) with Gaussian padding of the 500 private columns, plus a public
  batch of the same size with its own padding);
* ``dpsgd-nonoise-ghost`` — the DP-SGD step with σ = 0 (what the noise draw costs; not private);
* ``fdp-zero-ghost``, ``fdp-zero-vmap`` — FDP with zero masking of the private columns (featuredp's
  Purchase preset): the public passes multiply only the 100 public columns (ColumnLinear);
* ``opacus-hooks-dpsgd`` — Opacus GradSampleModule + DPOptimizer (per-sample gradients by hooks);
* ``opacus-ghost-dpsgd`` — Opacus GradSampleModuleFastGradientClipping (ghost clipping) +
  DPOptimizerFastGradientClipping + DPLossFastGradientClipping;
* ``opacus-hooks-fdp`` — the FDP step done with Opacus hooks (two forward passes accumulate per-sample
  gradients; the public gradient is added after Opacus's clip-and-noise pre-step);
* ``opacus-ghost-fdp`` is attempted and reported as refused (Opacus ghost clipping raises on a second
  forward pass through the same layers).

Opacus is fed the same vectorised Poisson batches as featuredp (its own DPDataLoader does O(n) work per
batch and would only make it slower).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featuredp._io import atomic_write_json
from featuredp.experiments import throughput
from featuredp.sampling import PoissonSampler, UniformSampler, make_streams

C, SIGMA, LR, MOMENTUM = 0.01, 1.0, 0.1, 0.9
FEATUREDP = ("nonprivate", "dpsgd-ghost", "dpsgd-nonoise-ghost", "dpsgd-vmap", "fdp-ghost", "fdp-zero-ghost",
             "fdp-vmap", "fdp-zero-vmap")
OPACUS = ("opacus-hooks-dpsgd", "opacus-ghost-dpsgd", "opacus-hooks-fdp")
ALL = FEATUREDP + OPACUS


def _mlp(d: int, n_classes: int, seed: int) -> nn.Module:
    """featuredp's MLP (same initial weights) rebuilt from plain nn.Linear layers: Opacus registers its
    per-sample rules by exact layer type and refuses ColumnLinear (a subclass)."""
    from featuredp import engine
    from featuredp.models.mlp import MLP

    torch.manual_seed(engine.init_seed(seed))
    ours = MLP(d, (300,), n_classes)
    plain = nn.Sequential(nn.Linear(d, 300), nn.ReLU(), nn.Linear(300, n_classes))
    plain.load_state_dict({k.removeprefix("net."): v for k, v in ours.state_dict().items()})
    return plain


class _OpacusData:
    """Poisson private batches and uniform public batches gathered from tensors (as featuredp does)."""

    def __init__(self, data: Any, public: list[str], batch: int, seed: int) -> None:
        self.x = torch.as_tensor(data.X)
        self.y = torch.as_tensor(data.y)
        n = self.x.shape[0]
        streams = make_streams(seed)
        self.private = PoissonSampler(n, batch / n, streams.private_sampling)
        self.public = UniformSampler(n, batch, streams.public_sampling)
        self.pad_gen = torch.Generator().manual_seed(seed)
        names = list(data.feature_names)
        self.private_mask = torch.tensor([c not in set(public) for c in names])

    def private_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.private.sample())
        return self.x.index_select(0, idx), self.y.index_select(0, idx)

    def public_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.public.sample())
        return self.x.index_select(0, idx), self.y.index_select(0, idx)

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape, generator=self.pad_gen)
        return torch.where(self.private_mask, noise, x)


def opacus_runner(kind: str, data: Any, public: list[str], batch: int, seed: int = 0) -> throughput.StepRunner:
    """An Opacus configuration (see the module docstring) as a StepRunner."""
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    src = _OpacusData(data, public, batch, seed)
    model = _mlp(data.X.shape[1], len(data.classes), seed)
    sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    ce = nn.CrossEntropyLoss()

    if kind == "opacus-hooks-dpsgd":
        gsm = GradSampleModule(model)
        opt = DPOptimizer(sgd, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=batch)

        def step() -> None:
            x, y = src.private_batch()
            opt.zero_grad(set_to_none=True)
            ce(gsm(x), y).backward()
            opt.step()

    elif kind == "opacus-ghost-dpsgd":
        gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=C, use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(sgd, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=batch)
        crit = DPLossFastGradientClipping(gsm, opt, ce)

        def step() -> None:
            x, y = src.private_batch()
            opt.zero_grad(set_to_none=True)
            crit(gsm(x), y).backward()
            opt.step()

    elif kind in ("opacus-hooks-fdp", "opacus-ghost-fdp"):
        ghost = kind == "opacus-ghost-fdp"
        gsm = (GradSampleModuleFastGradientClipping(model, max_grad_norm=C, use_ghost_clipping=True) if ghost
               else GradSampleModule(model))
        opt_cls = DPOptimizerFastGradientClipping if ghost else DPOptimizer
        opt = opt_cls(sgd, noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=batch)
        per_ex = nn.CrossEntropyLoss(reduction="none")
        params = [p for p in model.parameters() if p.requires_grad]

        def step() -> None:
            x, y = src.private_batch()
            opt.zero_grad(set_to_none=True)
            priv = per_ex(gsm(x), y) - per_ex(gsm(src.padded(x)), y)  # ℓ(x) − ℓ_pub(x_padded), per example
            if ghost:
                DPLossFastGradientClipping(gsm, opt, per_ex)  # the wrapper Opacus requires; refused below
            priv.mean().backward()
            xp, yp = src.public_batch()
            gsm.disable_hooks()
            g_pub = torch.autograd.grad(ce(gsm(src.padded(xp)), yp), params)
            gsm.enable_hooks()
            if opt.pre_step():  # Opacus's clip + noise + scale of the private part into p.grad
                for p, g in zip(params, g_pub):
                    p.grad.add_(g)  # g = g_pub + α·g_priv with α = 1
                opt.original_optimizer.step()

    else:
        raise ValueError(f"unknown Opacus configuration {kind!r}")
    return throughput.StepRunner(kind, step, float(batch))


def make_runner(name: str, data: Any, public: list[str], batch: int, seed: int = 0) -> throughput.StepRunner:
    """The runner called ``name`` (one of ALL, or opacus-ghost-fdp)."""
    if name == "nonprivate":
        return throughput.engine_runner("nonprivate", data, public, batch_size=batch, seed=seed, name=name)
    if name in FEATUREDP:
        parts = name.split("-")
        return throughput.engine_runner(parts[0], data, public, batch_size=batch, strategy=parts[-1], seed=seed,
                                        name=name, max_grad_norm=C,
                                        noise_multiplier=0.0 if "nonoise" in parts else SIGMA,
                                        loss_split="zero" if "zero" in parts else "padding")
    return opacus_runner(name, data, public, batch, seed)


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_probe(name: str, batch: int, steps: int, seed: int) -> dict[str, float]:
    """Resident memory (MB) after setup and its peak over 1 + ``steps`` steps of ``name`` (in a fresh process).

    The peak is the kernel's high-water mark VmHWM, reset after setup (``/proc/self/clear_refs``) so that
    import-time spikes do not hide the step's own peak; ``ru_maxrss`` (never reset) is reported as well.
    """
    data, public = throughput.synthetic_purchase(16 * batch, seed=seed)
    runner = make_runner(name, data, public, batch, seed)
    setup = _status_mb("VmRSS")  # data, model and optimizer built; no step run yet
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    runner.step()  # first step (lazy allocations, ghost validation) counts towards the peak too
    t0 = time.perf_counter()
    for _ in range(steps):
        runner.step()
    return {
        "peak_rss_mb": _status_mb("VmHWM"),
        "setup_rss_mb": setup,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds_per_step": (time.perf_counter() - t0) / steps,
    }


def _probe_subprocess(name: str, batch: int, steps: int, seed: int, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--memory-probe", name, "--batch-sizes", str(batch), "--probe-steps",
           str(steps), "--seed", str(seed), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def opacus_ghost_fdp_refusal(data: Any, public: list[str], batch: int) -> str:
    """The error Opacus ghost clipping raises on the FDP loss (two passes through the same layers)."""
    try:
        runner = opacus_runner("opacus-ghost-fdp", data, public, batch)
        runner.step()
    except Exception as exc:  # the point is to record what Opacus says
        return f"{type(exc).__name__}: {exc}"
    return "accepted (unexpected)"


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print/save a table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="256,1024,4096")
    ap.add_argument("--configs", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probe-steps", type=int, default=2, help="steps per memory probe")
    ap.add_argument("--no-memory", action="store_true", help="skip the per-configuration memory subprocesses")
    ap.add_argument("--out", default=None, help="write the results as JSON here (atomically)")
    ap.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    throughput.set_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe, batches[0], args.probe_steps, args.seed)))
        return 0
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in ALL]
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; choose from {ALL}")
    if "nonprivate" not in configs:
        configs.insert(0, "nonprivate")
    results: dict[str, Any] = {"settings": {**vars(args), "torch": torch.__version__, "C": C, "sigma": SIGMA}}
    for batch in batches:
        data, public = throughput.synthetic_purchase(16 * batch, seed=args.seed)
        runners = [make_runner(c, data, public, batch, args.seed) for c in configs]
        print(f"batch {batch}: timing {len(runners)} configurations, {args.rounds} interleaved rounds ...",
              file=sys.stderr)
        res = throughput.interleaved(runners, rounds=args.rounds, min_time=args.min_time, warmup=1)
        del runners
        entry: dict[str, Any] = {"timing": res.to_dict(), "opacus_ghost_fdp": opacus_ghost_fdp_refusal(
            data, public, min(batch, 64))}
        if not args.no_memory:
            entry["memory"] = {c: _probe_subprocess(c, batch, args.probe_steps, args.seed, args.threads)
                               for c in configs}
        results[str(batch)] = entry
        _print_table(batch, configs, entry)
        if args.out:
            atomic_write_json(args.out, results)
    return 0


def _print_table(batch: int, configs: list[str], entry: dict[str, Any]) -> None:
    t = entry["timing"]
    mem = entry.get("memory", {})
    print(f"\nbatch {batch} (medians over rounds; ratio to nonprivate within rounds)")
    print(f"{'configuration':<22}{'samples/s':>11}{'ratio':>8}{'spread':>8}{'peak MB':>9}{'step MB':>9}")
    for c in configs:
        m = mem.get(c, {})
        peak = m.get("peak_rss_mb", float("nan"))
        step = peak - m.get("setup_rss_mb", float("nan"))
        print(f"{c:<22}{t['median_samples_per_s'][c]:>11,.0f}{t['median_ratio'][c]:>8.3f}{t['spread'][c]:>8.0%}"
              f"{peak:>9,.0f}{step:>9,.0f}")
    print(f"opacus-ghost-fdp: {entry['opacus_ghost_fdp']}")
    sys.stdout.flush()


if __name__ == "__main__":
    # Opacus's hooks warn on every first layer whose input needs no gradient; not informative here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    sys.exit(main())

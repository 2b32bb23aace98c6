"""Throughput measurement of full training steps (``featuredp benchmark`` and ``benchmarks/throughput.py``).

What is timed is the engine's own training step (:class:`featuredp.engine.Trainer`):
sampling and gathering the batch, the loss split's random draws, the clipped
per-example gradient sum, the noise, the public batch for FDP and the optimizer
update — what a user's ``fit`` runs per step, minus progress bars and
accounting. Methods are timed *interleaved* in rounds (the order rotates every
round) and each method's ratio to non-private SGD is computed within a round, so
that slow phases of a shared machine hit all methods alike; medians over rounds
are reported.

The data are synthetic and shaped like Purchase100 (paper §6.2): binary features,
100 classes, 100 public feature columns and the label public, the rest private,
an MLP 600→300→100 with ReLU, C = 0.01, σ = 1, SGD with momentum 0.9.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from featuredp._validate import check_choice, check_int, check_positive
from featuredp.clipping import GhostGradients
from featuredp.data.tabular import TabularDataset
from featuredp.engine import Trainer, init_seed
from featuredp.features import Columns
from featuredp.losses import default_split
from featuredp.methods import get_method
from featuredp.models import build_model, spec_for
from featuredp.noise import DEFAULT_NOISE, NOISE_PLANS, plan_settings
from featuredp.noise.sources import NoiseSource

__all__ = [
    "BenchmarkResult",
    "StepRunner",
    "engine_runner",
    "interleaved",
    "scaling",
    "synthetic_purchase",
]


def synthetic_purchase(
    n: int, *, d: int = 600, n_classes: int = 100, n_public: int = 100, seed: int = 0
) -> tuple[Any, list[str]]:
    """A Purchase100-shaped TabularDataset (binary features) and the names of its public columns."""
    n = check_int("n", n, minimum=1)
    d = check_int("d", d, minimum=2)
    n_public = check_int("n_public", n_public, minimum=1)
    if n_public >= d:
        raise ValueError(f"n_public must be < d={d}, got {n_public}")
    rng = np.random.default_rng(seed)
    # Class-dependent Bernoulli rates, so the labels carry signal (the loss is not trivially flat).
    rates = rng.uniform(0.05, 0.5, size=(n_classes, d))
    y = rng.integers(0, n_classes, size=n)
    X = (rng.random((n, d)) < rates[y]).astype(np.float32)
    names = [f"f{i}" for i in range(d)]
    public = [names[i] for i in sorted(rng.choice(d, size=n_public, replace=False))]
    data = TabularDataset(
        name="synthetic-purchase",
        X=X,
        y=y,
        feature_names=names,
        feature_sources=names,
        label_name="label",
        classes=[str(c) for c in range(n_classes)],
        description="synthetic, Purchase100-shaped (benchmarks only)",
    )
    return data, public


@dataclass
class StepRunner:
    """One timed configuration: ``step()`` runs one training step of ``samples`` (expected) examples."""

    name: str
    step: Callable[[], None]
    samples: float
    info: dict[str, Any] = field(default_factory=dict)


def engine_runner(
    method: str,
    data: Any,
    public_columns: Sequence[str],
    *,
    batch_size: int,
    strategy: Any = "ghost",
    hidden: Sequence[int] = (300,),
    max_grad_norm: float = 0.01,
    noise_multiplier: float = 1.0,
    seed: int = 0,
    name: str | None = None,
    loss_split: str = "padding",
    secure_rng: bool = False,
    device: str | None = None,
    precision: str = "fp32",
    ablate: str | None = None,
    noise: str = DEFAULT_NOISE,
    bands: int | None = None,
) -> StepRunner:
    """A runner for the engine's training step of ``method`` (any of :mod:`featuredp.methods`) on ``data``.

    ``loss_split`` is FDP's split (:func:`featuredp.losses.default_split`): ``"padding"`` (the paper's
    Gaussian padding of the private columns) or ``"zero"`` (zero masking, featuredp's Purchase preset).
    ``seed`` fixes the model initialisation and the public streams only; the private streams come from OS
    entropy, as in a real run. ``secure_rng`` times the ChaCha20 noise and sampling of the secure mode.
    ``device`` is the Trainer's (None: the CPU, where the model is built); ``precision`` its
    ``fp32`` or ``bf16`` (bfloat16 autocast for every method, the non-private reference included).
    ``ablate`` (cost measurements only; the step it times has a weaker or no guarantee): ``"checks"`` switches
    off ghost clipping's per-step separability check and forward guard, ``"noise"`` replaces the float64
    noise by the old float32 ``torch.randn`` (bounded support), so that one interleaved run gives their costs.
    ``noise``: the private steps' noise, ``DEFAULT_NOISE``, ``"bandmf"`` (BandMF with ``bands`` bands, default
    :data:`BENCHMARK_BANDS`: the step draws one Gaussian vector and runs the float64 recurrence over the last
    b − 1 noise vectors, and samples from b secret partitions) or ``"blt"`` (BLT, no ``bands``: its strategy is
    optimised for a run of :data:`BENCHMARK_BLT_EPOCHS` epochs of ⌊n/m⌋ steps, and the step runs the float64
    recurrence over its d buffers, in ``info["buffers"]``, and samples from ⌊n/m⌋ secret partitions).
    """
    if ablate not in (None, *ABLATIONS):
        raise ValueError(f"ablate must be one of {', '.join(ABLATIONS)} or None, got {ablate!r}")
    record = get_method(method)
    noise = check_choice("noise", noise, tuple(NOISE_PLANS))
    kind = NOISE_PLANS[noise]
    if noise != DEFAULT_NOISE:
        if not record.private:
            raise ValueError(f"noise={noise!r} is for the private methods, got method {method!r}")
        if ablate is not None:
            raise ValueError(f"ablate is for independent noise, got ablate={ablate!r} with noise={noise!r}")
    if "bands" in plan_settings(kind):
        bands = check_int("bands", BENCHMARK_BANDS if bands is None else bands, minimum=1)
        steps = bands
    elif bands is not None:
        raise ValueError(f"bands is for noise='bandmf', got bands={bands} with noise={noise!r}")
    elif kind.correlated:  # BLT
        # A one-step (or one-epoch) plan would give BLT a strategy for a single participation, not a training run's.
        steps = max(2, BENCHMARK_BLT_EPOCHS * (int(data.n) // int(batch_size)))
    else:
        steps = 1
    spec = spec_for(data, "mlp", hidden=list(hidden))
    model = build_model(spec, seed=init_seed(seed))
    # Non-private SGD and DP-SGD train on the plain loss; only the methods that read Ψ get it (and FDP pays
    # for its padding draws).
    fmap = Columns(public=list(public_columns)) if record.needs_feature_map else None
    trainer = Trainer(
        model,
        record.name,
        # The timed step never counts steps; a one-step plan keeps the plan's checks (the noise sampler's tail
        # against δ, featuredp.accounting.sampler) from refusing a run planned far beyond any accountant. BandMF
        # plans b steps, the fewest its strategy takes, and BLT a few epochs (the timed steps go on past them, as a
        # long run's would).
        steps=steps,
        noise=noise,
        bands=bands,
        batch_size=batch_size,
        public_batch_size=batch_size,
        noise_multiplier=noise_multiplier if record.private else None,
        max_grad_norm=max_grad_norm,
        delta=1e-6,
        lr=0.1,
        momentum=0.9,
        strategy=strategy,
        loss_split=default_split(fmap, loss_split) if fmap is not None else None,
        # Ghost needs no physical batches (its memory is that of a non-private step); vmap keeps the engine's
        # default chunks of 256, without which per-example gradients at batch 4096 need many GB.
        physical_batch_size=None if strategy == "ghost" else 256,
        public_seed=seed,
        secure_rng=secure_rng,
        device=device,
        precision=precision,
        progress=False,
    )
    # The engine's own step, without the progress bar and the accountant calls at log points (those are not
    # part of a training step's cost).
    if ablate == "checks":
        _without_checks(trainer.strategy)
    timed = trainer._timing_step(data)
    if ablate == "noise" and trainer.run.state is not None:
        trainer.run.state.noise = _Float32Noise(trainer.device)
    where = trainer.device
    if where.type == "cuda":  # CUDA runs asynchronously: a step has ended when the device has finished it

        def step() -> None:
            timed()
            torch.cuda.synchronize(where)

    else:
        step = timed

    strategy_name = getattr(trainer.strategy, "name", str(strategy)) if record.private else "-"
    return StepRunner(
        name or (f"{method}-{strategy_name}" if record.private else method),
        step,
        float(batch_size),
        {"method": method, "strategy": strategy_name, "trainer": trainer, "loss_split": loss_split,
         "secure_rng": secure_rng, "ablate": ablate, "noise": noise, "bands": bands,
         "buffers": getattr(trainer.plan.noise, "buffers", None) if trainer.plan else None},
    )


#: What ``engine_runner(ablate=...)`` can switch off to measure its cost.
ABLATIONS = ("checks", "noise")
#: BandMF's bands in ``featuredp benchmark`` when none are given (the engine's default without a target ε)
BENCHMARK_BANDS = 8
#: the epochs (of ⌊n/m⌋ steps) whose BLT strategy ``featuredp benchmark`` times: several participations per record
BENCHMARK_BLT_EPOCHS = 4


def _without_checks(strategy: Any) -> None:
    """Switch off ghost clipping's per-step separability check and forward guard on ``strategy`` (a no-op for any
    other strategy). For cost measurements only, and private on purpose: the steps it then takes have a weaker
    guarantee (a model that mixes examples would go unrefused), so no run or user API offers it. The Trainer's
    benchmark (``ablate="checks"``) and the own-loop benchmarks (``benchmarks/*_speed.py``) all switch them so."""
    if isinstance(strategy, GhostGradients):
        strategy._check_separability = False
        strategy._guard_forward = False


class _Float32Noise(NoiseSource):
    """The noise of featuredp <= 0.3: ``torch.randn`` in the parameters' dtype (float32 Box-Muller on 24-bit
    uniforms, support bounded at 5.77 sigma). Kept here only to time what the float64 noise costs."""

    def __init__(self, device: torch.device) -> None:
        self.generator = torch.Generator(device=device)
        self.generator.seed()  # OS entropy

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + float32 ``torch.randn`` noise."""
        return {k: torch.randn(v.shape, generator=self.generator, dtype=v.dtype, device=v.device).mul_(std).add_(v)
                for k, v in sums.items()}

    def state_dict(self) -> dict[str, Any]:
        """The generator state."""
        return {"torch": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.generator.set_state(state["torch"])

    def rekey(self) -> None:
        """Re-seed from OS entropy."""
        self.generator.seed()


@dataclass
class BenchmarkResult:
    """Samples/s per runner and round, with medians and within-round ratios to the reference runner."""

    names: list[str]
    reference: str
    samples_per_s: dict[str, list[float]]
    ratios: dict[str, list[float]]

    def median(self, name: str) -> float:
        """Median samples/s of ``name`` over rounds."""
        return statistics.median(self.samples_per_s[name])

    def median_ratio(self, name: str) -> float:
        """Median over rounds of (samples/s of ``name``) / (samples/s of the reference) in the same round."""
        return statistics.median(self.ratios[name])

    def median_ratio_to(self, name: str, other: str) -> float:
        """Median over rounds of (samples/s of ``name``) / (samples/s of ``other``) in the same round."""
        return statistics.median(a / b for a, b in zip(self.samples_per_s[name], self.samples_per_s[other]))

    def spread(self, name: str) -> float:
        """Relative spread of ``name``'s samples/s over rounds: (max − min) / median (machine noise)."""
        v = self.samples_per_s[name]
        return (max(v) - min(v)) / statistics.median(v)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (medians, ratio medians, per-round values)."""
        return {
            "reference": self.reference,
            "median_samples_per_s": {n: self.median(n) for n in self.names},
            "median_ratio": {n: self.median_ratio(n) for n in self.names},
            "spread": {n: self.spread(n) for n in self.names},
            "rounds": {"samples_per_s": self.samples_per_s, "ratios": self.ratios},
        }


def interleaved(
    runners: Sequence[StepRunner],
    *,
    rounds: int = 7,
    min_time: float = 0.5,
    warmup: int = 2,
    reference: str | None = None,
    progress: bool = True,
) -> BenchmarkResult:
    """Time every runner once per round (rotating the order), each for at least ``min_time`` seconds
    (at least one step), after ``warmup`` untimed steps; ratios are taken against ``reference``
    (default: the first runner) within each round.

    In a data-parallel run (``torchrun``) every rank must take the same number of steps, or the
    collectives inside a step would wait forever: rank 0 times one more step of each runner after
    the warm-up and tells every rank how many steps make ``min_time``; each timed block starts at a
    barrier, and the samples/s are rank 0's (the runners' ``samples`` are global batch sizes).
    """
    rounds = check_int("rounds", rounds, minimum=1)
    min_time = check_positive("min_time", min_time)
    warmup = check_int("warmup", warmup, minimum=0)
    if not runners:
        raise ValueError("runners must not be empty")
    names = [r.name for r in runners]
    if len(set(names)) != len(names):
        raise ValueError(f"runner names must be unique, got {names}")
    reference = reference or names[0]
    if reference not in names:
        raise ValueError(f"reference must be one of {names}, got {reference!r}")
    bar = tqdm(total=rounds * len(runners), disable=not progress, desc="benchmark", leave=False)
    for r in runners:
        for _ in range(warmup):
            r.step()
    together = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    fixed = _agreed_steps(runners, min_time) if together else None
    sps: dict[str, list[float]] = {n: [] for n in names}
    for i in range(rounds):
        order = list(runners[i % len(runners) :]) + list(runners[: i % len(runners)])
        for r in order:
            if together:
                dist.barrier()
            steps, start = 0, time.perf_counter()
            while True:
                r.step()
                steps += 1
                elapsed = time.perf_counter() - start
                if (fixed is None and elapsed >= min_time) or (fixed is not None and steps >= fixed[r.name]):
                    break
            sps[r.name].append(steps * r.samples / elapsed)
            bar.update(1)
    bar.close()
    ratios = {n: [a / b for a, b in zip(sps[n], sps[reference])] for n in names}
    return BenchmarkResult(names, reference, sps, ratios)


def _agreed_steps(runners: Sequence[StepRunner], min_time: float) -> dict[str, int]:
    """Steps per timed block for each runner, decided by rank 0 from one timed step and shared."""
    counts: list[int] = []
    for r in runners:
        dist.barrier()
        start = time.perf_counter()
        r.step()
        counts.append(max(1, math.ceil(min_time / max(time.perf_counter() - start, 1e-9))))
    agreed = torch.tensor(counts, dtype=torch.int64)
    dist.broadcast(agreed, src=0)
    return {r.name: int(k) for r, k in zip(runners, agreed.tolist())}


def scaling(
    benchmark_args: Sequence[str], nprocs: Sequence[int], *, timeout: float, progress: bool = True
) -> list[dict[str, Any]]:
    """``featuredp benchmark --json`` with each process count in ``nprocs`` (strong scaling: the same global
    batch split over the processes), each launched through ``torch.distributed.run`` on this host (gloo,
    127.0.0.1); returns one JSON object per count with ``nproc`` added.

    A launch that fails or outlives ``timeout`` seconds is a RuntimeError with the end of its output.
    """
    results = []
    for k in nprocs:
        k = check_int("nproc", k, minimum=1)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={k}",
               "--master-addr=127.0.0.1", "-m", "featuredp", "benchmark", *benchmark_args, "--json"]  # fmt: skip
        if progress:
            print(f"benchmark: {k} process(es) ...", file=sys.stderr, flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        for attempt in (1, 2):
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the {k}-process benchmark did not finish within {timeout:.0f} s") from None
            # gloo sometimes aborts a process while tearing down its sockets on a loaded host (SIGABRT after the
            # work is done); such a launch is run once more rather than reported as a failed benchmark
            if done.returncode == 0 or "SIGABRT" not in (done.stderr + done.stdout) or attempt == 2:
                break
            if progress:
                print(f"benchmark: {k} process(es): a process aborted in gloo's teardown; running it again",
                      file=sys.stderr, flush=True)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"the {k}-process benchmark failed (exit {done.returncode}): " + " | ".join(tail))
        results.append({"nproc": k, **json.loads(lines[-1])})
    return results


def efficiency(results: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, dict[int, float]]:
    """Strong-scaling efficiency per runner: samples/s with k processes / (k × samples/s with the fewest).

    >>> efficiency([{"nproc": 1, "a": 100.0}, {"nproc": 2, "a": 150.0}], ["a"])
    {'a': {1: 1.0, 2: 0.75}}
    """
    base = min(results, key=lambda r: r["nproc"])
    return {n: {int(r["nproc"]): r[n] / (r["nproc"] / base["nproc"] * base[n]) for r in results} for n in names}


def set_threads(threads: int) -> None:
    """Use ``threads`` intra-op threads in torch (and 1 inter-op thread)."""
    threads = check_int("threads", threads, minimum=1)
    torch.set_num_threads(threads)

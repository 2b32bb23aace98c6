"""Cost of the float64 noise (no missing tail) against the old float32 ``torch.randn`` noise.

Three sources: the new one (63-bit words, 126-bit radius uniform), a plain float64 Box–Muller on 53-bit
``torch.rand`` uniforms added the same way (radius ≤ 8.57: what float64 alone costs, without the tail fix), and
the old float32 ``torch.randn``.

One engine step of ``fdp`` (Algorithm 1, ghost clipping, zero-masking split) at batch 1024 on the Purchase-shaped
MLP (600→300→100, 210,400 parameters), on one Trainer whose noise source is swapped between the two before each
timed step, interleaved (the order alternates every round), medians; plus the noise call alone. 1 torch thread.

    python benchmarks/noise_cost.py [ROUNDS]    # default 15 rounds, about a minute
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any

import torch

from featuredp.experiments.throughput import engine_runner, synthetic_purchase
from featuredp.noise import NoiseSource, _add_in_float64

torch.set_num_threads(1)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
B = 1024


class Float32Randn(NoiseSource):
    """The noise before this change: ``torch.randn`` in the parameters' dtype, added in place (bounded at 5.77σ)."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + float32 ``torch.randn``."""
        return {k: torch.randn(v.shape, generator=self.generator, dtype=v.dtype).mul_(std).add_(v)
                for k, v in sums.items()}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Unused here."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Unused here."""


class Float64Plain(NoiseSource):
    """Float64 Box–Muller on 53-bit ``torch.rand`` uniforms, added in float64 (bounded at 8.57σ): cost split only."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + plain float64 Box–Muller normals."""
        total = sum(v.numel() for v in sums.values())
        pairs = -(-total // 2)
        u = torch.rand((2, pairs), generator=self.generator, dtype=torch.float64)
        r = u[1].neg_().add_(1.0).log_().mul_(-2.0).sqrt_()
        theta = u[0].mul_(2 * math.pi)
        z = torch.cat([r * torch.cos(theta), r * theta.sin_()])
        return _add_in_float64(sums, z, std)

    def state_dict(self) -> dict[str, Any]:
        """Unused here."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Unused here."""


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


data, public = synthetic_purchase(16 * B, seed=0)
runner = engine_runner("fdp", data, public, batch_size=B, loss_split="zero")
state = runner.info["trainer"]._state
sources = {"float64 (new)": state.noise, "float64 plain 53-bit": Float64Plain(), "float32 randn (old)": Float32Randn()}
params = {k: p.detach() for k, p in runner.info["trainer"].model.named_parameters()}
sums = {k: torch.randn_like(p) for k, p in params.items()}
dim = sum(p.numel() for p in params.values())


def step_with(name: str) -> float:
    state.noise = sources[name]
    return timed(runner.step)


names = list(sources)
for name in names * 2:  # warm-up
    step_with(name)
steps: dict[str, list[float]] = {n: [] for n in names}
calls: dict[str, list[float]] = {n: [] for n in names}
for i in range(ROUNDS):
    order = names[i % len(names) :] + names[: i % len(names)]  # rotate the order each round
    for name in order:
        steps[name].append(step_with(name))
    for name in order:
        src = sources[name]
        calls[name].append(statistics.median(timed(lambda: src.add(sums, 1.0)) for _ in range(5)))  # noqa: B023
state.noise = sources["float64 (new)"]

med_step = {n: statistics.median(v) for n, v in steps.items()}
med_call = {n: statistics.median(v) for n, v in calls.items()}
ratio = statistics.median(a / b for a, b in zip(steps["float64 (new)"], steps["float32 randn (old)"]))
print(f"fdp step, batch {B}, Purchase-shaped MLP ({dim:,} noised coordinates), {ROUNDS} interleaved rounds, "
      f"1 thread, torch {torch.__version__}")  # fmt: skip
for n in names:
    print(f"  {n:20s} step median {med_step[n] * 1e3:7.2f} ms   noise call median {med_call[n] * 1e3:6.2f} ms "
          f"({med_call[n] / med_step[n] * 100:4.1f}% of its step)")  # fmt: skip
plain = statistics.median(a / b for a, b in zip(steps["float64 plain 53-bit"], steps["float32 randn (old)"]))
new, old, flat = (med_call[n] * 1e3 for n in ("float64 (new)", "float32 randn (old)", "float64 plain 53-bit"))
print(f"  step ratio new/old (median of per-round ratios): {ratio:.3f} (plain float64/old: {plain:.3f}); noise call "
      f"difference new - old {new - old:.2f} ms, new - plain float64 (the tail fix) {new - flat:.2f} ms")

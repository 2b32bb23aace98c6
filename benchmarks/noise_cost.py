"""Cost of the float64 noise: the lazy transform against the three-word one it replaced (same distribution).

Three sources: the new lazy transform (two 63-bit words per pair, a third only where it can change the result,
reused CPU buffers), the three-word reference transform it replaced (``normals_from_words``, fresh tensors every
call), and the float32 ``torch.randn`` of before the tail fix (radius ≤ 5.77: a floor, not a candidate).

One engine step of ``fdp`` (or METHOD; Algorithm 1, ghost clipping, zero-masking split) at batch 1024 on the
Purchase-shaped MLP (600→300→100, 210,400 parameters), on one Trainer whose noise source is swapped before each
timed step, interleaved (the order rotates every round), medians; plus the noise call alone. 1 torch thread.

    python benchmarks/noise_cost.py [ROUNDS] [METHOD]    # default 15 rounds of fdp, about a minute; or dpsgd
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from featuredp.experiments.throughput import engine_runner, synthetic_purchase
from featuredp.noise.sources import NoiseSource, _random_words, normals_from_words

torch.set_num_threads(1)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
METHOD = sys.argv[2] if len(sys.argv) > 2 else "fdp"
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


class ThreeWordFloat64(NoiseSource):
    """The float64 noise before the lazy transform: three words per pair through the reference
    ``normals_from_words``, fresh tensors every call, added in float64 (the same distribution as the new one)."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``sums`` + the reference transform's normals."""
        total = sum(v.numel() for v in sums.values())
        z = normals_from_words(_random_words(self.generator, -(-total // 2), torch.device("cpu")))
        out, start = {}, 0
        for k, v in sums.items():
            part = z[start : start + v.numel()].view(v.shape)
            start += v.numel()
            out[k] = part.mul_(std).add_(v.to(torch.float64)).to(v.dtype)
        return out

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
runner = engine_runner(METHOD, data, public, batch_size=B, loss_split="zero")
state = runner.info["trainer"].run.state
NEW, BEFORE, F32 = "float64 lazy (new)", "float64 3-word (before)", "float32 randn"
sources = {NEW: state.noise, BEFORE: ThreeWordFloat64(), F32: Float32Randn()}
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
state.noise = sources[NEW]

med_step = {n: statistics.median(v) for n, v in steps.items()}
med_call = {n: statistics.median(v) for n, v in calls.items()}
print(f"{METHOD} step, batch {B}, Purchase-shaped MLP ({dim:,} noised coordinates), {ROUNDS} interleaved rounds, "
      f"1 thread, torch {torch.__version__}")  # fmt: skip
for n in names:
    print(f"  {n:24s} step median {med_step[n] * 1e3:7.2f} ms   noise call median {med_call[n] * 1e3:6.2f} ms "
          f"({med_call[n] / med_step[n] * 100:4.1f}% of its step)")  # fmt: skip
step_ratio = statistics.median(a / b for a, b in zip(steps[NEW], steps[BEFORE]))
call_ratio = statistics.median(a / b for a, b in zip(calls[NEW], calls[BEFORE]))
vs_f32 = statistics.median(a / b for a, b in zip(steps[NEW], steps[F32]))
print(f"  medians of per-round ratios: noise call new/before {call_ratio:.3f}, step new/before {step_ratio:.3f}, "
      f"step new/float32 randn {vs_f32:.3f}")  # fmt: skip

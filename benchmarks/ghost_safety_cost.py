"""Cost of ghost clipping's safety checks on the Purchase-shaped MLP (600→300→100), batch 1024, FDP loss.

1. One-time separability cross-check: the first clipped_sum on a model (fresh GhostGradients) with the check
   on vs off (``_check_separability = False``); everything else in a first call (plan, tied-weight validation,
   the guard's first-call copies) is in both. Reported next to the steady-state clipped_sum and engine step.
2. Per-step ForwardStateGuard: steady-state clipped_sum with the guard vs with it replaced by a no-op, and the
   guard alone (enter + exit) in a tight loop.
Interleaved repeats, medians, 1 torch thread.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

import torch

import featuredp.clipping.ghost as pg
from featuredp import batches, engine
from featuredp.clipping import ForwardStateGuard
from featuredp.experiments.throughput import engine_runner, synthetic_purchase

torch.set_num_threads(1)
REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
SPLIT = sys.argv[2] if len(sys.argv) > 2 else "zero"
B = 1024

data, public = synthetic_purchase(16 * B, seed=0)
runner = engine_runner("fdp", data, public, batch_size=B, strategy=pg.GhostGradients(), loss_split=SPLIT)
trainer = runner.info["trainer"]
model = trainer.model
split = trainer._resolve_split(data)
batch_all = engine.as_batch(data)
idx = torch.randperm(batch_all["x"].shape[0], generator=torch.Generator().manual_seed(0))[:B].numpy()
b = batches.gather(batch_all, idx)
d = split.draws(b, torch.Generator().manual_seed(1))
loss_fn = split.private_loss
C = 0.01


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def first_call(check: bool) -> float:
    s = pg.GhostGradients()
    s._check_separability = check
    return timed(lambda: s.clipped_sum(model, loss_fn, b, d, C))


steady = pg.GhostGradients()
steady.clipped_sum(model, loss_fn, b, d, C)  # plan, validation, cross-check, guard's first call
assert steady.plan(model).separable


@contextlib.contextmanager
def no_guard(model, first_call=True):
    yield


def steady_call(guard: bool) -> float:
    pg.ForwardStateGuard = ForwardStateGuard if guard else no_guard
    try:
        return timed(lambda: steady.clipped_sum(model, loss_fn, b, d, C))
    finally:
        pg.ForwardStateGuard = ForwardStateGuard


for _ in range(3):  # warm-up
    first_call(True), first_call(False), steady_call(True), steady_call(False), runner.step()

res: dict[str, list[float]] = {k: [] for k in ("first_check", "first_nocheck", "steady_guard", "steady_noguard",
                                                "engine_step")}
for i in range(REPEATS):
    jobs = [("first_check", lambda: first_call(True)), ("first_nocheck", lambda: first_call(False))]
    jobs += [("steady_guard", lambda: statistics.median(steady_call(True) for _ in range(5))),
             ("steady_noguard", lambda: statistics.median(steady_call(False) for _ in range(5))),
             ("engine_step", lambda: timed(runner.step))]
    jobs = jobs[i % len(jobs):] + jobs[: i % len(jobs)]  # rotate the order each round
    for name, job in jobs:
        res[name].append(job())

# The guard alone, many times (enter + exit on the steady-state path: identity/version checks, no copies here
# because the MLP has no buffers).
n_loop = 20000
guard_alone = []
for _ in range(REPEATS):
    t = time.perf_counter()
    for _ in range(n_loop):
        with ForwardStateGuard(model, first_call=False):
            pass
    guard_alone.append((time.perf_counter() - t) / n_loop)
t = time.perf_counter()
for _ in range(20):
    with ForwardStateGuard(model, first_call=True):
        pass
guard_first = (time.perf_counter() - t) / 20

med = {k: statistics.median(v) for k, v in res.items()}
diff = statistics.median(a - c for a, c in zip(res["first_check"], res["first_nocheck"]))
gdiff = statistics.median(a - c for a, c in zip(res["steady_guard"], res["steady_noguard"]))
print(f"loss split {SPLIT!r}, batch {B}, {REPEATS} interleaved repeats, 1 thread, torch {torch.__version__}")
for k, v in med.items():
    print(f"  {k:15s} median {v * 1e3:8.2f} ms   (all: {', '.join(f'{x * 1e3:.1f}' for x in res[k])})")
print(f"  separability check, one-time extra: median paired difference {diff * 1e3:.2f} ms "
      f"= {diff / med['steady_noguard']:.2f} steady clipped_sums = {diff / med['engine_step']:.2f} engine steps")
print(f"  guard per step: paired difference {gdiff * 1e6:.0f} us ({gdiff / med['steady_noguard'] * 100:.2f}% of "
      f"clipped_sum); guard alone {statistics.median(guard_alone) * 1e6:.1f} us/step; first call "
      f"(copies {sum(p.numel() for p in model.parameters())} parameters) {guard_first * 1e3:.2f} ms")

"""Where a private training step's time goes, at several batch sizes (issue 45's "where a step's time goes").

Times the engine's own step (``featuredp benchmark``'s: the Purchase-shaped MLP 600→300→100, ghost clipping,
C = 0.01, σ = 1) with a wall-clock timer around each part, and prints one table per method:

* ``forward``: the hooked forward of the batch (ghost's layer hooks and the autograd-hook guard);
* ``backward + contributions``: one backward to the layers' outputs and each layer's compact per-example form;
* ``every-step check``: the two rows recomputed alone and compared (``_compare_with_alone``);
* ``chunk check``: the chunk check (1 step in 8, averaged over the steps);
* ``weighted sums``: Σ_i c_i·g_i per layer;
* ``forward guard``: the state guard's record and comparison;
* ``noise``: the float64 Gaussian noise added to the sums;
* ``optimizer``: SGD with momentum;
* ``rest``: Poisson sampling, gathering the batch, the loss split's draws, the norms and clip factors, FDP's public
  batch, and Python glue.

The timers add a few µs per call; the step is timed with them in place. One thread.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/step_breakdown.py --batch-sizes 256,1024,4096
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from featuredp.clipping import GhostGradients
from featuredp.clipping.safety import ForwardStateGuard
from featuredp.experiments.throughput import engine_runner, synthetic_purchase
from featuredp.noise.sources import NoiseSource

PARTS = ("forward", "backward + contributions", "every-step check", "chunk check", "weighted sums", "forward guard",
         "noise", "optimizer")  # fmt: skip


@contextmanager
def timers(spent: dict[str, float]) -> Iterator[None]:
    """Wall-clock timers around each part's method, summed into ``spent`` (restored on exit)."""
    patched: list[tuple[Any, str, Any]] = []

    def wrap(cls: Any, attr: str, part: str) -> None:
        owner = next(k for k in cls.__mro__ if attr in k.__dict__)  # where the method is defined (a mixin)
        original = owner.__dict__[attr]
        func = original.__func__ if isinstance(original, staticmethod) else original

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start

        setattr(owner, attr, staticmethod(timed) if isinstance(original, staticmethod) else timed)
        patched.append((owner, attr, original))

    wrap(GhostGradients, "_hooked", "forward")
    wrap(GhostGradients, "_contributions", "backward + contributions")
    wrap(GhostGradients, "_compare_with_alone", "every-step check")
    wrap(GhostGradients, "_compare_chunk", "chunk check")
    wrap(GhostGradients, "_sums", "weighted sums")
    wrap(ForwardStateGuard, "__enter__", "forward guard")
    wrap(ForwardStateGuard, "__exit__", "forward guard")
    for cls in _subclasses(NoiseSource):
        if "add" in cls.__dict__:
            wrap(cls, "add", "noise")
    wrap(torch.optim.SGD, "step", "optimizer")
    try:
        yield
    finally:
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


def breakdown(method: str, batch_size: int, min_time: float) -> tuple[float, dict[str, float]]:
    """(ms per step, {part: ms per step}) of ``method``'s engine step at ``batch_size``."""
    data, public = synthetic_purchase(16 * batch_size, seed=0)
    runner = engine_runner(method, data, public, batch_size=batch_size, loss_split="zero")
    step: Callable[[], None] = runner.step
    for _ in range(3):  # planning, the first check (run twice), warm caches
        step()
    spent: dict[str, float] = collections.defaultdict(float)
    with timers(spent):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < min_time or steps < 16:
            step()
            steps += 1
        total = time.perf_counter() - start
    return 1e3 * total / steps, {p: 1e3 * spent[p] / steps for p in PARTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="256,1024,4096")
    parser.add_argument("--methods", default="dpsgd,fdp")
    parser.add_argument("--min-time", type=float, default=4.0, help="seconds of steps per cell")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    for method in args.methods.split(","):
        cells = {b: breakdown(method, b, args.min_time) for b in sizes}
        print(f"\n{method} (ghost; FDP with zero masking), ms per step and share of the step, 1 thread")
        print("| part | " + " | ".join(f"batch {b}" for b in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for part in (*PARTS, "rest", "step"):
            row = []
            for b in sizes:
                total, parts = cells[b]
                ms = total - sum(parts.values()) if part == "rest" else total if part == "step" else parts[part]
                row.append(f"{ms:.2f} ({100 * ms / total:.0f}%)" if part != "step" else f"**{ms:.2f}**")
            print(f"| {part} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

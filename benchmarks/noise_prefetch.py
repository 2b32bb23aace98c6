"""The noise off the critical path: one DP-SGD step with its noise drawn in line, drawn ahead, and not drawn.

One Trainer's ``dpsgd`` step (ghost clipping) on the Purchase-shaped MLP (600→300→100, 210,400 noised
coordinates) at each batch size of ``--batch-sizes``, the run's own noise source switched between drawing the next
step's noise ahead on a worker thread (``prefetch_noise=True``, the default), drawing it in line, and a source that
adds nothing (the floor: what the step costs without noise). Interleaved rounds, the order rotating, medians. The
step's torch ops use 1 thread, so the worker has the machine's other core.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/noise_prefetch.py --batch-sizes 256,1024,4096 --rounds 15

"noise on the critical path" = (step − step without noise) / step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from featuredp.experiments.throughput import engine_runner, synthetic_purchase
from featuredp.noise.sources import NoiseSource


class NoNoise(NoiseSource):
    """Adds nothing: the step's floor."""

    def add(self, sums: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """The sums, copied."""
        return {k: v.clone() for k, v in sums.items()}

    def state_dict(self) -> dict[str, Any]:
        """Unused here."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Unused here."""

    def rekey(self) -> None:
        """Unused here."""


def main() -> None:
    """Time the three arms at each batch size and print the table."""
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", default="256,1024,4096")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    print("| batch | step, noise drawn ahead (ms) | step, noise in line (ms) | step without noise (ms) | "
          "noise on the critical path: ahead | in line |")
    print("|---|---|---|---|---|---|")
    for b in (int(x) for x in args.batch_sizes.split(",")):
        data, public = synthetic_purchase(16 * b, seed=0)
        runner = engine_runner("dpsgd", data, public, batch_size=b)
        state = runner.info["trainer"].run.state
        source = state.noise

        def arm(name: str, runner: Any = runner, state: Any = state, source: Any = source) -> float:
            if name == "none":
                state.noise = NoNoise()
            else:
                state.noise = source
                source._discard()
                source.prefetch = name == "ahead"
                if source.prefetch:
                    runner.step()  # the draw for the timed step is made ahead by this one, as in a run
            t = time.perf_counter()
            runner.step()
            return time.perf_counter() - t

        names = ["ahead", "inline", "none"]
        for name in names * 2:
            arm(name)
        times: dict[str, list[float]] = {n: [] for n in names}
        for i in range(args.rounds):
            for name in names[i % 3:] + names[:i % 3]:
                times[name].append(arm(name))
        med = {n: statistics.median(v) for n, v in times.items()}
        crit = {n: (med[n] - med["none"]) / med[n] for n in ("ahead", "inline")}
        print(f"| {b} | {med['ahead'] * 1e3:.1f} | {med['inline'] * 1e3:.1f} | {med['none'] * 1e3:.1f} | "
              f"{100 * crit['ahead']:.1f}% | {100 * crit['inline']:.1f}% |")


if __name__ == "__main__":
    main()

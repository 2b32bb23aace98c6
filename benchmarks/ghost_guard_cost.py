"""ForwardStateGuard alone (enter + exit, steady state and first call) on models of different shapes; 1 thread.

``python benchmarks/ghost_guard_cost.py`` prints the median time of one guard per model.
"""

from __future__ import annotations

import statistics
import time

import torch

from featuredp.clipping import ForwardStateGuard
from featuredp.diffusion.unet import build_unet
from featuredp.models import SparseLogisticRegression

torch.set_num_threads(1)
models = {
    "SparseLogisticRegression(2 small buffers)": SparseLogisticRegression([0, 1], [3, 5, 2], 3),
    "UNet 'tiny'": build_unet("tiny"),
}
for name, m in models.items():
    nmod = sum(1 for _ in m.modules())
    npar = sum(p.numel() for p in m.parameters())
    for first in (False, True):
        n = 2000 if not first else 20
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            with ForwardStateGuard(m, first_call=first):
                pass
            times.append(time.perf_counter() - t0)
        kind = "first call" if first else "steady"
        print(f"{name}: {nmod} modules, {npar} params, {kind}: {statistics.median(times) * 1e6:.1f} us")

"""Shared test configuration.

Tests run on 2-core machines next to other work: one intra-op thread keeps torch
timings steady and avoids oversubscription.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:  # torch is optional for the accounting tests
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

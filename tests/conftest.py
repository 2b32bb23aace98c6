"""Shared test configuration.

Tests run on 2-core machines next to other work: one intra-op thread keeps torch
timings steady and avoids oversubscription.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Private checkpoints (featuredp train --out) go to a throwaway folder, never to the user's ~/.local/state.
os.environ.setdefault("FEATUREDP_PRIVATE_DIR", tempfile.mkdtemp(prefix="featuredp-private-"))

try:  # torch is optional for the accounting tests
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

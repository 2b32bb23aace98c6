"""Shared test configuration.

Tests run on 2-core machines next to other work: one intra-op thread keeps torch
timings steady and avoids oversubscription.
"""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Private checkpoints (featuredp train --out) go to a throwaway folder, never to the user's ~/.local/state.
os.environ.setdefault("FEATUREDP_PRIVATE_DIR", tempfile.mkdtemp(prefix="featuredp-private-"))

try:  # torch is optional for the accounting tests
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass



@pytest.fixture
def keys_kept_on_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch off the re-key of a resume (``RunState.rekey_private``), to test that every other part of the state is
    restored exactly: with it off, a resumed run equals the uninterrupted one bit for bit."""
    from featuredp.run_state import RunState

    monkeypatch.setattr(RunState, "rekey_private", lambda self: None)

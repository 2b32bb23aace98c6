"""The replay matrix in a data-parallel run: 2 gloo processes on 127.0.0.1 (one torchrun launch).

Every private method × strategy × fp32/bf16 × secure on/off passes with the ranks' clipped sums and the noise
totalled over the ranks; a broken engine in which every rank adds noise of std σC/W is caught.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _launch import run_torchrun
from featuredp.clipping import STRATEGIES
from featuredp.methods import PRIVATE_METHODS

WORKER = Path(__file__).resolve().parent / "replay_worker.py"
pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


def test_the_replay_matrix_holds_on_two_processes_and_catches_noise_split_over_ranks(tmp_path):
    done = run_torchrun(str(WORKER), str(tmp_path))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    res = json.loads((tmp_path / "replay.json").read_text())
    matrix = res["matrix"]
    # every strategy but "auto", which data-parallel runs refuse (tests/clipping/test_auto.py)
    assert len(matrix) == len(PRIVATE_METHODS) * (len(STRATEGIES) - 1) * 2 * 2
    for r in matrix:
        assert r["world_size"] == 2 and r["outcome"] == "passed", r
    broken = res["noise_per_rank"]
    assert broken["outcome"] == "failed"
    assert {c["name"] for c in broken["checks"] if not c["ok"]} >= {"noise std requested"}

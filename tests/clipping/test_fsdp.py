"""Ghost clipping on a model sharded with FSDP2 (clipping/fsdp.py): the guarantee of one process.

Two gloo ranks (tests/clipping/fsdp_worker.py) train an MLP, a GroupNorm CNN and a causal transformer with tied
embeddings, each sharded with ``shard_model``, for three DP-SGD steps: ghost clipping in chunks of two (the ranks
make different numbers of chunks; rank 1 holds no record on the last step), the chunk check on every step, the
noise from ``ShardedNoise`` with a fixed key. One process, with the same key, on the unsharded model and the whole
batches, must end with the same parameters, to float rounding, and the ranks' norms must be its norms. A model that
mixes examples, and one with a parameter no ghost rule covers, must be refused on both ranks (a refusal on one rank
alone would leave the other waiting in a collective until the timeout).
"""

from __future__ import annotations

from pathlib import Path

import fsdp_worker as worker  # tests/clipping is on the path (no __init__.py), as is tests/ for _launch
import pytest
import torch

from _launch import run_torchrun
from featuredp.clipping import GhostGradients
from featuredp.clipping.fsdp import check_meshes, is_fsdp_hook, plain_type
from featuredp.sharding import units

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fsdp")
    done = run_torchrun(str(Path(__file__).with_name("fsdp_worker.py")), str(out), timeout=240)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[max(0, text.find("Traceback")):][:5000]  # the first rank to fail, first
    return torch.load(out / "fsdp2.pt", weights_only=False)


@pytest.mark.parametrize("kind", ["mlp", "cnn", "lm"])
def test_two_sharded_ranks_release_what_one_process_does(ranks, kind):
    model = worker.build(kind)
    strategy = GhostGradients(physical_batch_size=2)
    strategy._chunk_check_rate = 1.0
    norms = worker.train(model, kind, [slice(0, n) for n, _ in worker.STEPS], strategy)
    got = ranks[kind]["params"]
    start = worker.build(kind).state_dict()
    assert list(got) == [n for n, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        assert not torch.equal(p.detach(), start[name]), name  # the steps moved every parameter
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    _same_norms(ranks[kind]["norms"], norms)


def _same_norms(per_rank: list, norms: list[torch.Tensor]) -> None:
    for step, ((n, _), mine) in enumerate(zip(worker.STEPS, norms)):
        theirs = [v for rank in per_rank for v in rank[step]]
        assert len(theirs) == n
        torch.testing.assert_close(torch.tensor(theirs, dtype=torch.float64), mine.double(), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mlp", "lm"])
def test_hsdp_on_four_ranks_releases_what_one_process_does(tmp_path_factory, kind):
    """Two replicas of a 2-way sharding (a 2 × 2 mesh): the replicas noise their shards alike, the sums are over
    all four ranks' records. Slow: four processes on a 2-core host."""
    out = tmp_path_factory.getbasetemp() / "hsdp"
    if not (out / "fsdp4.pt").exists():
        out.mkdir(exist_ok=True)
        done = run_torchrun(str(Path(__file__).with_name("fsdp_worker.py")), str(out), nproc=4, timeout=400)
        text = done.stdout + done.stderr
        assert done.returncode == 0, text[max(0, text.find("Traceback")):][:5000]
    got = torch.load(out / "fsdp4.pt", weights_only=False)[kind]
    assert any("Replicate" in p and "Shard" in p for p in got["placements"].values())
    model = worker.build(kind)
    strategy = GhostGradients(physical_batch_size=2)
    strategy._chunk_check_rate = 1.0
    norms = worker.train(model, kind, [slice(0, n) for n, _ in worker.STEPS], strategy)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got["params"][name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    _same_norms(got["norms"], norms)
    for name, value in got["params"].items():  # its DCP checkpoint, read back into a fresh HSDP model
        torch.testing.assert_close(got["reloaded"][name], value, rtol=0, atol=0, msg=name)


def test_a_wrong_key_on_the_one_process_side_differs(ranks, monkeypatch):
    """The comparison above has power: one process with another key ends elsewhere."""
    monkeypatch.setattr(worker, "KEY", bytes(32))
    model = worker.build("mlp")
    worker.train(model, "mlp", [slice(0, n) for n, _ in worker.STEPS], GhostGradients(physical_batch_size=2))
    got = ranks["mlp"]["params"]
    assert any(not torch.allclose(got[n], p.detach(), atol=1e-3) for n, p in model.named_parameters())


def test_mixing_and_unruled_parameters_are_refused_on_every_rank(ranks):
    for rank in ranks["refusals"]:
        assert rank["mixing"].startswith("BatchMixingError"), rank  # its own finding, or another rank's
        assert rank["unruled"].startswith("ValueError") and "scale" in rank["unruled"], rank
    assert any("mixes examples" in rank["mixing"] for rank in ranks["refusals"])


def test_units_leave_a_tied_parameter_to_the_root():
    lm = worker.build("lm")
    names = units(lm)
    assert "tok" not in names and "head" not in names and "blocks.0.qkv" in names
    assert units(worker.build("mlp")) == ["0", "2"]


def test_fsdp_hooks_and_types_are_recognised_and_nothing_else():
    assert plain_type(torch.nn.Linear(2, 2)) is torch.nn.Linear
    assert not is_fsdp_hook(lambda g: g)
    assert not is_fsdp_hook(print)


def test_a_parameter_sharded_over_fewer_than_every_rank_is_refused(monkeypatch):
    """Each rank's records are summed over all the ranks: a mesh of some of them would drop the others' sums."""

    class Mesh:
        def size(self) -> int:
            return 2

    class Sharded:
        device_mesh = Mesh()

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 4)
    with pytest.raises(ValueError, match=r"'w' is sharded over 2 of the 4 ranks"):
        check_meshes({"b": torch.zeros(2), "w": Sharded()})
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    check_meshes({"w": Sharded()})  # every rank: accepted

"""``Trainer(..., sharding="fsdp")`` on 2 gloo ranks (tests/fsdp_run_worker.py): the run of one process.

* the update is the clipped sum over the union of the ranks' Poisson batches, exactly one process's on those records;
* the noise on every coordinate is one process's draw under the run's one key (``ShardedNoise``): the union of the
  shards, never drawn at a parameter's full shape (the largest float64 tensor of a step, watched on every op);
* Algorithm 1 and FDP (DP-SGD) give the parameters of the data-parallel run with the same seeds (σ = 0), on an MLP,
  a GroupNorm CNN and a causal transformer with a tied embedding;
* the replay self-test passes (one record moves the clipped sum by at most C), and fails on a doubled sum;
* Opacus's FSDP2 loop (``fully_shard`` first, ``grad_sample_mode="ghost_fsdp"``) trains as the data-parallel engine;
* a resumed sharded checkpoint (weights and moments in a DCP folder) restores them, keeps the accounting of the
  uninterrupted run and re-keys the noise; a swapped DCP metadata file is refused on every rank;
* the own loop's checkpoints under torchrun: each rank its own file, a sharded model's in DCP;
* the own loop's misuse on a sharded module is refused on every rank, and the loop goes on;
* what a sharded run does not do is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fsdp_run_worker as worker
from _fdp_synth import make_tabular
from _launch import run_torchrun
from featuredp.clipping import GhostGradients
from featuredp.noise.sharded import ShardedNoise, flat_layout
from featuredp.step import plain_cross_entropy

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    """Every scenario of the worker, in one launch of 2 ranks."""
    out = tmp_path_factory.mktemp("fsdp_run")
    done = run_torchrun(str(Path(__file__).with_name("fsdp_run_worker.py")), "all", str(out), timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[max(0, text.find("Traceback")) :][:5000]  # the first rank to fail, first
    return out


def _got(ranks: Path, scenario: str) -> dict:
    return torch.load(ranks / f"{scenario}.pt", weights_only=False)


def test_the_sharded_update_is_the_clipped_sum_of_one_process_on_the_union(ranks):
    got = _got(ranks, "sum")
    assert got["sharded"] and got["local"][0][0] < 9  # rank 0 held a shard, not the whole first weight
    data = make_tabular(200, seed=3)
    idx = torch.as_tensor(got["indices"])
    batch = {"x": torch.as_tensor(data.X)[idx], "y": torch.as_tensor(data.y)[idx]}
    sums, _ = GhostGradients().clipped_sum(worker.mlp(), plain_cross_entropy, batch, {}, 0.5)
    assert len(idx) > 20
    for name, before in got["before"].items():
        torch.testing.assert_close(before - got["after"][name], sums[name] / 40, rtol=1e-5, atol=1e-7, msg=name)


def test_the_sharded_noise_is_one_process_draw_under_the_run_key(ranks):
    got = _got(ranks, "noise")
    assert got["keys"][0] == got["keys"][1]
    shapes = {n: v.shape for n, v in got["before"].items()}
    one_process = ShardedNoise(got["keys"][0]).add({n: torch.zeros(s) for n, s in shapes.items()}, 2.0 * 0.5,
                                               layout=flat_layout(shapes))  # fmt: skip
    for name, before in got["before"].items():
        update = (before - got["after"][name]) * 10  # lr 1, divided by the expected batch of 10
        torch.testing.assert_close(update, one_process[name], rtol=1e-5, atol=1e-6, msg=name)
    other = ShardedNoise(bytes(32)).add({n: torch.zeros(s) for n, s in shapes.items()}, 1.0, layout=flat_layout(shapes))
    assert not torch.allclose((got["before"]["0.weight"] - got["after"]["0.weight"]) * 10, other["0.weight"])


def test_no_rank_draws_the_noise_of_a_full_parameter(ranks):
    got = _got(ranks, "alloc")
    assert max(got["none"]) >= got["full"]  # unsharded, rank 0 draws it whole: the measurement sees the noise
    assert max(got["fsdp"]) < 0.65 * got["full"]  # a shard (half) and the stream's whole blocks, never the full shape


@pytest.mark.parametrize("method", ["fdp", "fdp_dpsgd"])
def test_fdp_sharded_is_the_data_parallel_run(ranks, method):
    got = _got(ranks, method)
    start = worker.mlp().state_dict()
    for name, ddp in got["ddp"].items():
        assert not torch.equal(ddp, start[name])
        torch.testing.assert_close(got["fsdp"][name], ddp, rtol=1e-5, atol=1e-6, msg=name)


CASES = [f"{kind}-{method}" for kind in ("cnn", "lm") for method in ("dpsgd", "fdp", "fdp_dpsgd")]


@pytest.mark.parametrize("case", CASES)
def test_the_trainer_on_a_sharded_cnn_and_tied_transformer_is_the_data_parallel_run(ranks, case):
    # The root of the tied transformer holds the embedding, unsharded between its forward and backward: Algorithm
    # 1's public term once read it there and refused (fixed: featuredp.clipping.fsdp.sharded_parameters).
    got = _got(ranks, "fdp_models")[case]
    moved = [name for name, ddp in got["ddp"].items() if not torch.equal(ddp, got["start"][name])]
    assert len(moved) >= len(got["ddp"]) // 2, moved  # the run trained (most parameters moved)
    for name, ddp in got["ddp"].items():
        torch.testing.assert_close(got["fsdp"][name], ddp, rtol=1e-5, atol=1e-6, msg=name)
    outcome, refusal, checks = got["replay"]  # one record moves the release by at most the stated sensitivity
    assert outcome == "passed" and refusal is None, got["replay"]
    assert ("clipped sum sensitivity", True) in checks


def test_opacus_fsdp2_loop_with_ghost_fsdp_is_the_data_parallel_engine(ranks):
    got = _got(ranks, "engine")
    start = worker.mlp().state_dict()
    for name, ddp in got["ddp"].items():
        assert not torch.equal(ddp, start[name.removeprefix("_module.")])
        torch.testing.assert_close(got["fsdp"][name], ddp, rtol=1e-5, atol=1e-6, msg=name)


def test_ghost_fsdp_on_an_unsharded_module_is_refused_in_one_line():
    from torch.utils.data import DataLoader, TensorDataset

    from featuredp import PrivacyEngine

    model = worker.mlp()
    loader = DataLoader(TensorDataset(torch.randn(8, 7), torch.randint(0, 2, (8,))), batch_size=4)
    with pytest.raises(ValueError, match=r"ghost_fsdp.*fully_shard.*grad_sample_mode='ghost'"):
        PrivacyEngine().make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                     data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                                     grad_sample_mode="ghost_fsdp")  # fmt: skip


def _same(a: dict, b: dict) -> None:
    for name, value in a["weights"].items():
        torch.testing.assert_close(b["weights"][name], value, rtol=0, atol=0, msg=name)
    assert len(a["momenta"]) == len(b["momenta"]) > 0
    for x, y in zip(a["momenta"], b["momenta"], strict=True):
        torch.testing.assert_close(y, x, rtol=0, atol=0)


def test_a_sharded_checkpoint_resumes_with_the_weights_the_accounting_and_fresh_keys(ranks):
    got = _got(ranks, "resume")
    assert got["steps"] == 4 and got["epsilon"] == got["whole_epsilon"]
    assert got["rekeyed"]
    _same(got["saved"], got["restored"])  # the weights and momenta of step 2, out of the DCP folder
    assert {"ck.pt", "ck.rank1.pt", "ck.pt.shards"} <= set(got["files"])
    assert len(got["saves"]) == 1 and got["mode"] == 0o700  # the earlier save's folder removed; owner-only
    assert "shards" in got["rank_file_keys"] and "model" not in got["rank_file_keys"]


def test_a_swapped_dcp_metadata_file_is_refused_on_every_rank_before_it_is_unpickled(ranks):
    refusals = _got(ranks, "resume")["swapped"]
    assert len(refusals) == 2 and all("SHA-256" in r and "\n" not in r for r in refusals), refusals


def test_a_save_cut_off_after_dcp_leaves_the_previous_checkpoint_whole(ranks):
    got = _got(ranks, "crash_mid_save")
    assert got["folders_after_crash"] == 2  # the cut-off save's folder, named by no rank file
    for name, value in got["saved"].items():
        torch.testing.assert_close(got["restored"][name], value, rtol=0, atol=0, msg=name)
    assert got["folders_after_next_save"] == 1


@pytest.mark.parametrize("mode", ["ghost", "ghost_fsdp"])
def test_the_own_loop_checkpoint_under_torchrun_restores_each_rank(ranks, mode):
    got = _got(ranks, "engine_checkpoint")[mode]
    _same(got["saved"], got["restored"])
    assert got["extra"] == {"epoch": 7} and got["epsilon"] == got["saved"]["epsilon"]
    assert f"engine-{mode}.rank1.pt" in got["files"]  # each rank's own keys in its own file
    assert (f"engine-{mode}.pt.shards" in got["files"]) == (mode == "ghost_fsdp")


def test_own_loop_checkpoint_misuse_under_torchrun_is_refused_or_harmless(ranks):
    got = _got(ranks, "engine_checkpoint")
    # Saved on rank 0 alone (a common habit): the save returns, rank 0 resumes, rank 1 is refused in one line.
    assert got["lone"][0] == "" and "call save_checkpoint on every rank" in got["lone"][1]
    assert "\n" not in got["lone"][1]
    # A sharded save without the optimizer, loaded with one: the weights restored, the fresh optimizer untouched.
    for name, value in got["ghost_fsdp"]["saved"]["weights"].items():
        torch.testing.assert_close(got["bare"]["weights"][name], value, rtol=0, atol=0, msg=name)
    assert got["bare"]["momenta"] == []


def test_the_replay_self_test_passes_on_sharded_runs_and_catches_a_doubled_sum(ranks):
    got = _got(ranks, "replay")
    for method in ("dpsgd", "fdp", "fdp_dpsgd"):
        outcome, refusal, checks = got[method]
        assert outcome == "passed" and refusal is None, got[method]
        assert ("clipped sum sensitivity", True) in checks and ("noise std requested", True) in checks
    outcome, _, checks = got["doubled"]
    assert outcome == "failed" and ("clipped sum sensitivity", False) in checks


def test_own_loop_misuse_on_a_sharded_module_is_refused_on_every_rank_and_the_loop_goes_on(ranks):
    got = _got(ranks, "misuse")
    patterns = {"reused": "already trained on", "second_step": "already called for this batch",
                "original": "not the private loader's last batch"}  # fmt: skip
    for rank in got["refusals"]:
        for case, pattern in patterns.items():
            assert pattern in rank[case] and "\n" not in rank[case], (case, rank[case])
    assert got["steps"] == 3 and got["moved"]  # the refusals charged nothing; the steps after them trained


def test_what_a_sharded_run_cannot_do_is_refused_in_one_line(ranks):
    got = _got(ranks, "refused")
    assert "strategy='vmap'" in got["vmap"] and "ghost" in got["vmap"]
    assert "bandmf" in got["bandmf"] and "\n" not in got["bandmf"]
    assert "user_key" in got["user"]

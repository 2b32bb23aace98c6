"""Data-parallel FDP-SGD on torch.distributed (gloo, 2 processes on 127.0.0.1), launched with torchrun.

What must hold for a multi-process run to be the *same* mechanism as one process:
the all-reduced clipped sum equals one process's sum over the union of the ranks' batches;
the noise added per step has total std σC (a run that adds it on every rank fails the test);
every record's inclusion frequency is p and the ranks' selections are independent; a step with
an empty local batch completes; the reported ε equals one process's, bit for bit; a killed run
resumes to the same model (with the re-key of a resume off: every state restored); two "nodes" on one
host train together.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from _fdp_synth import make_tabular
from _launch import TEARDOWN_ABORT, free_port
from featuredp import accounting
from featuredp.batches import as_batch, gather
from featuredp.clipping import VmapGradients
from featuredp.distributed import exact_float32
from featuredp.engine import Trainer
from featuredp.features import Columns
from featuredp.models import LogisticRegression

WORKER = Path(__file__).resolve().parent / "distributed_worker.py"
pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


def _torchrun(scenario: str, out: Path, *, nproc: int = 2, nodes: int = 1, expect_ok: bool = True) -> None:
    ok, outputs = _launch(scenario, out, nproc=nproc, nodes=nodes)
    if not ok and expect_ok and any(TEARDOWN_ABORT in o for o in outputs):
        ok, outputs = _launch(scenario, out, nproc=nproc, nodes=nodes)  # a real bug fails again
    assert ok == expect_ok, "\n".join(o[-3000:] for o in outputs)


def _launch(scenario: str, out: Path, *, nproc: int, nodes: int) -> tuple[bool, list[str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    port = free_port()
    common = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={nproc}",
              "--master-addr=127.0.0.1", f"--master-port={port}"]  # fmt: skip
    procs = [
        subprocess.Popen([*common, f"--node-rank={r}", str(WORKER), scenario, str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(nodes)
    ]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return all(p.returncode == 0 for p in procs), outputs


def test_all_reduced_clipped_sum_equals_one_process_on_the_union(tmp_path):
    _torchrun("sum", tmp_path)
    res = torch.load(tmp_path / "sum.pt", weights_only=False)
    idx = np.asarray(res["indices"], dtype=np.int64)
    assert len(set(idx.tolist())) == len(idx)  # disjoint shards
    torch.manual_seed(0)
    model = LogisticRegression(7, 2)
    batch = gather(as_batch(make_tabular(200, seed=3)), idx)

    def loss(m, b, d):
        return torch.nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    sums, _ = VmapGradients().clipped_sum(model, loss, batch, {}, 0.5)
    expected = torch.cat([(p.detach() - sums[n] / 40.0).flatten() for n, p in model.named_parameters()])
    torch.testing.assert_close(res["after"], expected, rtol=1e-5, atol=1e-6)


def _variance_pvalue(z: np.ndarray) -> float:
    chi2, k = float(np.sum(z**2)), z.size
    return 2 * min(stats.chi2.cdf(chi2, k), stats.chi2.sf(chi2, k))


@pytest.mark.statistical
def test_noise_has_total_std_sigma_c_added_once(tmp_path):
    std = 2.0 * 0.5 / 10  # σ·C / m
    _torchrun("noise", tmp_path)
    noise = torch.load(tmp_path / "noise.pt")["noise"].numpy()
    assert noise.size == 1505
    assert _variance_pvalue(noise / std) > 1e-3
    assert stats.kstest(noise / std, "norm").pvalue > 1e-3
    # Power: a run that adds only 1/W of the variance (std σC/√W) is rejected,
    assert _variance_pvalue(noise / (std / math.sqrt(2))) < 1e-6
    # and so is the real broken variant that adds σC on every rank.
    _torchrun("noise-every-rank", tmp_path)
    broken = torch.load(tmp_path / "noise-every-rank.pt")["noise"].numpy()
    assert _variance_pvalue(broken / std) < 1e-6


@pytest.mark.statistical
def test_bandmf_across_ranks_is_cyclic_poisson_of_the_whole_dataset_with_noise_added_once(tmp_path):
    _torchrun("bandmf", tmp_path)
    ranks = [torch.load(tmp_path / f"bandmf{r}.pt") for r in (0, 1)]
    T, n, b, q = 200, 200, 4, 25 * 4 / 200
    steps: dict[int, list[int]] = {}
    for r, batches in enumerate(ranks):
        assert len(batches) == T
        for t, batch in enumerate(batches):
            assert all(r * 100 <= i < (r + 1) * 100 for i in batch)  # each rank samples its own shard only
            for i in batch:
                steps.setdefault(i, []).append(t)
    for s in steps.values():  # one residue class mod b per record: participations at least b apart
        assert len({t % b for t in s}) == 1 and min(np.diff(s), default=b) >= b
    counts = np.array([len(steps.get(i, [])) for i in range(n)])
    z = (counts - T / b * q) / math.sqrt(T / b * q * (1 - q))  # Binomial(T/b, q) per record
    assert _variance_pvalue(z) > 1e-3 and abs(z.mean()) < 4 / math.sqrt(n)
    res = torch.load(tmp_path / "bandmf-noise.pt")
    assert res["same"]  # every rank holds the same model
    noise, std = res["noise"].numpy(), 2.0 * 0.5 / 10  # step 1 of BandMF: w_1 = z_1, std σC/m
    assert noise.size == 1505 and _variance_pvalue(noise / std) > 1e-3
    assert _variance_pvalue(noise / (std * math.sqrt(2))) < 1e-6  # noise added on both ranks would be √2 larger


@pytest.mark.statistical
def test_blt_across_ranks_takes_each_record_once_per_epoch_with_correlated_noise_added_once(tmp_path):
    _torchrun("blt", tmp_path)
    ranks = [torch.load(tmp_path / f"blt{r}.pt") for r in (0, 1)]
    T, n, b = 24, 200, 8  # ⌊200/25⌋ = 8 partitions taken whole (rate 1)
    steps: dict[int, list[int]] = {}
    for r, batches in enumerate(ranks):
        assert len(batches) == T
        for t, batch in enumerate(batches):
            assert all(r * 100 <= i < (r + 1) * 100 for i in batch)
            for i in batch:
                steps.setdefault(i, []).append(t)
    assert sorted(steps) == list(range(n))  # every record of both shards, ...
    for s in steps.values():  # ... once per epoch, always in the same class mod b
        assert len({t % b for t in s}) == 1 and len(s) == T // b and set(np.diff(s)) == {b}
    res = torch.load(tmp_path / "blt-noise.pt")
    assert res["same"]
    w1, w2 = (u.numpy() / (2.0 * 0.5 / 10) for u in res["updates"])  # in units of σC/m
    omega = np.array(res["params"]).reshape(2, -1)[1]
    c1 = float(omega.sum())  # C's first off-diagonal: w_2 = z_2 − c_1·w_1
    assert c1 > 0.05 and w1.size == 1505
    assert _variance_pvalue(w1) > 1e-3 and _variance_pvalue(w2 + c1 * w1) > 1e-3  # z_1, z_2: N(0, 1) each
    assert _variance_pvalue(w1 / math.sqrt(2)) < 1e-6  # noise added on both ranks would be √2 larger
    assert _variance_pvalue(w2) < 1e-6 or c1 < 0.1  # independent noise (no buffers) would pass here instead


@pytest.mark.statistical
def test_every_record_is_included_at_rate_p_and_ranks_are_independent(tmp_path):
    _torchrun("inclusion", tmp_path)
    ranks = [torch.load(tmp_path / f"inclusion{r}.pt") for r in (0, 1)]
    T, n, p = 300, 200, 50 / 200
    counts = np.zeros(n)
    for r, batches in enumerate(ranks):
        assert len(batches) == T
        lo, hi = r * n // 2, (r + 1) * n // 2
        for b in batches:
            assert all(lo <= i < hi for i in b)  # each rank samples its own shard only
            counts[b] += 1
    # Per-record inclusion ~ Binomial(T, p): a chi-square test over all records.
    z = (counts - T * p) / math.sqrt(T * p * (1 - p))
    assert _variance_pvalue(z) > 1e-3 and abs(z.mean()) < 4 / math.sqrt(n)
    sizes = [np.array([len(b) for b in batches], dtype=float) for batches in ranks]
    assert abs(np.corrcoef(sizes[0], sizes[1])[0, 1]) < 4 / math.sqrt(T)  # independent streams
    assert not all(np.array_equal(np.array(a) - 100, np.array(b)) for a, b in zip(ranks[1], ranks[0]))


def test_steps_with_empty_local_batches_complete(tmp_path):
    _torchrun("empty", tmp_path)
    res = json.loads((tmp_path / "empty.json").read_text())
    assert res["steps"] == 30 and min(res["empty"]) > 0  # both ranks met empty batches and kept going


def test_reported_epsilon_equals_one_process_bit_for_bit(tmp_path):
    _torchrun("epsilon", tmp_path)
    res = json.loads((tmp_path / "epsilon.json").read_text())
    assert res["steps"] == 17
    assert res["epsilon"] == accounting.epsilon_for(1.3, 0.1, 17, 1e-4)
    one = Trainer(LogisticRegression(7, 2), "fdp", feature_map=Columns(["sex", "race"]), steps=17, batch_size=20,
                  noise_multiplier=1.3, delta=1e-4, progress=False).fit(make_tabular(200, seed=3))  # fmt: skip
    assert res["epsilon"] == one.epsilon


def test_killed_run_resumes_to_the_same_model_and_other_world_sizes_are_refused(tmp_path):
    _torchrun("whole", tmp_path)
    _torchrun("crash", tmp_path, expect_ok=False)
    assert (tmp_path / "ck.pt").exists() and not (tmp_path / "resume.pt").exists()
    # Each rank wrote its own file, owner-readable only, holding its own streams and no other rank's.
    files = [tmp_path / "ck.pt", tmp_path / "ck.rank1.pt"]
    cks = [torch.load(f, weights_only=True) for f in files]
    assert [(c["world_size"], c["rank"], c["state"]["step"]) for c in cks] == [(2, 0, 5), (2, 1, 5)]
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert all("ranks" not in c for c in cks)
    noise = [c["state"]["noise"] for c in cks]
    assert not torch.equal(noise[0]["torch"], noise[1]["torch"])  # the ranks' noise keys differ, and each file
    flat = [repr(c) for c in cks]  # holds only its own rank's state
    assert repr(cks[1]["state"]["streams"]) not in flat[0] and repr(cks[0]["state"]["streams"]) not in flat[1]
    _torchrun("resume", tmp_path)
    assert torch.equal(torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resume.pt"))
    t = Trainer(LogisticRegression(7, 2), "fdp", feature_map=Columns(["sex", "race"]), steps=12, batch_size=20,
                noise_multiplier=1.0, delta=1e-4, seed=11, public_seed=2, progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="2 process"):
        t.fit(make_tabular(200, seed=3), checkpoint=tmp_path / "ck.pt", resume=True)


@pytest.mark.parametrize(("scenario", "field"), [("disagree-n", "dataset_size"), ("disagree-c", "max_grad_norm")])
def test_ranks_with_other_data_or_settings_are_refused_on_every_rank(tmp_path, scenario, field):
    # Today's attack: rank 1 holds a shorter copy of the data (samples at p = 20/160 while rank 0 reports ε for
    # p = 20/200), or clips at 10 C: without the check both train and rank 0 reports a false ε.
    _torchrun(scenario, tmp_path)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"{scenario}{rank}.json").read_text())
        assert field in got["refused"] and "do not run the same plan" in got["refused"], got
        assert got["unchanged"]  # refused before any step


def test_ranks_loading_only_their_shard_train_the_same_model(tmp_path):
    # With the same seeds, a rank that holds only its row range samples exactly the records it samples
    # when it holds the whole data: the models are equal, and a wrong dataset_size is refused on every rank.
    _torchrun("shards", tmp_path)
    got = torch.load(tmp_path / "shards.pt", weights_only=False)
    assert torch.equal(got["whole"], got["sharded"])
    assert "dataset_size=199" in got["refused"] and "200 records" in got["refused"]


def test_two_nodes_on_one_host(tmp_path):
    _torchrun("epsilon", tmp_path, nproc=1, nodes=2)
    assert json.loads((tmp_path / "epsilon.json").read_text())["epsilon"] == accounting.epsilon_for(
        1.3, 0.1, 17, 1e-4)


def test_a_shard_is_refused_when_empty_or_when_the_declared_size_is_wrong():
    from featuredp.engine import Trainer
    from featuredp.models import LogisticRegression

    def trainer(n: int) -> Trainer:
        return Trainer(LogisticRegression(7, 2), "dpsgd", steps=1, batch_size=4, noise_multiplier=1.0, delta=1e-4,
                       dataset_size=n, progress=False)  # fmt: skip

    data = make_tabular(50, seed=3)
    whole = {"x": torch.as_tensor(data.X), "y": torch.as_tensor(data.y)}
    with pytest.raises(ValueError, match="empty shard"):
        trainer(50).fit({k: v[:0] for k, v in whole.items()}, sharded=True)
    with pytest.raises(ValueError, match="dataset_size=60 was declared but the ranks' shards hold 50"):
        trainer(60).fit(whole, sharded=True)
    with pytest.raises(ValueError, match="needs dataset_size"):
        Trainer(LogisticRegression(7, 2), "dpsgd", steps=1, batch_size=4, noise_multiplier=1.0, delta=1e-4,
                progress=False).fit(whole, sharded=True)  # fmt: skip
    assert trainer(50).fit(whole, sharded=True).steps == 1  # one process holding the whole "shard"


def test_a_group_featuredp_creates_is_destroyed_at_exit(monkeypatch):
    # Exiting with a live gloo group can abort the process at teardown (seen in CI): the group that
    # context() initialises must be destroyed by an exit handler, and only while it is still alive.
    import torch.distributed as dist

    from featuredp import distributed

    handlers, destroyed, alive = [], [], [False]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(distributed.atexit, "register", handlers.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: alive[0])
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: alive.__setitem__(0, True))
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "destroy_process_group", lambda: (destroyed.append(1), alive.__setitem__(0, False)))
    ctx = distributed.context(torch.device("cpu"))
    assert ctx is not None and ctx.world_size == 2 and len(handlers) == 1
    handlers[0]()
    assert destroyed == [1]
    handlers[0]()  # already destroyed (by the user or the first call): nothing more
    assert destroyed == [1]
    alive[0] = True  # a group the user initialised is not ours: no handler
    assert distributed.context(torch.device("cpu")) is not None and len(handlers) == 1


def test_exact_float32_turns_tf32_and_nondeterministic_kernels_off_on_cuda_and_restores_them():
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark)
    try:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = True, True, False, True
        with exact_float32(torch.device("cpu")):  # the CPU has no TF32: nothing to change
            assert cudnn.allow_tf32 and not cudnn.deterministic
        with exact_float32(torch.device("cuda")):  # the flags are Python state: settable without a GPU
            assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark) == (False, False, True,
                                                                                                   False)
        assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark) == (True, True, False, True)
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = before

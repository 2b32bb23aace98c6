"""BandMF correlated noise through the Trainer and ``featuredp train`` (issue 27).

Each test is written against the wiring: that the private sampler is the cyclic Poisson sampler, that the noise the
engine adds is C⁻¹z over the run's own source, that ε, the plan, the guarantee and the ledger are BandMF's, and
that its secret state (the partition, the noise history) survives a resume bit for bit.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as nnf

from _fdp_synth import LinearSplit, ZeroSplit, make_tabular, record_cyclic, record_noise
from featuredp import accounting, run_state, sampling
from featuredp.accounting import BudgetLedger
from featuredp.cli import main
from featuredp.engine import Trainer
from featuredp.experiments.runs import save_run
from featuredp.features import Columns, LabelPrivate
from featuredp.models import LogisticRegression
from featuredp.noise import bandmf


def _model(init: int = 1, d: int = 7, k: int = 2) -> LogisticRegression:
    torch.manual_seed(init)
    return LogisticRegression(d, k)


def _fdp(model, **kw):
    args = dict(feature_map=Columns(["sex", "race"]), steps=16, batch_size=20, noise_multiplier=1.0,
                max_grad_norm=1.0, delta=1e-4, progress=False)  # fmt: skip
    args.update(kw)
    return Trainer(model, "fdp", **args)


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------------------
# Reductions: σ = 0, C = ∞ is plain SGD on the cyclic batches; b = 1 is the independent run, bit for bit
# ---------------------------------------------------------------------------------------------------------
def test_sigma_zero_without_clipping_is_plain_sgd_on_the_cyclic_poisson_batches(monkeypatch):
    data = make_tabular(200, seed=1)
    rec = record_cyclic(monkeypatch)
    base = _model(0)
    model = copy.deepcopy(base)
    res = Trainer(model, "dpsgd", steps=16, batch_size=20, noise_multiplier=0.0, max_grad_norm=math.inf, lr=0.1,
                  momentum=0.9, noise="bandmf", bands=4, seed=3, progress=False).fit(data)  # fmt: skip
    assert res.plan.noise.kind == "bandmf" and res.plan.bands == 4 and len(rec) == 16
    # The sampler the run used is the b-min-separated one: a record only ever joins steps of one class mod b.
    classes: dict[int, set[int]] = {}
    for t, idx in enumerate(rec):
        for i in idx:
            classes.setdefault(int(i), set()).add(t % 4)
    assert classes and all(len(c) == 1 for c in classes.values())
    ref = copy.deepcopy(base)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    for idx in rec:
        i = torch.as_tensor(idx)
        loss = nnf.cross_entropy(ref(X[i]), y[i], reduction="sum") / 20  # the EXPECTED batch, as for DP-SGD
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("secure_rng", [False, True], ids=["torch", "secure"])
@pytest.mark.parametrize("budget", [{"noise_multiplier": 1.0}, {"noise_multiplier": None, "target_epsilon": 3.0}],
                         ids=["sigma", "target"])  # fmt: skip
def test_one_band_is_the_independent_run_bit_for_bit(secure_rng, budget):
    data = make_tabular(200, seed=2)
    a = _fdp(_model(), seed=5, secure_rng=secure_rng, **budget)
    ra = a.fit(data)
    b = _fdp(_model(), seed=5, secure_rng=secure_rng, noise="bandmf", bands=1, **budget)
    rb = b.fit(data)
    assert rb.plan.noise.kind == "bandmf" and rb.plan.noise_coeffs == (1.0,)
    assert rb.plan.noise_multiplier == ra.plan.noise_multiplier and rb.epsilon == ra.epsilon
    assert _same(a.model.state_dict(), b.model.state_dict())
    # Teeth: two bands on the same seed are another run.
    c = _fdp(_model(), seed=5, secure_rng=secure_rng, noise="bandmf", bands=2, **budget)
    c.fit(data)
    assert not _same(a.model.state_dict(), c.model.state_dict())


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: the partition and the noise history are private state; restored exactly on resume
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("secure_rng", [False, True], ids=["torch", "secure"])
def test_resume_equals_uninterrupted(tmp_path, secure_rng, keys_kept_on_resume):
    # the partition and the buffers restored exactly (the re-key of the fresh normals is off: it would redraw them)
    data = make_tabular(240, seed=8)

    def make(**kw):
        args = dict(seed=9, secure_rng=secure_rng, steps=14, noise="bandmf", bands=4, pretrain_epochs=0.2,
                    averaging="uniform")  # fmt: skip
        args.update(kw)
        return _fdp(_model(), **args)

    a = make()
    ra = a.fit(data)
    b = make()
    rb = b.fit(data, checkpoint=tmp_path / "ck.pt", max_steps=9)  # mid-round: the history matters
    assert rb.stopped_early
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    assert len(ck["private_sampler"]["partitions"]) == 4 and ck["noise"]["history"].shape[0] == 3
    c = make()
    rc = c.fit(data, checkpoint=tmp_path / "ck.pt", resume=True)
    assert rc.epsilon == ra.epsilon and rc.steps == ra.steps and rc.history == ra.history
    assert _same(a.model.state_dict(), c.model.state_dict())
    # A resume that lost the history (or the partition) is another run: the test has teeth.
    lost = make()
    ck_lost = dict(ck, noise={**ck["noise"], "history": torch.zeros_like(ck["noise"]["history"])})
    torch.save(ck_lost, tmp_path / "lost.pt")
    lost.fit(data, checkpoint=tmp_path / "lost.pt", resume=True)
    assert not _same(a.model.state_dict(), lost.model.state_dict())


def test_resume_with_other_noise_or_bands_is_refused(tmp_path):
    data = make_tabular(200, seed=3)
    _fdp(_model(), noise="bandmf", bands=4).fit(data, checkpoint=tmp_path / "b4.pt", max_steps=5)
    for kw in ({"noise": "bandmf", "bands": 2}, {}):
        with pytest.raises(ValueError, match=r"noise='bandmf' with bands=4.*resume with the same noise and bands"):
            _fdp(_model(), **kw).fit(data, checkpoint=tmp_path / "b4.pt", resume=True)
    _fdp(_model()).fit(data, checkpoint=tmp_path / "ind.pt", max_steps=5)
    with pytest.raises(ValueError, match=r"noise='independent' with bands=None"):
        _fdp(_model(), noise="bandmf", bands=4).fit(data, checkpoint=tmp_path / "ind.pt", resume=True)


# ---------------------------------------------------------------------------------------------------------
# Accounting: ε, calibration, budget stop, ledger, plan and guarantee are BandMF's
# ---------------------------------------------------------------------------------------------------------
def test_reported_epsilon_is_bandmf_epsilon_for_the_plan_and_the_ledger_records_it(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, total_epsilon=100.0, delta=1e-4)
    data = make_tabular(300, seed=5)
    t = _fdp(_model(), steps=24, batch_size=30, noise_multiplier=1.3, noise="bandmf", bands=4, ledger=path, seed=0)
    res = t.fit(data)
    coeffs = bandmf.banded_toeplitz_strategy(24, 4, momentum=0.9)  # SGD momentum 0.9: its workload
    assert res.plan.noise_coeffs == tuple(coeffs) and coeffs[1] != 0
    assert res.epsilon == bandmf.bandmf_epsilon(1.3, 30, 300, 24, 4, coeffs, 1e-4)
    assert res.epsilon != accounting.epsilon_for(1.3, 0.1, 24, 1e-4)  # not DP-SGD's (σ, p, T)
    assert res.history[-1]["epsilon"] == res.epsilon
    assert ledger.spent() == pytest.approx(res.epsilon, rel=1e-9)
    assert "noise bandmf" in res.guarantee and "4 bands" in res.guarantee and "24 private steps" in res.guarantee
    report = res.privacy_report
    assert report["correlated_noise"]["bands"] == 4 and report["correlated_noise"]["rounds"] == 6
    assert report["noise_sampler"]["delta_added"] < 1e-20 and "BandMF" in report["noise_sampler"]["transform"]
    save_run(tmp_path / "run", t, res, model_spec={"kind": "logreg"})
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["config"]["noise"] == "bandmf" and info["config"]["bands"] == 4
    assert info["plan"]["noise"]["kind"] == "bandmf" and info["plan"]["noise"].get("bands") == 4
    assert "noise bandmf" in info["result"]["guarantee"]


def test_adam_uses_the_prefix_sum_workload():
    t = Trainer(_model(), "dpsgd", steps=24, batch_size=30, noise_multiplier=1.0, optimizer="adam", noise="bandmf",
                bands=4, progress=False)  # fmt: skip
    assert t.make_plan(300).noise_coeffs == tuple(bandmf.banded_toeplitz_strategy(24, 4))


@pytest.mark.parametrize("target", [1.0, 4.0])
def test_target_epsilon_calibrates_sigma_and_never_overshoots(target):
    data = make_tabular(300, seed=5)
    res = Trainer(_model(), "dpsgd", epochs=2, batch_size=30, target_epsilon=target, delta=1e-4, noise="bandmf",
                  bands=2, seed=0, progress=False).fit(data)  # fmt: skip
    coeffs = bandmf.banded_toeplitz_strategy(20, 2, momentum=0.9)
    assert res.steps == 20 and not res.stopped_early
    assert res.plan.noise_multiplier == bandmf.calibrate_bandmf_noise(target, 1e-4, 30, 300, 20, 2, coeffs)
    assert 0.99 * target <= res.epsilon <= target
    assert res.epsilon == bandmf.bandmf_epsilon(res.plan.noise_multiplier, 30, 300, 20, 2, coeffs, 1e-4)


def test_budget_stop_ends_on_a_whole_round_within_the_target():
    data = make_tabular(300, seed=5)
    res = _fdp(_model(), steps=400, batch_size=10, noise_multiplier=2.0, target_epsilon=3.0, noise="bandmf",
               bands=4).fit(data)  # fmt: skip
    c = res.plan.noise_coeffs
    assert res.stop_reason == "budget" and 0 < res.steps < 400 and res.steps % 4 == 0
    assert res.epsilon <= 3.0 and res.epsilon == bandmf.bandmf_epsilon(2.0, 10, 300, res.steps, 4, c, 1e-4)
    assert bandmf.bandmf_epsilon(2.0, 10, 300, res.steps + 1, 4, c, 1e-4) > 3.0  # one more step would overshoot


def test_bands_default_to_the_least_noise_at_the_target_or_eight():
    chosen = _fdp(_model(), steps=40, noise_multiplier=None, target_epsilon=2.0, noise="bandmf").make_plan(400)
    fits = [b for b in bandmf.BAND_CHOICES if b <= 20]  # m·b <= n: b <= 400/20
    best = bandmf.best_bands(2.0, 1e-4, 400, 20, 40, choices=fits, momentum=0.9, tolerance=0.01)[0]
    assert chosen.bands == best
    assert _fdp(_model(), steps=40, noise="bandmf").make_plan(400).bands == 8
    assert _fdp(_model(), steps=5, noise="bandmf").make_plan(400).bands == 5  # lowered to what fits


def test_ledger_segments_of_a_resumed_run_never_add_up_to_less(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, total_epsilon=100.0, delta=1e-4)
    data = make_tabular(200, seed=3)
    t = _fdp(_model(), steps=22, noise="bandmf", bands=4, ledger=path)
    # A first segment shorter than b, then 5 whole rounds: 6 rounds as the whole run has, but the first one's own
    # event would take the column norm of its 2 steps only, and the two would add up to less than the run.
    t.fit(data, max_steps=2)
    t.fit(data)
    res = t.result
    assert res is not None and res.steps == 22
    assert ledger.spent() >= res.epsilon * (1 - 1e-9)


# ---------------------------------------------------------------------------------------------------------
# Refusals, up front and in one line
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "method", "needle"), [
    ({"noise": "gaussian"}, "dpsgd", "noise must be one of 'independent', 'bandmf', 'blt'; got 'gaussian'"),
    ({"noise": "bandmf", "bands": 0}, "dpsgd", "bands must be >= 1, got 0"),
    ({"bands": 4}, "dpsgd", "bands is for noise='bandmf', got bands=4 with noise='independent'"),
    ({"noise": "bandmf", "bands": 4}, "nonprivate", "noise='bandmf' is for the private methods"),
    ({"noise": "bandmf", "bands": 4}, "public", "noise='bandmf' is for the private methods"),
])  # fmt: skip
def test_bad_settings_are_refused_at_construction(kw, method, needle):
    extra = {"feature_map": Columns(["sex"])} if method == "public" else {}
    with pytest.raises(ValueError) as err:
        Trainer(_model(), method, steps=10, batch_size=20, progress=False, **extra, **kw)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("kw", "needle"), [
    ({"bands": 11}, "bands must be <= the run's 10 private steps, got bands=11"),
    ({"bands": 8, "batch_size": 50}, "bands=8 is too many for batch_size 50 and 200 records"),
])  # fmt: skip
def test_bands_that_do_not_fit_the_run_are_refused_before_training(kw, needle):
    args = {"steps": 10, "batch_size": 20, **kw}
    t = Trainer(_model(), "dpsgd", noise_multiplier=1.0, noise="bandmf", progress=False, **args)
    with pytest.raises(ValueError) as err:
        t.fit(make_tabular(200, seed=0))
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert t.run.state is None  # nothing ran


# ---------------------------------------------------------------------------------------------------------
# The FDP replay: D vs D plus one record, the same secret randomness
# ---------------------------------------------------------------------------------------------------------
def test_replay_neighbours_differ_only_through_the_strategys_sensitivity(monkeypatch):
    n, d, T, b, m, lr, beta, clip = 60, 5, 12, 3, 6, 0.05, 0.5, 1.0
    extra_steps = (1, 1 + b, 1 + 2 * b)  # the extra record's participations: one class mod b, b apart
    gen = torch.Generator().manual_seed(0)
    base = {"x": torch.randn(n, d, generator=gen), "y": torch.randint(0, 2, (n,), generator=gen)}
    record = {"x": 3 * torch.ones(1, d), "y": torch.zeros(1, dtype=torch.long)}  # its gradient is clipped
    plus = {k: torch.cat([base[k], record[k]]) for k in base}

    class Replay(sampling.BMinSepSampler):
        """The cyclic sampler of D in both runs (same secret partition and coins); D + x adds x at its steps."""

        def __init__(self, dataset_size, expected_batch, bands, generator, **kw):
            super().__init__(n, expected_batch, bands, generator)  # D's rate m·b/n in both runs: the same coins
            self.with_record = dataset_size > n

        def sample(self):
            t = self._step
            idx = super().sample()
            return np.append(idx, n) if self.with_record and t in extra_steps else idx

    monkeypatch.setattr(sampling, "BMinSepSampler", Replay)
    sums, noises = record_noise(monkeypatch, bandmf.BandedNoise)

    def run(data):
        model = _model(2, d, 2)
        t = Trainer(model, "dpsgd", loss_split=LinearSplit(LabelPrivate()), steps=T, batch_size=m, lr=lr,
                    momentum=beta, noise_multiplier=1.0, max_grad_norm=clip, noise="bandmf", bands=b, seed=4,
                    strategy="vmap", progress=False)  # fmt: skip
        t.fit(data)
        start = len(sums) - T
        return model, torch.stack(sums[start:]), torch.stack(noises[start:]), t.plan

    model_d, x_d, w_d, plan = run(base)
    model_p, x_p, w_p, _ = run(plus)
    # 1. The noise is the same draw in both runs: its difference is exactly zero.
    assert torch.equal(w_d, w_p)
    # 2. The gradient sums differ by the extra record's clipped gradient at its steps, and by nothing elsewhere.
    probe = _model(2, d, 2)
    loss = LinearSplit(LabelPrivate()).loss(probe, record, {}).sum()
    g = torch.cat([v.reshape(-1) for v in torch.autograd.grad(loss, list(probe.parameters()))]).double()
    g = g * min(1.0, clip / float(g.norm()))
    assert float(g.norm()) == pytest.approx(clip)
    expected = torch.zeros_like(x_d)
    for t in extra_steps:
        expected[t] = g
    torch.testing.assert_close(x_p - x_d, expected, rtol=0, atol=1e-5)
    # 3. What the mechanism releases is C x + z: the neighbours' releases differ by C (x' − x), whose norm is
    #    exactly sqrt(k)·(max column norm of C)·clip, the sensitivity the accountant uses (disjoint supports).
    C = torch.from_numpy(bandmf.strategy_matrix(plan.noise_coeffs, T))
    released_d = C @ (x_d + w_d)
    released_p = C @ (x_p + w_p)
    diff = released_p - released_d
    sens = bandmf.sensitivity(plan.noise_coeffs, T)
    assert float(diff.norm()) == pytest.approx(math.sqrt(len(extra_steps)) * sens * clip, rel=1e-5)
    # 4. The models differ by the clipped gradient carried through the workload (SGD momentum β), over m.
    a = bandmf.workload_coefficients(T, beta)
    shift = sum(a[T - 1 - t] for t in extra_steps) * g * (lr / m)
    got = torch.cat([(q - p).reshape(-1) for p, q in zip(model_d.parameters(), model_p.parameters())]).double()
    torch.testing.assert_close(got, -shift, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# The noise the Trainer adds over a run has the factorization's covariance (with power)
# ---------------------------------------------------------------------------------------------------------
def _engine_noise(noise: str, T: int, bands: int | None) -> tuple[np.ndarray, tuple[float, ...] | None]:
    """The per-step noise the engine added (in units of σC), one row per step, one column per coordinate."""
    d, k, m, sigma, clip = 4000, 10, 4, 2.0, 0.5
    data = {"x": torch.zeros(40, d), "y": torch.zeros(40, dtype=torch.long)}
    model = _model(3, d, k)
    snaps = [torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])]

    def snap(step, shown):
        snaps.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))

    kw = {"noise": noise} if noise == "independent" else {"noise": noise, "bands": bands}
    t = Trainer(model, "dpsgd", loss_split=ZeroSplit(LabelPrivate()), steps=T, batch_size=m, noise_multiplier=sigma,
                max_grad_norm=clip, lr=1.0, momentum=0.0, log_points=T, seed=13, progress=False, **kw)  # fmt: skip
    t.fit(data, callback=snap)
    steps = torch.stack(snaps).double().diff(dim=0)  # θ_t − θ_{t−1} = −σC·w_t / m
    assert steps.shape[0] == T
    return (-steps * m / (sigma * clip)).numpy(), t.plan.noise_coeffs if t.plan else None


@pytest.mark.statistical
def test_noise_the_trainer_adds_has_the_factorization_covariance_and_independent_noise_does_not():
    T = 6
    W, coeffs = _engine_noise("bandmf", T, 3)
    assert coeffs is not None and coeffs[1] != 0
    dim = W.shape[1]
    Cinv = np.linalg.inv(bandmf.strategy_matrix(coeffs, T))
    sigma = Cinv @ Cinv.T
    se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / dim)

    def fits(samples: np.ndarray) -> bool:
        return bool(np.all(np.abs(samples @ samples.T / dim - sigma) < 5 * se))

    assert fits(W)
    # Power: the engine's independent noise at the same σ does not have this covariance.
    independent, _ = _engine_noise("independent", T, None)
    assert not fits(independent)
    assert np.abs(sigma - np.diag(np.diag(sigma))).max() > 20 * se.max()


# ---------------------------------------------------------------------------------------------------------
# Data-parallel runs: each rank assigns and samples its own shard at the whole dataset's rate
# ---------------------------------------------------------------------------------------------------------
def test_each_ranks_sampler_covers_its_shard_at_the_whole_datasets_rate():
    t = _fdp(_model(), noise="bandmf", bands=2)
    plan = t.make_plan(200)
    samplers = [run_state.RunState.start(plan, {"data": "", "psi": ""}, params=list(t.model.parameters()),
                                         privacy=t.privacy, schedule=t.schedule, device=torch.device("cpu"), rank=r,
                                         world_size=2).private_sampler for r in (0, 1)]  # fmt: skip
    q = plan.expected_batch_size * 2 / 200
    for r, s in enumerate(samplers):
        assert isinstance(s, sampling.BMinSepSampler) and s.sampling_rate == pytest.approx(q)
        assert s.offset == 100 * r and s.dataset_size == 100 and s.expected_batch_size == plan.expected_batch_size
        for _ in range(6):
            idx = s.sample()
            assert np.all((idx >= 100 * r) & (idx < 100 * (r + 1)))


# ---------------------------------------------------------------------------------------------------------
# featuredp train --noise bandmf --bands B
# ---------------------------------------------------------------------------------------------------------
_TINY = ["train", "--method", "fdp", "--epsilon", "2", "--epochs", "0.05", "--pretrain-epochs", "0",
         "--model", "logreg", "--no-baselines", "--quiet"]  # fmt: skip


def test_train_bandmf_end_to_end_names_noise_and_bands(capsys, tmp_path):
    run = tmp_path / "run"
    assert main([*_TINY, "--noise", "bandmf", "--bands", "2", "--out", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["noise"] == "bandmf" and out["bands"] == 2 and 0 < out["epsilon"] <= 2.0
    assert "noise bandmf" in out["guarantee"] and "2 bands" in out["guarantee"]
    info = json.loads((run / "run.json").read_text())
    assert info["config"]["noise"] == "bandmf" and info["config"]["bands"] == 2
    assert info["plan"]["noise"]["kind"] == "bandmf" and info["plan"]["noise"].get("bands") == 2
    assert main([*_TINY, "--noise", "bandmf", "--bands", "2"]) == 0
    text = capsys.readouterr().out
    assert "bandmf, 2 bands" in text


@pytest.mark.parametrize(("extra", "needle"), [
    (["--noise", "bandmf", "--bands", "0"], "--bands must be >= 1, got 0"),
    (["--bands", "4"], "--bands is for --noise bandmf"),
    (["--noise", "bandmf", "--method", "nonprivate"], "--noise bandmf is for the private methods"),
    (["--noise", "bandmf", "--bands", "100000"], "--bands must be <= the run's"),
])  # fmt: skip
def test_train_bad_bands_exit_2_in_one_line(extra, needle, capsys):
    assert main([*_TINY, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_check_model_replays_a_bandmf_step():
    from featuredp.testing import verdict

    t = _fdp(_model(), noise="bandmf", bands=4)
    reports = t.check_model(make_tabular(200, seed=1), records=2)
    assert all(c.ok for r in reports for c in r.checks) and verdict(reports).startswith("safe")

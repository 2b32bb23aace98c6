"""BLT correlated noise through the Trainer (issue 27).

Written against the wiring: the private sampler is the cyclic one over ⌊n/m⌋ secret partitions (a record once per
epoch), the noise the engine adds is C⁻¹z of the run's own source for the plan's BLT, ε, the plan, the guarantee
and the ledger are BLT's single Gaussian at the min-sep sensitivity, and the secret state (partition, buffers)
survives a resume bit for bit. The replay test runs D and D plus one record on the same secret randomness.
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
from featuredp import accounting, sampling
from featuredp.accounting import BudgetLedger
from featuredp.engine import Trainer
from featuredp.errors import UnreachableTargetError
from featuredp.experiments.runs import save_run
from featuredp.features import Columns, LabelPrivate
from featuredp.models import LogisticRegression
from featuredp.noise import bandmf, blt


def _model(init: int = 1, d: int = 7, k: int = 2) -> LogisticRegression:
    torch.manual_seed(init)
    return LogisticRegression(d, k)


def _fdp(model, **kw):
    args = dict(feature_map=Columns(["sex", "race"]), steps=24, batch_size=40, noise_multiplier=1.0,
                max_grad_norm=1.0, delta=1e-4, progress=False, noise="blt")  # fmt: skip
    args.update(kw)
    return Trainer(model, "fdp", **args)


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def _dense(c) -> np.ndarray:
    c = np.asarray(c)
    return np.array([[c[i - j] if i >= j else 0.0 for j in range(c.size)] for i in range(c.size)])


def test_sigma_zero_without_clipping_is_plain_sgd_on_the_epochs_of_secret_partitions(monkeypatch):
    data = make_tabular(200, seed=1)
    rec = record_cyclic(monkeypatch)
    base = _model(0)
    model = copy.deepcopy(base)
    res = Trainer(model, "dpsgd", steps=25, batch_size=20, noise_multiplier=0.0, max_grad_norm=math.inf, lr=0.1,
                  momentum=0.9, noise="blt", seed=3, progress=False).fit(data)  # fmt: skip
    assert res.plan.noise.kind == "blt" and res.plan.bands is None and len(rec) == 25
    # b = ⌊200/20⌋ = 10 partitions taken whole (rate m·b/n = 1): each record once per epoch, in one class mod 10.
    seen: dict[int, list[int]] = {}
    for t, idx in enumerate(rec):
        for i in idx:
            seen.setdefault(int(i), []).append(t)
    assert sorted(seen) == list(range(200))
    assert all(len({t % 10 for t in ts}) == 1 and len(ts) == len(range(ts[0], 25, 10)) for ts in seen.values())
    ref = copy.deepcopy(base)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    for idx in rec:
        i = torch.as_tensor(idx)
        loss = nnf.cross_entropy(ref(X[i]), y[i], reduction="sum") / 20  # the EXPECTED batch
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_reported_epsilon_is_the_single_gaussian_at_the_minsep_sensitivity(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, total_epsilon=1000.0, delta=1e-4)
    data = make_tabular(300, seed=5)
    t = _fdp(_model(), steps=24, batch_size=30, noise_multiplier=4.0, ledger=path, seed=0)
    res = t.fit(data)
    theta, omega = blt.optimize_blt(24, 10, momentum=0.9)  # b = ⌊300/30⌋ = 10, SGD momentum 0.9's workload
    assert res.plan.noise_coeffs == tuple(np.concatenate((theta, omega))) and theta.size >= 1
    sens = blt.minsep_sensitivity(blt.blt_coefficients(theta, omega, 24), 24, 10)  # k = 3 participations
    assert sens > float(np.linalg.norm(blt.blt_coefficients(theta, omega, 24))) * 1.2
    assert res.epsilon == accounting.compute_epsilon(accounting.events.gaussian_event(4.0 / sens), 1e-4)
    assert res.epsilon != accounting.epsilon_for(4.0, 0.1, 24, 1e-4)  # not DP-SGD's amplified (σ, p, T)
    assert res.history[-1]["epsilon"] == res.epsilon
    assert ledger.spent() == pytest.approx(res.epsilon, rel=1e-9)
    assert "noise blt" in res.guarantee and "no amplification" in res.guarantee
    block = res.privacy_report["correlated_noise"]
    assert block["noise"] == "blt" and block["min_separation"] == 10 and block["participations"] == 3
    assert block["sensitivity"] == sens and block["buf_decay"] == theta.tolist()
    assert "BLT" in res.privacy_report["noise_sampler"]["transform"]
    assert res.plan.dpsgd_terms(24) == (4.0 / sens, 1.0, 1)
    save_run(tmp_path / "run", t, res, model_spec={"kind": "logreg"})
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["config"]["noise"] == "blt" and info["plan"]["noise"]["kind"] == "blt"
    assert "noise blt" in info["result"]["guarantee"]


@pytest.mark.parametrize("target", [0.7, 3.0])
def test_target_epsilon_calibrates_sigma_and_never_overshoots(target):
    res = _fdp(_model(), noise_multiplier=None, target_epsilon=target).fit(make_tabular(300, seed=2))
    assert 0.99 * target <= res.epsilon <= target and res.steps == 24


def test_given_sigma_with_a_target_stops_at_the_last_step_within_it():
    data = make_tabular(300, seed=2)
    plan = _fdp(_model(), noise_multiplier=3.0, target_epsilon=2.0).make_plan(300)
    budget = plan.budget_steps
    assert budget is not None and 1 <= budget < 24
    assert plan.epsilon(budget) <= 2.0 < plan.epsilon(budget + 1)
    res = _fdp(_model(), noise_multiplier=3.0, target_epsilon=2.0).fit(data)
    assert res.steps == budget and res.epsilon <= 2.0
    with pytest.raises(UnreachableTargetError, match="not reachable with noise='blt'"):
        _fdp(_model(), noise_multiplier=0.05, target_epsilon=0.1).make_plan(300)


@pytest.mark.parametrize("secure_rng", [False, True], ids=["torch", "secure"])
def test_resume_equals_uninterrupted(tmp_path, secure_rng, keys_kept_on_resume):
    # the partition and the buffers restored exactly (the re-key of the fresh normals is off: it would redraw them)
    data = make_tabular(240, seed=8)

    def make(**kw):
        return _fdp(_model(), seed=9, secure_rng=secure_rng, steps=14, pretrain_epochs=0.2, averaging="uniform",
                    **kw)  # fmt: skip

    a = make()
    ra = a.fit(data)
    b = make()
    rb = b.fit(data, checkpoint=tmp_path / "ck.pt", max_steps=9)
    assert rb.stopped_early
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    d = len(b.plan.noise_coeffs) // 2
    assert len(ck["private_sampler"]["partitions"]) == 6 and ck["noise"]["history"].shape[0] == d >= 1
    c = make()
    rc = c.fit(data, checkpoint=tmp_path / "ck.pt", resume=True)
    assert rc.epsilon == ra.epsilon and rc.steps == ra.steps and rc.history == ra.history
    assert _same(a.model.state_dict(), c.model.state_dict())
    lost = make()
    ck_lost = dict(ck, noise={**ck["noise"], "history": torch.zeros_like(ck["noise"]["history"])})
    torch.save(ck_lost, tmp_path / "lost.pt")
    lost.fit(data, checkpoint=tmp_path / "lost.pt", resume=True)
    assert not _same(a.model.state_dict(), lost.model.state_dict())


def test_resume_with_other_noise_is_refused(tmp_path):
    data = make_tabular(200, seed=3)
    _fdp(_model()).fit(data, checkpoint=tmp_path / "blt.pt", max_steps=5)
    for kw in ({"noise": "bandmf", "bands": 2}, {"noise": "independent"}):
        with pytest.raises(ValueError, match=r"noise='blt' with bands=None.*resume with the same noise"):
            _fdp(_model(), **kw).fit(data, checkpoint=tmp_path / "blt.pt", resume=True)


def test_ledger_segments_of_a_resumed_run_never_add_up_to_less(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, total_epsilon=1000.0, delta=1e-4)
    data = make_tabular(200, seed=3)
    t = _fdp(_model(), steps=22, ledger=path, noise_multiplier=3.0)
    t.fit(data, max_steps=3)
    t.fit(data)
    res = t.result
    assert res is not None and res.steps == 22
    assert ledger.spent() >= res.epsilon * (1 - 1e-9)


@pytest.mark.parametrize(("kw", "method", "needle"), [
    ({"noise": "blt", "bands": 4}, "dpsgd", "bands is for noise='bandmf', got bands=4 with noise='blt'"),
    ({"noise": "blt"}, "nonprivate", "noise='blt' is for the private methods"),
])  # fmt: skip
def test_bad_settings_are_refused_at_construction(kw, method, needle):
    with pytest.raises(ValueError) as err:
        Trainer(_model(), method, steps=10, batch_size=20, progress=False, **kw)
    assert needle in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------------------
# The FDP replay: D vs D plus one record, the same secret randomness
# ---------------------------------------------------------------------------------------------------------
def test_replay_neighbours_differ_only_through_the_minsep_sensitivity(monkeypatch):
    n, d, T, m, lr, beta, clip = 60, 5, 14, 15, 0.05, 0.5, 1.0
    b = n // m  # 4 partitions: one epoch is 4 steps
    extra_steps = (0, 4, 8, 12)  # the extra record in partition 0: every epoch, b apart, from step 0 (worst)
    gen = torch.Generator().manual_seed(0)
    base = {"x": torch.randn(n, d, generator=gen), "y": torch.randint(0, 2, (n,), generator=gen)}
    record = {"x": 3 * torch.ones(1, d), "y": torch.zeros(1, dtype=torch.long)}
    plus = {k: torch.cat([base[k], record[k]]) for k in base}

    class Replay(sampling.BMinSepSampler):
        """D's cyclic sampler in both runs (same secret partition and coins); D + x adds x at its steps."""

        def __init__(self, dataset_size, expected_batch, bands, generator, **kw):
            assert bands == b  # the plan's separation is D's ⌊n/m⌋ in both runs (n + 1 gives the same)
            super().__init__(n, expected_batch, bands, generator)
            self.with_record = dataset_size > n

        def sample(self):
            t = self._step
            idx = super().sample()
            return np.append(idx, n) if self.with_record and t in extra_steps else idx

    monkeypatch.setattr(sampling, "BMinSepSampler", Replay)
    sums, noises = record_noise(monkeypatch, blt.BLTNoise)

    def run(data):
        model = _model(2, d, 2)
        t = Trainer(model, "dpsgd", loss_split=LinearSplit(LabelPrivate()), steps=T, batch_size=m, lr=lr,
                    momentum=beta, noise_multiplier=1.0, max_grad_norm=clip, noise="blt", seed=4,
                    strategy="vmap", progress=False)  # fmt: skip
        t.fit(data)
        start = len(sums) - T
        return model, torch.stack(sums[start:]), torch.stack(noises[start:]), t.plan

    model_d, x_d, w_d, plan = run(base)
    model_p, x_p, w_p, plan_p = run(plus)
    assert plan.noise_coeffs == plan_p.noise_coeffs and len(plan.noise_coeffs) >= 2
    # 1. The noise is the same draw in both runs.
    assert torch.equal(w_d, w_p)
    # 2. The gradient sums differ by the extra record's clipped gradient at its steps only.
    probe = _model(2, d, 2)
    loss = LinearSplit(LabelPrivate()).loss(probe, record, {}).sum()
    g = torch.cat([v.reshape(-1) for v in torch.autograd.grad(loss, list(probe.parameters()))]).double()
    g = g * min(1.0, clip / float(g.norm()))
    expected = torch.zeros_like(x_d)
    for t in extra_steps:
        expected[t] = g
    torch.testing.assert_close(x_p - x_d, expected, rtol=0, atol=1e-5)
    # 3. The releases C x + z differ by C (x' − x), whose norm is exactly the min-sep sensitivity times the clip:
    #    the worst pattern, which the accountant charges.
    theta, omega = blt.split_blt_params(plan.noise_coeffs)
    C = torch.from_numpy(_dense(blt.blt_coefficients(theta, omega, T)))
    diff = C @ (x_p + w_p) - C @ (x_d + w_d)
    sens = blt.blt_sensitivity(plan.noise_coeffs, m, n, T)
    assert float(diff.norm()) == pytest.approx(sens * clip, rel=1e-5)
    assert plan.dpsgd_terms(T)[0] == pytest.approx(1.0 / sens)
    # 4. The models differ by the clipped gradient carried through the workload, over m.
    a = bandmf.workload_coefficients(T, beta)
    shift = sum(a[T - 1 - t] for t in extra_steps) * g * (lr / m)
    got = torch.cat([(q - p).reshape(-1) for p, q in zip(model_d.parameters(), model_p.parameters())]).double()
    torch.testing.assert_close(got, -shift, rtol=1e-4, atol=1e-6)


@pytest.mark.statistical
def test_noise_the_trainer_adds_has_the_blt_covariance_and_independent_noise_does_not():
    T, d, k, m, sigma, clip = 6, 4000, 10, 4, 2.0, 0.5

    def engine_noise(noise: str) -> tuple[np.ndarray, tuple[float, ...] | None]:
        data = {"x": torch.zeros(40, d), "y": torch.zeros(40, dtype=torch.long)}
        model = _model(3, d, k)
        snaps = [torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])]

        def snap(step, shown):
            snaps.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))

        t = Trainer(model, "dpsgd", loss_split=ZeroSplit(LabelPrivate()), steps=T, batch_size=m,
                    noise_multiplier=sigma, max_grad_norm=clip, lr=1.0, momentum=0.0, log_points=T, seed=13,
                    progress=False, noise=noise)  # fmt: skip
        t.fit(data, callback=snap)
        steps = torch.stack(snaps).double().diff(dim=0)
        return (-steps * m / (sigma * clip)).numpy(), t.plan.noise_coeffs if t.plan else None

    W, params = engine_noise("blt")
    assert params is not None and len(params) >= 2
    theta, omega = blt.split_blt_params(params)
    Cinv = np.linalg.inv(_dense(blt.blt_coefficients(theta, omega, T)))
    cov = Cinv @ Cinv.T
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / W.shape[1])

    def fits(samples: np.ndarray) -> bool:
        return bool(np.all(np.abs(samples @ samples.T / samples.shape[1] - cov) < 5 * se))

    assert fits(W)
    independent, _ = engine_noise("independent")
    assert not fits(independent)


def test_each_ranks_sampler_covers_its_shard_at_the_whole_datasets_rate():
    t = _fdp(_model())
    plan = t.make_plan(200)
    from featuredp import run_state

    samplers = [run_state.RunState.start(plan, {"data": "", "psi": ""}, params=list(t.model.parameters()),
                                         privacy=t.privacy, schedule=t.schedule, device=torch.device("cpu"), rank=r,
                                         world_size=2).private_sampler for r in (0, 1)]  # fmt: skip
    for r, s in enumerate(samplers):
        assert isinstance(s, sampling.BMinSepSampler) and s.bands == 5 and s.sampling_rate == pytest.approx(1.0)
        assert s.offset == 100 * r and s.dataset_size == 100
        for _ in range(6):
            idx = s.sample()
            assert np.all((idx >= 100 * r) & (idx < 100 * (r + 1)))


def test_check_model_replays_a_blt_step():
    from featuredp.testing import verdict

    reports = _fdp(_model()).check_model(make_tabular(200, seed=1), records=2)
    assert all(c.ok for r in reports for c in r.checks) and verdict(reports).startswith("safe")

"""Tests of the training engine: reductions, privacy rules, accounting, budget stop, resume."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.nn import functional as nnf

from _fdp_synth import ZeroSplit, make_tabular
from featuredp import accounting, engine, run_state, sampling
from featuredp.clipping import VmapGradients
from featuredp.engine import Trainer, evaluate
from featuredp.errors import DataValidationError
from featuredp.features import Columns, LabelPrivate
from featuredp.losses import GaussianPadding, Masking
from featuredp.models import LogisticRegression
from featuredp.sampling import PoissonSampler, UniformSampler, make_streams


def _tensors(data):
    return torch.as_tensor(data.X), torch.as_tensor(data.y)


# ---------------------------------------------------------------------------------------------------------
# Reductions: σ = 0 and C = ∞ is plain SGD on the same Poisson batches, normalised by the EXPECTED m
# ---------------------------------------------------------------------------------------------------------
def _manual_sgd(base, data, *, seed, steps, m, lr, momentum, divide_by_realised=False):
    ref = copy.deepcopy(base)
    opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=momentum)
    sampler = PoissonSampler(data.n, m / data.n, make_streams(seed).private_sampling)
    X, y = _tensors(data)
    sizes = []
    for _ in range(steps):
        idx = torch.as_tensor(sampler.sample())
        sizes.append(len(idx))
        denom = max(len(idx), 1) if divide_by_realised else m
        loss = nnf.cross_entropy(ref(X[idx]), y[idx], reduction="sum") / denom
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ref, sizes


def test_dpsgd_without_noise_and_clipping_is_plain_sgd_normalised_by_expected_batch():
    data = make_tabular(200, seed=1)
    torch.manual_seed(0)
    base = LogisticRegression(7, 2)
    model = copy.deepcopy(base)
    Trainer(model, "dpsgd", steps=15, batch_size=20, noise_multiplier=0.0, max_grad_norm=math.inf, lr=0.1,
            momentum=0.9, seed=3, progress=False).fit(data)  # fmt: skip
    ref, sizes = _manual_sgd(base, data, seed=3, steps=15, m=20, lr=0.1, momentum=0.9)
    assert any(s != 20 for s in sizes)  # realised sizes vary, so the normaliser matters
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    # The same check fails for a (wrong) engine that divided by the realised batch size.
    wrong, _ = _manual_sgd(base, data, seed=3, steps=15, m=20, lr=0.1, momentum=0.9, divide_by_realised=True)
    assert not all(torch.allclose(p, q, atol=1e-6) for p, q in zip(model.parameters(), wrong.parameters()))


def test_fdp_step_is_public_mean_plus_alpha_times_private_sum_over_m(monkeypatch):
    """g = mean_{B_pub} ∇ℓ_pub + α·Σ_{B_priv} ∇ℓ_priv / m, with σ = 0, C = ∞, recorded batches."""
    data = make_tabular(150, seed=2)
    rec = _record_samplers(monkeypatch)
    torch.manual_seed(1)
    base = LogisticRegression(7, 2)
    model = copy.deepcopy(base)
    split = Masking(Columns(["sex", "race"]))
    Trainer(model, "fdp", loss_split=split, steps=6, batch_size=15, public_batch_size=10, noise_multiplier=0.0,
            max_grad_norm=math.inf, alpha=0.5, lr=0.2, momentum=0.0, seed=4, progress=False).fit(data)  # fmt: skip
    ref = copy.deepcopy(base)
    b_all = engine.as_batch(data)
    for priv, pub in zip(rec["private"], rec["public"]):
        bp = {k: v[torch.as_tensor(priv)] for k, v in b_all.items()}
        bq = {k: v[torch.as_tensor(pub)] for k, v in b_all.items()}
        total = 0.5 * split.private_loss(ref, bp, {}).sum() / 15 + split.public_loss(ref, bq, {}).mean()
        grads = torch.autograd.grad(total, list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.2 * g
    assert len(rec["private"]) == 6
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Noise: std σ·C on the sum (then /m, times α for fdp); a 2/3-std version must be rejected
# ---------------------------------------------------------------------------------------------------------
def _variance_pvalue(z: np.ndarray) -> float:
    chi2 = float(np.sum(z**2))
    k = z.size
    return 2 * min(stats.chi2.cdf(chi2, k), stats.chi2.sf(chi2, k))


@pytest.mark.statistical
@pytest.mark.parametrize("secure_rng", [False, True], ids=["torch", "secure"])
@pytest.mark.parametrize(("method", "alpha"), [("dpsgd", 1.0), ("fdp", 0.5)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_added_noise_has_std_sigma_c_over_m(method, alpha, secure_rng, precision):
    gen = torch.Generator().manual_seed(0)
    data = {"x": torch.randn(100, 300, generator=gen), "y": torch.randint(0, 2, (100,), generator=gen)}
    torch.manual_seed(0)
    model = LogisticRegression(300, 5)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    sigma, C, m = 2.0, 0.5, 10
    Trainer(model, method, loss_split=ZeroSplit(LabelPrivate()), steps=1, batch_size=m, noise_multiplier=sigma,
            max_grad_norm=C, alpha=alpha, lr=1.0, momentum=0.0, seed=11, secure_rng=secure_rng,
            precision=precision, progress=False).fit(data)  # fmt: skip
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    noise = (before - after).double().numpy()  # = α·N(0, σ²C²)/m per coordinate
    std = alpha * sigma * C / m
    assert noise.size == 1505
    assert _variance_pvalue(noise / std) > 1e-3
    assert stats.kstest(noise / std, "norm").pvalue > 1e-3
    # Power: the same data tested against 2/3 of the std is rejected.
    assert _variance_pvalue(noise / (2 / 3 * std)) < 1e-6


# ---------------------------------------------------------------------------------------------------------
# Poisson batch sizes inside the engine ~ Binomial(n, p)
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.statistical
def test_realised_private_batch_sizes_are_binomial(monkeypatch):
    data = make_tabular(400, seed=3)
    seen: list[int] = []
    real = VmapGradients.clipped_sum

    def recording(self, model, loss_fn, batch, draws, max_grad_norm):
        seen.append(int(batch["y"].shape[0]))
        return real(self, model, loss_fn, batch, draws, max_grad_norm)

    monkeypatch.setattr(VmapGradients, "clipped_sum", recording)
    T, m = 300, 20
    Trainer(LogisticRegression(7, 2), "fdp", feature_map=Columns(["sex"]), steps=T, batch_size=m,
            noise_multiplier=1.0, strategy="vmap", seed=5, progress=False).fit(data)  # fmt: skip
    sizes = np.asarray(seen, dtype=float)
    assert sizes.size == T
    n, p = 400, m / 400
    mean, var = n * p, n * p * (1 - p)
    assert abs(sizes.mean() - mean) < 4 * math.sqrt(var / T)
    chi = (T - 1) * sizes.var(ddof=1) / var
    assert 2 * min(stats.chi2.cdf(chi, T - 1), stats.chi2.sf(chi, T - 1)) > 1e-3
    # A fixed-size batch (variance 0) would fail the variance test above.
    assert sizes.var() > 0


# ---------------------------------------------------------------------------------------------------------
# The public batch is independent of the private batch (indices, coins and loss draws)
# ---------------------------------------------------------------------------------------------------------
def _record_samplers(monkeypatch):
    rec: dict[str, list[np.ndarray]] = {"private": [], "public": []}

    class RecPoisson(PoissonSampler):
        def sample(self):
            idx = super().sample()
            rec["private"].append(idx.copy())
            return idx

    class RecUniform(UniformSampler):
        def sample(self):
            idx = super().sample()
            rec["public"].append(idx.copy())
            return idx

    monkeypatch.setattr(sampling, "PoissonSampler", RecPoisson)  # the private sampler: the noise plan builds it
    monkeypatch.setattr(run_state, "UniformSampler", RecUniform)
    return rec


class _RecordingPadding(GaussianPadding):
    def __init__(self, fmap):
        super().__init__(fmap)
        self.generators: list[torch.Generator] = []

    def draws(self, batch, generator):
        self.generators.append(generator)
        return super().draws(batch, generator)


def _fdp_run(data, seed=7):
    split = _RecordingPadding(Columns(["sex", "race"]))
    Trainer(LogisticRegression(7, 2), "fdp", loss_split=split, steps=25, batch_size=20, public_batch_size=20,
            noise_multiplier=1.0, seed=seed, progress=False).fit(data)  # fmt: skip
    return split


def test_public_batch_uses_its_own_stream_and_draws(monkeypatch):
    data = make_tabular(200, seed=4)
    rec = _record_samplers(monkeypatch)
    split = _fdp_run(data)
    priv, pub = list(rec["private"]), list(rec["public"])
    assert len(priv) == len(pub) == 25
    # Not the private indices reused: no step's public batch equals its private batch.
    assert all(not (len(a) == len(b) and np.array_equal(np.sort(a), np.sort(b))) for a, b in zip(priv, pub))
    # Loss draws: the private and the public batch draw from two different generators (alternating calls).
    priv_gens = {id(g) for g in split.generators[0::2]}
    pub_gens = {id(g) for g in split.generators[1::2]}
    assert len(priv_gens) == len(pub_gens) == 1 and priv_gens.isdisjoint(pub_gens)
    assert split.generators[0].initial_seed() != split.generators[1].initial_seed()

    # Re-seeding only the private stream changes the private batches and leaves the public ones unchanged.
    real = run_state.make_streams

    def reseeded(seed, public_seed=None, rank=None):
        streams = real(seed, public_seed=public_seed, rank=rank)
        return dataclasses.replace(streams, private_sampling=np.random.default_rng(12345))

    monkeypatch.setattr(run_state, "make_streams", reseeded)
    rec["private"].clear()
    rec["public"].clear()
    _fdp_run(data)
    assert any(not np.array_equal(a, b) for a, b in zip(priv, rec["private"]))
    assert all(np.array_equal(a, b) for a, b in zip(pub, rec["public"]))


# ---------------------------------------------------------------------------------------------------------
# Accounting: reported ε = accountant's ε for (σ, p, T) run; calibration; budget stop
# ---------------------------------------------------------------------------------------------------------
def test_reported_epsilon_is_the_accountants_for_what_ran():
    data = make_tabular(300, seed=5)
    tr = Trainer(LogisticRegression(7, 2), "fdp", feature_map=Columns(["race"]), steps=12, batch_size=30,
                 noise_multiplier=1.3, delta=1e-4, seed=0, progress=False)  # fmt: skip
    res = tr.fit(data)
    assert res.steps == 12 and res.plan.sampling_rate == pytest.approx(0.1)
    assert res.epsilon == accounting.epsilon_for(1.3, 0.1, 12, 1e-4)
    assert res.history and res.history[-1]["epsilon"] == res.epsilon
    assert "Algorithm 1" in res.guarantee and "['race']" in res.guarantee


def test_target_epsilon_calibrates_sigma_and_never_overshoots():
    data = make_tabular(300, seed=5)
    res = Trainer(LogisticRegression(7, 2), "dpsgd", epochs=2, batch_size=30, target_epsilon=2.0, delta=1e-4,
                  seed=0, progress=False).fit(data)  # fmt: skip
    assert res.steps == 20 and not res.stopped_early
    assert 0.98 * 2.0 <= res.epsilon <= 2.0
    assert res.epsilon == accounting.epsilon_for(res.plan.noise_multiplier, 0.1, 20, 1e-4)


def test_budget_stop_before_exceeding_target():
    data = make_tabular(300, seed=5)
    res = Trainer(LogisticRegression(7, 2), "fdp", feature_map=Columns(["sex"]), steps=500, batch_size=30,
                  noise_multiplier=1.0, target_epsilon=1.5, delta=1e-4, seed=0, progress=False).fit(data)
    assert res.stopped_early and res.stop_reason == "budget"
    assert 0 < res.steps < 500
    assert res.epsilon <= 1.5
    assert accounting.epsilon_for(1.0, 0.1, res.steps + 1, 1e-4) > 1.5  # one more step would overshoot
    assert res.epsilon == accounting.epsilon_for(1.0, 0.1, res.steps, 1e-4)


# ---------------------------------------------------------------------------------------------------------
# Ψ is all the public phases see
# ---------------------------------------------------------------------------------------------------------
def _scramble_private(data, seed=0):
    rng = np.random.default_rng(seed)
    X = data.X.copy()
    X[:, 2:4] = np.eye(2)[rng.integers(0, 2, data.n)]
    X[:, 4:7] = np.eye(3)[rng.integers(0, 3, data.n)]
    return type(data)(**{**data.__dict__, "X": X})


@pytest.mark.parametrize("method", ["public", "fdp_dpsgd"])
def test_public_training_does_not_depend_on_private_columns(method):
    data = make_tabular(200, seed=6)
    other = _scramble_private(data)
    assert not np.array_equal(data.X, other.X)
    kw = dict(steps=10, batch_size=20, seed=1, progress=False)
    if method == "fdp_dpsgd":  # stop after the public pre-training phase
        kw.update(pretrain_epochs=1, noise_multiplier=1.0)
    models = []
    for d in (data, other):
        torch.manual_seed(0)
        m = LogisticRegression(7, 2)
        t = Trainer(m, method, feature_map=Columns(["sex", "race"]), **kw)
        t.fit(d, max_steps=10 if method == "fdp_dpsgd" else None)
        models.append(m)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(p, q)
    # Counter-check (the test has teeth): non-private training does see the private columns.
    outs = []
    for d in (data, other):
        torch.manual_seed(0)
        m = LogisticRegression(7, 2)
        Trainer(m, "nonprivate", steps=10, batch_size=20, seed=1, progress=False).fit(d)
        outs.append(m.linear.weight.detach().clone())
    assert not torch.equal(outs[0], outs[1])


# ---------------------------------------------------------------------------------------------------------
# Resume: every state restored; the private randomness after it re-keyed from OS entropy
# ---------------------------------------------------------------------------------------------------------
def _resumable(method: str, secure_rng: bool = False) -> Trainer:
    torch.manual_seed(0)
    kw: dict = {} if method == "nonprivate" else {"noise_multiplier": 1.1}
    if method == "fdp":
        kw.update(pretrain_epochs=0.5, feature_map=Columns(["sex", "race"]), averaging="uniform")
    return Trainer(nn.Sequential(nn.Linear(7, 8), nn.Tanh(), nn.Linear(8, 2)), method, epochs=2, batch_size=24,
                   seed=9, secure_rng=secure_rng, progress=False, **kw)  # fmt: skip


@pytest.mark.parametrize("method", ["fdp", "dpsgd", "nonprivate"])
def test_resume_restores_every_state_exactly(tmp_path, method, keys_kept_on_resume):
    # With the re-key switched off, a resume is the uninterrupted run bit for bit: nothing else is lost or redrawn.
    data = make_tabular(240, seed=8)
    ra = (a := _resumable(method)).fit(data)
    rb = _resumable(method).fit(data, checkpoint=tmp_path / "ck.pt", max_steps=13)
    assert rb.stopped_early and rb.stop_reason == "max_steps"
    rc = (c := _resumable(method)).fit(data, checkpoint=tmp_path / "ck.pt", resume=True)
    assert not rc.stopped_early
    assert rc.epsilon == ra.epsilon and rc.steps == ra.steps and rc.history == ra.history
    for (k, v), (_, w) in zip(a.model.state_dict().items(), c.model.state_dict().items()):
        assert torch.equal(v, w), k


@pytest.mark.parametrize("method", ["fdp", "dpsgd"])
def test_resume_equals_uninterrupted_up_to_the_checkpoint_and_redraws_after(tmp_path, method):
    # The same run up to the checkpoint (its history bit for bit) and the same accounting; after it, fresh noise.
    data = make_tabular(240, seed=8)
    ra = (a := _resumable(method)).fit(data)
    _resumable(method).fit(data, checkpoint=tmp_path / "ck.pt", max_steps=13)
    rc = (c := _resumable(method)).fit(data, checkpoint=tmp_path / "ck.pt", resume=True)
    assert rc.epsilon == ra.epsilon and rc.steps == ra.steps and len(rc.history) == len(ra.history)
    before = [h for h in ra.history if h["step"] <= 13]
    assert before and [h for h in rc.history if h["step"] <= 13] == before
    assert not all(torch.equal(v, w) for v, w in zip(a.model.state_dict().values(), c.model.state_dict().values()))


@pytest.mark.parametrize("secure_rng", [False, True], ids=["torch", "secure"])
def test_a_stolen_checkpoint_does_not_predict_the_noise_after_a_resume(tmp_path, monkeypatch, secure_rng):
    """The attacker copies the checkpoint and replays the saved noise state: before the re-key that replay was
    the run's noise after the resume, exactly (checked below with the re-key off); now it is independent."""
    from featuredp.noise import SecureNoise, TorchNoise
    from featuredp.run_state import RunState

    data = make_tabular(240, seed=8)
    _resumable("dpsgd", secure_rng).fit(data, checkpoint=tmp_path / "ck.pt", max_steps=13)
    saved = torch.load(tmp_path / "ck.pt", weights_only=True)
    cls = SecureNoise if secure_rng else TorchNoise
    real_add = cls.add

    def first_noise(rekey: bool) -> torch.Tensor:
        torch.save(saved, tmp_path / "copy.pt")
        drawn: list[torch.Tensor] = []

        def spy(self, sums, std):
            out = real_add(self, sums, std)
            drawn.append(torch.cat([(out[k].double() - v.double()).flatten() for k, v in sums.items()]) / std)
            return out

        with monkeypatch.context() as m:
            m.setattr(cls, "add", spy)
            if not rekey:
                m.setattr(RunState, "rekey_private", lambda self: None)
            _resumable("dpsgd", secure_rng).fit(data, checkpoint=tmp_path / "copy.pt", resume=True)
        assert len(drawn) >= 2  # every private step after the checkpoint
        return torch.cat(drawn)

    predicted = first_noise(rekey=False)
    assert torch.equal(predicted, first_noise(rekey=False))  # the attack: the saved state fixes the next noise
    actual, again = first_noise(rekey=True), first_noise(rekey=True)
    assert not torch.isclose(actual, predicted, rtol=0, atol=1e-9).any()  # no coordinate predicted
    assert not torch.isclose(actual, again, rtol=0, atol=1e-9).any()  # fresh OS entropy on every resume
    # the same distribution: standard normal coordinates (a 2/3-scale draw would fail: std 0.67)
    z = torch.cat([actual, again])
    assert z.numel() >= 100 and abs(float(z.std()) - 1.0) < 5 / math.sqrt(2 * z.numel()) + 0.05


def test_resume_refuses_a_different_plan(tmp_path):
    data = make_tabular(120, seed=8)
    Trainer(LogisticRegression(7, 2), "dpsgd", steps=5, batch_size=12, noise_multiplier=1.0, seed=0,
            progress=False).fit(data, checkpoint=tmp_path / "ck.pt")  # fmt: skip
    with pytest.raises(ValueError, match="different plan"):
        Trainer(LogisticRegression(7, 2), "dpsgd", steps=5, batch_size=12, noise_multiplier=2.0, seed=0,
                progress=False).fit(data, checkpoint=tmp_path / "ck.pt", resume=True)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Refusals and validation
# ---------------------------------------------------------------------------------------------------------
def test_batchnorm_refused_for_private_methods_but_not_nonprivate():
    data = make_tabular(100, seed=0)
    bn = nn.Sequential(nn.Linear(7, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"'1'.*BatchNorm1d.*GroupNorm"):
        Trainer(bn, "dpsgd", steps=2, batch_size=10, noise_multiplier=1.0, progress=False).fit(data)
    Trainer(bn, "nonprivate", steps=2, batch_size=10, progress=False).fit(data)


def test_validation_errors_name_the_problem():
    data = make_tabular(100, seed=0)
    model = LogisticRegression(7, 2)
    with pytest.raises(ValueError, match="method must be one of"):
        Trainer(model, "sgd", steps=1)
    with pytest.raises(ValueError, match="needs a public feature map"):
        Trainer(model, "fdp", steps=1, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="noise_multiplier= or target_epsilon="):
        Trainer(model, "dpsgd", steps=1)
    with pytest.raises(ValueError, match="exactly one of epochs= or steps="):
        Trainer(model, "nonprivate")
    with pytest.raises(ValueError, match="max_grad_norm must be > 0"):
        Trainer(model, "dpsgd", steps=1, noise_multiplier=1.0, max_grad_norm=-1)
    with pytest.raises(DataValidationError, match="dataset_size=50 was declared but the data holds 100"):
        Trainer(model, "dpsgd", steps=1, noise_multiplier=1.0, dataset_size=50, progress=False).fit(data)
    with pytest.raises(DataValidationError, match="batch_size must be <= the number of records 100"):
        Trainer(model, "dpsgd", steps=1, batch_size=500, noise_multiplier=1.0, progress=False).fit(data)
    with pytest.raises(ValueError, match="only allowed with noise_multiplier=0"):
        Trainer(model, "dpsgd", steps=1, batch_size=10, noise_multiplier=1.0, max_grad_norm=math.inf,
                progress=False).fit(data)
    with pytest.raises(DataValidationError, match="unknown column"):
        Trainer(model, "fdp", feature_map=Columns(["gender"]), steps=1, batch_size=10, noise_multiplier=1.0,
                progress=False).fit(data)  # fmt: skip


def test_every_method_learns_on_synthetic_data():
    data, test = make_tabular(600, seed=10), make_tabular(400, seed=11)
    accs = {}
    for method in ("nonprivate", "public", "dpsgd", "fdp_dpsgd", "fdp"):
        torch.manual_seed(0)
        model = LogisticRegression(7, 2)
        kw = {} if method in ("nonprivate", "public") else {"target_epsilon": 4.0, "delta": 1e-4}
        if method in ("fdp", "fdp_dpsgd"):
            kw["pretrain_epochs"] = 2
        Trainer(model, method, feature_map=None if method in ("nonprivate", "dpsgd") else Columns(["sex"]),
                epochs=4, batch_size=60, lr=0.2, seed=0, progress=False, **kw).fit(data)  # fmt: skip
        accs[method] = evaluate(model, test)["accuracy"]
    assert min(accs.values()) > 0.65, accs


def test_projection_and_adam_and_ema():
    data = make_tabular(200, seed=0)
    model = LogisticRegression(7, 2)
    Trainer(model, "fdp", feature_map=Columns(["sex"]), steps=20, batch_size=20, noise_multiplier=1.0,
            optimizer="adam", lr=0.05, projection_radius=0.3, averaging="ema", seed=0,
            progress=False).fit(data)  # fmt: skip
    norm = torch.sqrt(sum(p.pow(2).sum() for p in model.parameters()))
    assert norm <= 0.3 + 1e-5  # an average of points in the ball stays in the ball


def test_ghost_strategy_gives_the_same_run_as_vmap():
    pytest.importorskip("featuredp.clipping.ghost")
    data = make_tabular(200, seed=12)
    models = []
    for strategy in ("vmap", "ghost"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(7, 8), nn.Tanh(), nn.Linear(8, 2))
        Trainer(model, "fdp", feature_map=Columns(["sex", "race"]), steps=8, batch_size=20, noise_multiplier=1.0,
                max_grad_norm=0.1, strategy=strategy, seed=2, progress=False).fit(data)  # fmt: skip
        models.append(model)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)

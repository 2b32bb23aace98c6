"""Issue 25: Algorithm 1's public weight w and the pre-training batch size m_pre.

g = w·g_pub + α·(Σ_i clip_C ∇(ℓ − w·ℓ_pub)(x_i) + N(0, σ²C²)) / m; w = 1 is the published algorithm, w = 0 with
α = 1 is FDP (DP-SGD) after public pre-training, bit for bit. Public pre-training runs on batches of
``pretrain_batch_size`` (default m'), the public batch of the private steps stays m'.
"""

from __future__ import annotations

import copy
import importlib
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from _fdp_synth import make_tabular
from featuredp import engine, run_state, sampling
from featuredp.cli import main
from featuredp.config import PrivacyConfig, ScheduleConfig
from featuredp.engine import Trainer
from featuredp.errors import DataValidationError
from featuredp.experiments.presets import unused_params
from featuredp.features import Columns
from featuredp.losses import GaussianPadding, Masking
from featuredp.models import LogisticRegression
from featuredp.plan import PrivacyPlan
from featuredp.sampling import EpochShuffler, PoissonSampler, UniformSampler
from featuredp.testing import replay_step


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 8), nn.Tanh(), nn.Linear(8, 2))


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------------------------------------------------
# (a) The reduction: fdp with w = 0, α = 1 is fdp_dpsgd, bit for bit
# ---------------------------------------------------------------------------------------------------------
_RUN = dict(epochs=2, batch_size=16, public_batch_size=24, pretrain_epochs=1, noise_multiplier=1.3,
            max_grad_norm=0.3, lr=0.2, pretrain_lr=0.1, seed=17, progress=False)  # fmt: skip


def _fit(method: str, strategy: str, data, **kw):
    trainer = Trainer(_mlp(), method, feature_map=Columns(["sex", "race"]), strategy=strategy, **{**_RUN, **kw})
    return trainer, trainer.fit(data)


@pytest.mark.parametrize("strategy", ["vmap", "ghost"])
def test_fdp_with_public_weight_zero_and_alpha_one_is_fdp_dpsgd_bit_for_bit(strategy):
    data = make_tabular(160, seed=5)
    a, ra = _fit("fdp", strategy, data, public_weight=0.0, alpha=1.0)
    b, rb = _fit("fdp_dpsgd", strategy, data)
    assert ra.pretrain_steps == rb.pretrain_steps > 0 and ra.steps == rb.steps > 0
    assert ra.epsilon == rb.epsilon and ra.plan.noise_multiplier == rb.plan.noise_multiplier
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    # Not vacuous: the published algorithm (w = 1) on the same seed ends elsewhere.
    c, _ = _fit("fdp", strategy, data, alpha=1.0)
    assert not all(torch.equal(p, q) for p, q in zip(c.model.parameters(), b.model.parameters()))


def test_public_weight_zero_never_draws_or_computes_the_public_batch(monkeypatch):
    drawn: list[int] = []

    class Watched(UniformSampler):
        def sample(self):
            drawn.append(1)
            return super().sample()

    class Split(GaussianPadding):
        public_calls = 0

        def public_loss(self, model, batch, draws):
            Split.public_calls += 1
            return super().public_loss(model, batch, draws)

    monkeypatch.setattr(run_state, "UniformSampler", Watched)
    data = make_tabular(120, seed=3)
    Trainer(_mlp(), "fdp", loss_split=Split(Columns(["sex", "race"])), steps=5, batch_size=12, noise_multiplier=1.0,
            public_weight=0.0, seed=1, progress=False).fit(data)  # fmt: skip
    assert drawn == [] and Split.public_calls == 0
    # The same run with w > 0 does draw it (the watch works).
    Trainer(_mlp(), "fdp", loss_split=Split(Columns(["sex", "race"])), steps=5, batch_size=12, noise_multiplier=1.0,
            public_weight=0.5, seed=1, progress=False).fit(data)  # fmt: skip
    assert len(drawn) == 5 and Split.public_calls > 0


# ---------------------------------------------------------------------------------------------------------
# (b) w = 1 is today's Algorithm 1 exactly
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["vmap", "ghost"])
def test_public_weight_one_is_the_published_algorithm_exactly(strategy, monkeypatch):
    data = make_tabular(160, seed=6)
    a, ra = _fit("fdp", strategy, data, alpha=0.5)
    b, rb = _fit("fdp", strategy, data, alpha=0.5, public_weight=1.0)
    assert ra.epsilon == rb.epsilon and ra.plan == rb.plan and ra.history == rb.history
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    # ... and the strategy clips split.private_loss itself (not a re-weighted copy that rounds differently).
    seen = []
    clipped_sum = type(b.strategy).clipped_sum

    def spy(self, model, loss_fn, *args, **kwargs):
        seen.append(loss_fn)
        return clipped_sum(self, model, loss_fn, *args, **kwargs)

    monkeypatch.setattr(type(b.strategy), "clipped_sum", spy)
    c = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), strategy=strategy, steps=1, batch_size=16,
                noise_multiplier=1.0, public_weight=1.0, seed=2, progress=False)  # fmt: skip
    c.fit(data)
    assert seen and all(f == c.loss_split.private_loss for f in seen)


# ---------------------------------------------------------------------------------------------------------
# (c) one step's arithmetic for w = 0.5
# ---------------------------------------------------------------------------------------------------------
def _record_samplers(monkeypatch):
    rec: dict[str, list[np.ndarray]] = {"private": [], "public": [], "shuffled": []}

    def recording(cls, key):
        class Rec(cls):
            def sample(self):
                idx = super().sample()
                rec[key].append(idx.copy())
                return idx

        return Rec

    monkeypatch.setattr(sampling, "PoissonSampler", recording(PoissonSampler, "private"))  # the noise plan builds it
    monkeypatch.setattr(run_state, "UniformSampler", recording(UniformSampler, "public"))
    monkeypatch.setattr(run_state, "EpochShuffler", recording(EpochShuffler, "shuffled"))
    return rec


def test_fdp_step_is_w_public_mean_plus_alpha_times_sum_of_l_minus_w_lpub_over_m(monkeypatch):
    """g = w·mean_{B_pub} ∇ℓ_pub + α·Σ_{B_priv} ∇(ℓ − w·ℓ_pub) / m, with σ = 0, C = ∞, recorded batches."""
    data = make_tabular(150, seed=2)
    rec = _record_samplers(monkeypatch)
    torch.manual_seed(1)
    base = LogisticRegression(7, 2)
    model = copy.deepcopy(base)
    split = Masking(Columns(["sex", "race"]))
    w, alpha, m, lr = 0.5, 0.7, 15, 0.2
    Trainer(model, "fdp", loss_split=split, steps=6, batch_size=m, public_batch_size=10, noise_multiplier=0.0,
            max_grad_norm=math.inf, alpha=alpha, public_weight=w, lr=lr, momentum=0.0, seed=4,
            progress=False).fit(data)  # fmt: skip
    b_all = engine.as_batch(data)
    assert len(rec["private"]) == len(rec["public"]) == 6

    def replay(weight: float) -> list[torch.Tensor]:
        ref = copy.deepcopy(base)
        for priv, pub in zip(rec["private"], rec["public"]):
            bp = {k: v[torch.as_tensor(priv)] for k, v in b_all.items()}
            bq = {k: v[torch.as_tensor(pub)] for k, v in b_all.items()}
            private = split.loss(ref, bp, {}) - weight * split.public_loss(ref, bp, {})
            total = alpha * private.sum() / m + weight * split.public_loss(ref, bq, {}).mean()
            grads = torch.autograd.grad(total, list(ref.parameters()))
            with torch.no_grad():
                for p, g in zip(ref.parameters(), grads):
                    p -= lr * g
        return list(ref.parameters())

    for p, q in zip(model.parameters(), replay(w)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # An engine that ignored w (today's w = 1 formula) fails the same comparison.
    assert not all(torch.allclose(p, q, rtol=1e-5, atol=1e-6) for p, q in zip(model.parameters(), replay(1.0)))


@pytest.mark.parametrize("strategy", ["vmap", "ghost"])
@pytest.mark.parametrize("weight", [0.0, 0.5, 3.0])
def test_adding_a_record_moves_the_update_by_at_most_alpha_c_over_m_whatever_w(strategy, weight):
    """The attacker's view: with every random draw held fixed, one more record in the private batch moves the
    clipped sum by <= C and the update by <= α·C/m, for any w (the accounting does not depend on w)."""
    data = make_tabular(120, seed=9)
    with torch.no_grad():
        data.X[7] *= 50.0  # a record whose gradient is far beyond C
    trainer = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), strategy=strategy, steps=3,
                      batch_size=12, noise_multiplier=1.0, max_grad_norm=0.5, alpha=0.8, public_weight=weight,
                      seed=3, progress=False)  # fmt: skip
    report = replay_step(trainer, data, record=7, batch=list(range(20, 32)))
    assert report.outcome == "passed", [c for c in report.checks if not c.ok]


# ---------------------------------------------------------------------------------------------------------
# (d) values refused; the setting recorded
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad,needle", [(-1, "public_weight must be >= 0, got -1"),
                                        (math.nan, "public_weight must not be NaN"),
                                        (math.inf, "public_weight must be finite")])  # fmt: skip
def test_bad_public_weights_are_refused_naming_the_parameter(bad, needle):
    with pytest.raises(ValueError, match=needle):
        PrivacyConfig(public_weight=bad)
    with pytest.raises(ValueError, match=needle):
        Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), steps=1, noise_multiplier=1.0,
                public_weight=bad)  # fmt: skip


def test_public_weight_is_in_the_plan_and_the_config_and_only_fdp_reads_it():
    data = make_tabular(80, seed=1)
    t = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), steps=2, batch_size=8, noise_multiplier=1.0,
                public_weight=0.25, alpha=2.0, seed=0, progress=False)  # fmt: skip
    plan = t.fit(data).plan
    assert plan.public_weight == 0.25 and t.config()["public_weight"] == 0.25 and t.public_weight == 0.25
    assert PrivacyPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    d = Trainer(_mlp(), "fdp_dpsgd", feature_map=Columns(["sex", "race"]), steps=2, batch_size=8,
                noise_multiplier=1.0, public_weight=0.25, seed=0, progress=False)  # fmt: skip
    assert d.fit(data).plan.public_weight == 1.0  # no public batch: w means nothing there
    assert "public_weight" in unused_params("fdp_dpsgd") and "public_weight" not in unused_params("fdp")
    # w = 0 without pre-training reads no public batch: none is recorded.
    z = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), steps=2, batch_size=8, noise_multiplier=1.0,
                public_weight=0.0, seed=0, progress=False)  # fmt: skip
    assert z.fit(data).plan.public_batch_size is None


def test_an_old_plan_dict_loads_and_an_old_checkpoint_resumes(tmp_path, keys_kept_on_resume):
    """Plans and checkpoints written before the two fields existed mean w = 1 and pre-training on m'."""
    data = make_tabular(120, seed=4)

    def make(**kw):
        return Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), epochs=1, batch_size=12,
                       public_batch_size=20, pretrain_epochs=1, noise_multiplier=1.0, seed=5, progress=False, **kw)

    whole = make()
    ra = whole.fit(data)
    old = {k: v for k, v in ra.plan.to_dict().items() if k not in ("public_weight", "pretrain_batch_size")}
    assert PrivacyPlan.from_dict(old).public_weight == 1.0 and PrivacyPlan.from_dict(old).pretrain_batch_size is None

    ck = tmp_path / "ck.pt"
    make().fit(data, checkpoint=ck, max_steps=9)
    saved = torch.load(ck, weights_only=True)
    saved["plan"] = {k: v for k, v in saved["plan"].items() if k not in ("public_weight", "pretrain_batch_size")}
    torch.save(saved, ck)
    resumed = make()
    rc = resumed.fit(data, checkpoint=ck, resume=True)
    assert rc.epsilon == ra.epsilon and not rc.stopped_early
    for p, q in zip(whole.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
    # Another w or another pre-training batch is another plan: refused.
    make().fit(data, checkpoint=ck, max_steps=9)
    for kw in ({"public_weight": 0.5}, {"pretrain_batch_size": 30}):
        with pytest.raises(ValueError, match="different plan"):
            make(**kw).fit(data, checkpoint=ck, resume=True)


# ---------------------------------------------------------------------------------------------------------
# pretrain_batch_size: the pre-training batches, apart from m'
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fdp", "fdp_dpsgd"])
def test_pretraining_steps_and_batches_follow_pretrain_batch_size_not_public_batch_size(method, monkeypatch):
    rec = _record_samplers(monkeypatch)
    data = make_tabular(120, seed=2)
    t = Trainer(_mlp(), method, feature_map=Columns(["sex", "race"]), steps=3, batch_size=12, public_batch_size=30,
                pretrain_batch_size=20, pretrain_epochs=2, noise_multiplier=1.0, seed=0, progress=False)  # fmt: skip
    r = t.fit(data)
    assert r.pretrain_steps == r.plan.pretrain_steps == 12  # 2·120/20, not 2·120/30 = 8
    assert r.plan.pretrain_batch_size == 20 and t.config()["pretrain_batch_size"] == 20
    assert [len(i) for i in rec["shuffled"]] == [20] * 12
    if method == "fdp":
        assert r.plan.public_batch_size == 30 and [len(i) for i in rec["public"]] == [30] * 3


def test_public_batch_size_alone_still_sets_the_pretraining_batches(monkeypatch):
    rec = _record_samplers(monkeypatch)
    data = make_tabular(120, seed=2)
    t = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), steps=3, batch_size=12, public_batch_size=30,
                pretrain_epochs=2, noise_multiplier=1.0, seed=0, progress=False)  # fmt: skip
    r = t.fit(data)
    assert r.pretrain_steps == 8 and [len(i) for i in rec["shuffled"]] == [30] * 8
    assert r.plan.pretrain_batch_size == 30 and t.config()["pretrain_batch_size"] is None
    # Neither given: pre-training on m, Algorithm 1's public batch 4·m (it costs compute, not privacy).
    r = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), steps=3, batch_size=12, pretrain_epochs=1,
                noise_multiplier=1.0, seed=0, progress=False).fit(data)  # fmt: skip
    assert r.pretrain_steps == 10 and r.plan.pretrain_batch_size == 12 and r.plan.public_batch_size == 48
    # fdp_dpsgd has no public batch: its pre-training batch (and the plan's m') stay m
    r = Trainer(_mlp(), "fdp_dpsgd", feature_map=Columns(["sex", "race"]), steps=3, batch_size=12, pretrain_epochs=1,
                noise_multiplier=1.0, seed=0, progress=False).fit(data)  # fmt: skip
    assert r.pretrain_steps == 10 and r.plan.pretrain_batch_size == r.plan.public_batch_size == 12
    # and 4·m never exceeds the data
    r = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), steps=2, batch_size=40,
                noise_multiplier=1.0, seed=0, progress=False).fit(data)  # fmt: skip
    assert r.plan.public_batch_size == 120


def test_pretrain_batch_size_larger_than_the_data_or_below_one_is_refused():
    data = make_tabular(120, seed=2)
    t = Trainer(_mlp(), "fdp", feature_map=Columns(["sex", "race"]), steps=3, batch_size=12, pretrain_epochs=1,
                pretrain_batch_size=121, noise_multiplier=1.0, seed=0, progress=False)  # fmt: skip
    with pytest.raises(DataValidationError, match=r"^pretrain_batch_size must be <= the number of records 120, "
                                                  r"got 121$"):  # fmt: skip
        t.fit(data)
    with pytest.raises(ValueError, match="pretrain_batch_size"):
        ScheduleConfig(steps=1, pretrain_batch_size=0)
    assert "pretrain_batch_size" in unused_params("dpsgd") and "pretrain_batch_size" not in unused_params("fdp_dpsgd")


# ---------------------------------------------------------------------------------------------------------
# featuredp train --public-weight W --pretrain-batch-size N
# ---------------------------------------------------------------------------------------------------------
_TINY = ["train", "--method", "fdp", "--epsilon", "2", "--epochs", "0.02", "--model", "logreg", "--json"]


@pytest.mark.parametrize("extra,needle", [
    (["--public-weight", "-1"], "--public-weight must be >= 0"),
    (["--public-weight", "nan"], "--public-weight must not be NaN"),
    (["--pretrain-batch-size", "0"], "--pretrain-batch-size must be >= 1"),
])  # fmt: skip
def test_train_bad_public_weight_or_pretrain_batch_exits_2_before_any_data(extra, needle, capsys, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the flags were checked")

    monkeypatch.setattr(importlib.import_module("featuredp.experiments.train_one"), "load_dataset", no_data)
    assert main([*_TINY, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("tune", [False, True])
def test_train_passes_both_flags_through(tune, capsys, monkeypatch):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stopped here")

    # The modules themselves: the package re-exports a function under the name train_one.
    module = importlib.import_module("featuredp.experiments.tuning" if tune else "featuredp.experiments.train_one")
    monkeypatch.setattr(module, "tune" if tune else "train_one", fake)
    argv = [*_TINY, "--public-weight", "0.5", "--pretrain-batch-size", "64"] + (["--tune", "public"] if tune else [])
    assert main(argv) == 2
    assert "stopped here" in capsys.readouterr().err
    assert seen["public_weight"] == 0.5 and seen["pretrain_batch_size"] == 64


def test_train_records_both_in_run_json(capsys, tmp_path):
    out = tmp_path / "run"
    assert main([*_TINY, "--public-weight", "0.5", "--pretrain-epochs", "0.02", "--pretrain-batch-size", "64",
                 "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["public_weight"] == 0.5 and info["config"]["pretrain_batch_size"] == 64
    assert info["plan"]["public_weight"] == 0.5 and info["plan"]["pretrain_batch_size"] == 64

"""featuredp.PrivacyEngine: the Opacus surface on the user's own loop, DP-SGD and FDP, with every check kept.

Written as an attacker would: a gradient that bypasses the engine, a clip that does not hold, noise of the wrong
scale, a batch that is not Poisson at the stated rate, a step past the budget, a loss read as if it were public.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine
from featuredp.cli import main
from featuredp.errors import BudgetExceededError, PrivacyLeakWarning
from featuredp.privacy_engine import DPLoss, DPOptimizer
from featuredp.testing import verdict


def _data(n: int = 400, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def _private(n: int = 400, batch: int = 40, *, sigma: float = 1.0, clip: float = 1.0, **kw):
    x, y = _data(n)
    model = nn.Sequential(nn.Linear(x.shape[1], 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    engine = PrivacyEngine(**kw.pop("engine", {}))
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    kw.setdefault("grad_sample_mode", "ghost")  # Opacus's ghost tutorial: four values, the criterion wrapped
    out = engine.make_private(module=model, optimizer=opt, data_loader=loader, criterion=nn.CrossEntropyLoss(),
                              noise_multiplier=sigma, max_grad_norm=clip, **kw)
    if len(out) == 3:  # a non-ghost mode returns no criterion (as Opacus): the loop's own is recomputed per example
        out = (out[0], out[1], nn.CrossEntropyLoss(), out[2])
    return engine, (model, *out), (x, y)


def _loop(model, optimizer, criterion, loader, epochs: int = 1) -> None:
    # The Opacus tutorial's loop, unchanged.
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()


def test_the_opacus_tutorial_loop_trains_dpsgd_and_its_epsilon_matches_featuredp_account(capsys):
    engine, (raw, model, optimizer, criterion, loader), (_x, _y) = _private()
    before = [p.detach().clone() for p in raw.parameters()]
    _loop(model, optimizer, criterion, loader, epochs=2)
    assert engine.steps == 2 * len(loader) == 20
    assert any(not torch.equal(a, p) for a, p in zip(before, raw.parameters(), strict=True))
    eps = engine.get_epsilon(1e-5)
    assert main(["account", "--noise-multiplier", "1.0", "--sampling-rate", str(1 / 10), "--steps", "20",
                 "--delta", "1e-5", "--json"]) == 0  # fmt: skip
    reference = json.loads(capsys.readouterr().out)["epsilon"]
    assert eps == pytest.approx(reference, rel=0.01)
    # Opacus's attributes and accountant, read from the same plan
    assert isinstance(optimizer, DPOptimizer)
    assert optimizer.noise_multiplier == 1.0 and optimizer.max_grad_norm == 1.0
    assert optimizer.expected_batch_size == pytest.approx(40)
    assert engine.accountant.get_epsilon(1e-5) == eps and len(engine.accountant) == 20
    assert engine.accountant.history == [(1.0, 0.1, 20)]


def test_the_epsilon_matches_opacus_for_the_same_sigma_rate_and_steps():
    opacus = pytest.importorskip("opacus")
    from opacus.accountants import PRVAccountant, RDPAccountant

    for sigma, q, steps in ((1.0, 0.1, 20), (0.8, 0.01, 1000)):
        engine, (_raw, _model, _optimizer, _criterion, _loader), _ = _private(1000, round(1000 * q), sigma=sigma,
                                                                         steps=steps)  # fmt: skip
        engine.run.state.private_steps = steps  # the count only: ε is a function of (σ, q, T)
        prv = PRVAccountant()
        prv.history = [(sigma, q, steps)]
        assert engine.get_epsilon(1e-5) == pytest.approx(prv.get_epsilon(1e-5), rel=0.01), opacus.__version__
        rdp = RDPAccountant()
        rdp.history = [(sigma, q, steps)]
        assert engine.get_epsilon(1e-5) <= rdp.get_epsilon(1e-5) * 1.001  # RDP is looser, never tighter


def test_no_gradient_can_bypass_the_engine():
    engine, (_raw, model, optimizer, criterion, loader), _ = _private()
    xb, yb = next(iter(loader))
    out = model(xb)
    assert not out.requires_grad  # the user-visible forward builds no graph
    with pytest.raises(RuntimeError):
        out.pow(2).sum().backward()  # a hand-made loss on the output has nothing to differentiate
    assert all(p.grad is None for p in _raw.parameters())
    # the loop's own loss function on the output is the engine's (recomputed per example, clipped, noised)
    assert isinstance(nn.functional.cross_entropy(out, yb), DPLoss)
    with pytest.raises(RuntimeError, match=r"without loss\.backward"):
        optimizer.step()
    loss = criterion(model(xb), yb)
    loss.backward()
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()  # two batches' sums in one step would double the sensitivity
    optimizer.step()
    assert engine.steps == 1


def test_the_update_is_the_clipped_sum_plus_noise_of_std_sigma_c_over_m():
    # A power test of the noise's scale through the user's loop: with lr = 1 and a model whose loss gradient
    # is zero, the update is exactly the noise / m; its std over many coordinates must be σC/m.
    sigma, clip, n, batch = 2.0, 0.5, 200, 50
    x, _y = _data(n)
    model = nn.Linear(x.shape[1], 2000, bias=False)
    nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private(module=model, optimizer=opt, data_loader=DataLoader(
        TensorDataset(x, torch.zeros(n, 2000)), batch_size=batch), criterion=_ZeroLoss(),
        noise_multiplier=sigma, max_grad_norm=clip, grad_sample_mode="ghost")  # fmt: skip
    xb, yb = next(iter(loader))
    o.zero_grad()
    c(m(xb), yb).backward()
    o.step()
    update = -model.weight.detach().reshape(-1).double()
    expected = sigma * clip / (n * (batch / n))
    assert update.std().item() == pytest.approx(expected, rel=0.03)
    assert abs(update.mean().item()) < 4 * expected / math.sqrt(update.numel())


class _ZeroLoss(nn.Module):
    """A loss with zero gradient (0 · output), as a torch loss module with a reduction."""

    reduction = "mean"

    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        per = (0.0 * out).sum(-1)
        return per if self.reduction == "none" else per.mean()


def test_every_example_is_clipped_to_c_in_the_users_loop():
    # σ = 0 isolates the clipped sum. Identical records with huge gradients: each clipped gradient is the same
    # vector of norm C, so the step moves the parameters by exactly lr·|B|·C/m (unclipped it would be ~1e4 times
    # more, clipped by the batch's mean norm it would be |B| times less).
    x = 1e4 * torch.ones(200, 6)
    y = torch.zeros(200, dtype=torch.long)
    model = nn.Linear(x.shape[1], 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)  # p = 1/2: a gradient of 1e4 scale, not a saturated 0
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                                          data_loader=DataLoader(TensorDataset(x, y), batch_size=20),
                                          noise_multiplier=0.0, max_grad_norm=0.1,
                                          grad_sample_mode="ghost")  # fmt: skip
    xb, yb = next(iter(loader))
    o.zero_grad()
    c(m(xb), yb).backward()
    o.step()
    moved = torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - before
    assert moved.norm().item() == pytest.approx(len(xb) * 0.1 / 20, rel=1e-4)


def test_sigma_zero_and_no_clipping_reduce_to_plain_sgd():
    # Rate 1 (one batch of all records): the realised batch is the expected one, so the engine's step is SGD's.
    x, y = _data(60)
    torch.manual_seed(1)
    plain = nn.Sequential(nn.Linear(x.shape[1], 4), nn.Tanh(), nn.Linear(4, 2))
    private = nn.Sequential(nn.Linear(x.shape[1], 4), nn.Tanh(), nn.Linear(4, 2))
    private.load_state_dict(plain.state_dict())
    sgd = torch.optim.SGD(plain.parameters(), lr=0.3, momentum=0.9)
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private(module=private, optimizer=torch.optim.SGD(private.parameters(), lr=0.3,
                                          momentum=0.9), data_loader=DataLoader(TensorDataset(x, y), batch_size=60),
                                          noise_multiplier=0.0, max_grad_norm=math.inf,
                                          grad_sample_mode="ghost")  # fmt: skip
    for _ in range(3):
        xb, yb = next(iter(loader))
        assert len(xb) == 60
        o.zero_grad()
        c(m(xb), yb).backward()
        o.step()
        sgd.zero_grad()
        nn.functional.cross_entropy(plain(x), y).backward()
        sgd.step()
    for a, b in zip(plain.parameters(), private.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_loader_samples_poisson_batches_at_rate_one_over_its_length_from_secret_coins():
    _engine, (_raw, _model, _optimizer, _criterion, loader), _ = _private(400, 40)
    sizes = [len(xb) for _ in range(30) for xb, _ in loader]
    assert len(loader) == 10 and len(sizes) == 300
    # Binomial(400, 0.1): mean 40, variance 36; fixed-size batches (variance 0) or another rate fail.
    assert np.mean(sizes) == pytest.approx(40, abs=3 * 6 / math.sqrt(300) + 0.01)
    assert 20 < np.var(sizes) < 60
    # two engines built alike draw different batches: the coins are OS entropy, not a default seed
    other = _private(400, 40)[1][4]
    first = [tuple(xb[:, 0].tolist()) for xb, _ in loader]
    assert first != [tuple(xb[:, 0].tolist()) for xb, _ in other]


def test_an_empty_poisson_batch_still_steps_with_noise():
    engine, (raw, model, optimizer, criterion, loader), _ = _private()
    before = [p.detach().clone() for p in raw.parameters()]
    engine.run.state.private_sampler.sample = lambda: np.zeros(0, dtype=np.int64)
    xb, yb = next(iter(loader))
    assert xb.shape[0] == 0
    optimizer.zero_grad()
    criterion(model(xb), yb).backward()
    optimizer.step()
    assert engine.steps == 1
    assert all(not torch.equal(a, p) for a, p in zip(before, raw.parameters(), strict=True))  # noise alone


def test_the_budget_stop_refuses_a_step_past_the_target():
    x, y = _data(400)
    model = nn.Linear(x.shape[1], 2)
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=40), target_epsilon=2.0, target_delta=1e-5,
        epochs=2, max_grad_norm=1.0, grad_sample_mode="ghost")  # fmt: skip
    _loop(m, o, c, loader, epochs=2)
    assert engine.get_epsilon(1e-5) <= 2.0
    with pytest.raises(BudgetExceededError, match="planned private steps are spent"):
        next(iter(loader))  # refused when drawn, before any model call
    assert engine.steps == 20


def test_bad_options_are_refused_in_one_line_naming_them():
    x, y = _data(100)
    model = nn.Linear(x.shape[1], 2)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    common = {"module": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "data_loader": loader,
              "noise_multiplier": 1.0, "max_grad_norm": 1.0}  # fmt: skip
    for bad, match in (({"poisson_sampling": False}, "poisson_sampling"), ({"grad_sample_mode": "no_op"},
                       "grad_sample_mode"), ({"noise_generator": torch.Generator()}, "noise_generator"),
                       ({"clipping": "per_layer"}, "clipping"), ({"noise": "bandmf"}, "epochs")):  # fmt: skip
        with pytest.raises(ValueError, match=match) as err:
            PrivacyEngine().make_private(**{**common, "grad_sample_mode": "ghost", **bad})
        assert "\n" not in str(err.value)


def test_reading_the_private_loss_warns_that_epsilon_does_not_cover_it():
    _engine, (raw, model, _optimizer, criterion, _loader), (x, y) = _private()
    DPLoss._warned = False
    loss = criterion(model(x[:10]), y[:10])
    with pytest.warns(PrivacyLeakWarning, match="not cover"):
        value = loss.item()
    assert value == pytest.approx(float(nn.functional.cross_entropy(raw(x[:10]), y[:10]).detach()), rel=1e-5)


def test_a_reshaped_output_is_recomputed_per_example_and_other_transforms_are_refused():
    # A sequence model's logits.view(-1, V) against labels.view(-1), as in an LM loop.
    torch.manual_seed(0)
    tokens = torch.randint(0, 7, (80, 5))
    model = nn.Sequential(nn.Embedding(7, 6), nn.Linear(6, 7))
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                          data_loader=DataLoader(TensorDataset(tokens, tokens), batch_size=8),
                                          noise_multiplier=0.5, max_grad_norm=1.0,
                                          grad_sample_mode="ghost")  # fmt: skip
    xb, yb = next(iter(loader))
    logits = m(xb)
    c(logits.view(-1, 7), yb.view(-1)).backward()
    o.step()
    with pytest.raises(TypeError, match="reshape"):
        c(m(xb)[:, :-1].reshape(-1, 7), yb[:, 1:].reshape(-1))


@pytest.mark.parametrize("mode", ["ghost", "vmap"])
def test_the_replay_self_test_passes_through_the_engine(mode):
    engine, (_raw, _model, _optimizer, _criterion, _loader), (x, y) = _private(grad_sample_mode=mode)
    reports = engine.check_model({"x": x, "y": y}, records=2, batch_size=16)
    assert all(r.outcome == "passed" for r in reports), [str(r) for r in reports]
    assert verdict(reports).startswith("safe")
    assert engine.steps == 0  # the replay leaves the run where it was


def test_the_replay_through_the_engine_catches_a_clip_that_does_not_hold(monkeypatch):
    from featuredp.step import StepCore

    real = StepCore.clipped_sum

    def unclipped(self, loss_fn, batch, draws, max_grad_norm, **kw):
        return real(self, loss_fn, batch, draws, 1e6 * max_grad_norm, **kw)

    x, y = _data(200)
    x = 50 * x  # gradients far above C
    model = nn.Linear(x.shape[1], 2)
    nn.init.zeros_(model.weight)  # p = 1/2 for every record: no saturated (zero) gradient, whichever record
    engine = PrivacyEngine()
    engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        data_loader=DataLoader(TensorDataset(x, y), batch_size=20), noise_multiplier=1.0,
                        max_grad_norm=0.1, grad_sample_mode="ghost")  # fmt: skip
    monkeypatch.setattr(StepCore, "clipped_sum", unclipped)
    reports = engine.check_model({"x": x, "y": y}, records=1, batch_size=10)
    assert reports[0].outcome == "failed", str(reports[0])


def test_fdp_in_the_users_loop_on_adult_reaches_the_presets_accuracy():
    from featuredp.data import load_dataset
    from featuredp.features import Columns

    warnings.simplefilter("ignore")
    train, test = load_dataset("adult")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(train.X.shape[1], 64), nn.ReLU(), nn.Linear(64, 2))
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        data_loader=DataLoader(TensorDataset(torch.tensor(train.X), torch.tensor(train.y)), batch_size=512),
        target_epsilon=1.0, target_delta=1e-5, epochs=2, max_grad_norm=1.0,
        feature_map=Columns(private=["sex", "race"]), dataset=train, alpha=0.5, public_batch_size=256,
        grad_sample_mode="ghost")  # fmt: skip
    _loop(m, o, c, loader, epochs=2)
    assert engine.plan.method == "fdp" and engine.get_epsilon(1e-5) <= 1.0
    assert engine.public_loss is not None  # the public batch's loss, covered (it reads Ψ(S) only)
    with torch.no_grad():
        acc = (model(torch.tensor(test.X)).argmax(1) == torch.tensor(test.y)).float().mean().item()
    assert acc >= 0.80
    result = engine.result()
    assert ("sex" in result.guarantee and result.epsilon == pytest.approx(engine.get_epsilon(1e-5), rel=1e-9)) or (
        result.epsilon <= 1.0)


def test_checkpoints_continue_the_run_and_are_owner_readable(tmp_path):
    engine, (raw, model, optimizer, criterion, loader), _ = _private()
    _loop(model, optimizer, criterion, loader)
    path = tmp_path / "ck.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=optimizer, checkpoint_dict={"epoch": 1})
    assert (path.stat().st_mode & 0o777) == 0o600
    other, (raw2, model2, optimizer2, _criterion2, _loader2), _ = _private()
    assert other.load_checkpoint(path=path, module=model2, optimizer=optimizer2) == {"epoch": 1}
    assert other.steps == 10 and other.get_epsilon(1e-5) == pytest.approx(engine.get_epsilon(1e-5))
    for a, b in zip(raw.parameters(), raw2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_ledger_is_charged_the_planned_spend_and_settled_at_what_ran(tmp_path):
    from featuredp.accounting import BudgetLedger

    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=50.0, delta=1e-5)
    with pytest.raises(ValueError, match="epochs"):
        _private(engine={"ledger": ledger})
    engine, (_raw, model, optimizer, criterion, loader), _ = _private(engine={"ledger": ledger}, epochs=3)
    assert ledger.spent() > 0  # reserved before the first step
    _loop(model, optimizer, criterion, loader)
    engine.close()
    spent = ledger.spent()
    assert spent == pytest.approx(engine.get_epsilon(1e-5), rel=0.05)


def test_secure_mode_draws_noise_and_batches_from_the_csprng_and_replays():
    from featuredp.noise import SecureNoise

    engine, (_raw, _model, _optimizer, _criterion, _loader), (x, y) = _private(engine={"secure_mode": True})
    assert isinstance(engine.run.state.noise, SecureNoise)
    assert engine.result().privacy_report["randomness"]["secure_rng"] is True
    reports = engine.check_model({"x": x, "y": y}, records=1, batch_size=12)
    assert reports[0].outcome == "passed" and reports[0].secure_rng


def test_bf16_steps_replay_within_the_bound():
    engine, (_raw, model, optimizer, criterion, loader), (x, y) = _private(precision="bf16")
    reports = engine.check_model({"x": x, "y": y}, records=1, batch_size=12)
    assert reports[0].outcome == "passed" and reports[0].precision == "bf16", str(reports[0])
    _loop(model, optimizer, criterion, loader)
    assert engine.steps == 10


def test_a_seed_is_secret_it_is_never_written_out(tmp_path):
    from featuredp.errors import PrivacyRiskWarning

    with pytest.warns(PrivacyRiskWarning):
        engine, (_raw, model, optimizer, criterion, loader), _ = _private(engine={"seed": 12345})
    _loop(model, optimizer, criterion, loader)
    report = json.dumps(engine.result().to_dict(), default=str)
    assert "12345" not in report and "12345" not in json.dumps(engine.plan.to_dict())


@pytest.mark.parametrize("noise", ["independent", "bandmf", "blt"])
@pytest.mark.parametrize("mode", ["ghost", "vmap"])
@pytest.mark.parametrize("method", ["dpsgd", "fdp_dpsgd", "fdp"])
def test_the_replay_passes_through_the_engine_for_every_method_strategy_and_noise_plan(method, mode, noise):
    from featuredp.data import load_dataset
    from featuredp.features import Columns

    warnings.simplefilter("ignore")
    train, _ = load_dataset("adult")
    x, y = torch.tensor(train.X[:300]), torch.tensor(train.y[:300])
    model = nn.Sequential(nn.Linear(x.shape[1], 8), nn.ReLU(), nn.Linear(8, 2))
    fdp = {} if method == "dpsgd" else {"feature_map": Columns(private=["sex", "race"]), "dataset": train,
                                        "method": method}  # fmt: skip
    engine = PrivacyEngine()
    engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                        data_loader=DataLoader(TensorDataset(x, y), batch_size=30), noise_multiplier=1.0,
                        max_grad_norm=1.0, grad_sample_mode=mode, noise=noise, epochs=2, **fdp)  # fmt: skip
    assert engine.plan.noise.kind == noise and engine.plan.method == method
    report = engine.check_model({"x": x, "y": y}, records=1, batch_size=12)[0]
    assert report.outcome == "passed", str(report)
    names = {c.name for c in report.checks}
    assert {"clipped sum sensitivity", "update sensitivity", "identical randomness"} <= names


def test_the_engine_and_its_wrappers_refuse_to_be_pickled_or_copied(tmp_path):
    # A pickled wrapper would write the run's secret noise and sampler state out; a copy would replay its noise.
    import copy
    import pickle

    engine, (raw, model, optimizer, criterion, _loader), _ = _private()
    for obj in (engine, model, optimizer, criterion):
        with pytest.raises(TypeError, match="secret"):
            pickle.dumps(obj)
        with pytest.raises(TypeError, match="secret"):
            copy.deepcopy(obj)
    with pytest.raises(TypeError, match="state_dict"):
        torch.save(model, tmp_path / "model.pt")
    torch.save(model.state_dict(), tmp_path / "weights.pt")  # the weights alone are what is released
    assert set(torch.load(tmp_path / "weights.pt")) == set(raw.state_dict())


def test_fdp_with_a_criterion_the_split_would_ignore_is_refused():
    from featuredp.data import load_dataset
    from featuredp.features import Columns

    train, _ = load_dataset("adult")
    model = nn.Linear(train.X.shape[1], 2)
    with pytest.raises(ValueError, match="loss_split"):
        PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(torch.tensor(train.X), torch.tensor(train.y)), batch_size=512),
            criterion=nn.MultiMarginLoss(), noise_multiplier=1.0, max_grad_norm=1.0,
            feature_map=Columns(private=["sex"]), dataset=train, grad_sample_mode="ghost")  # fmt: skip


@pytest.mark.parametrize("clipped", [True, False], ids=["clipped", "unclipped"])
def test_the_replay_of_a_dropout_model_passes_and_still_catches_a_clip_that_does_not_hold(monkeypatch, clipped):
    """nn.Dropout draws from torch's global generator: the replay gives every run the same draws (as it gives them
    the same streams), so a dropout model passes on its clipping alone; a clip that does not hold still fails."""
    from featuredp.step import StepCore

    real = StepCore.clipped_sum

    def unclipped(self, loss_fn, batch, draws, max_grad_norm, **kw):
        return real(self, loss_fn, batch, draws, 1e6 * max_grad_norm, **kw)

    x, y = _data(300)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    engine = PrivacyEngine()
    # C far below every record's gradient (a confident, correct record's is ~1e-3 at most scales): whichever records
    # the replay draws, unclipped they move the sum by more than C.
    engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        data_loader=DataLoader(TensorDataset(x, y), batch_size=20), noise_multiplier=1.0,
                        max_grad_norm=1e-5, grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss())  # fmt: skip
    if not clipped:
        monkeypatch.setattr(StepCore, "clipped_sum", unclipped)
    reports = engine.check_model(records=2, batch_size=16)
    assert [r.outcome for r in reports] == (["passed"] * 2 if clipped else ["failed"] * 2), str(reports[0])

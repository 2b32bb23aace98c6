"""The replay self-test with the record-level backstop (``record_epsilon=E``, issue 42).

With E, an FDP step has two noisy sums: the private batch's and the backstop's record batch's (Algorithm 1's public
batch, drawn by a secret Poisson sampler, clipped per record at C and noised at σ_pub·C). For record-level DP the
added record x must be controlled in both: the replay forces x into the record batch in the run with x and leaves it
out in the run without, every other draw held fixed, and checks each sum against its own sensitivity. Written as an
attacker would: a record batch clipped at 10·C, or released without its noise, must be reported as failed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _zoo import mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _fdp_synth import make_tabular
from featuredp import PrivacyEngine
from featuredp.engine import Trainer
from featuredp.features import Columns
from featuredp.step import StepCore
from featuredp.testing import replay_step
from featuredp.testing.replay import replay_engine_step

RECORD = 5  # the added record: large features, so its public gradient is far above C
BATCH = list(range(10, 34))
C = 0.1
RECORD_CHECKS = {"record clipped sum sensitivity", "record noise std requested", "record noise std drawn"}


def table():
    data = make_tabular(200, seed=1)  # the record batch (q'·n = 4·m) is a strict subset: x must be forced in
    data.X[RECORD] = [30.0, -2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    return data


def trainer(method: str = "fdp", strategy: str = "vmap", **kw) -> Trainer:
    extra = {} if method == "dpsgd" else {"feature_map": Columns(["sex", "race"])}
    torch.manual_seed(0)
    return Trainer(mlp(), method, steps=5, batch_size=16, noise_multiplier=1.0, max_grad_norm=C, delta=1e-4,
                   strategy=strategy, progress=False, record_epsilon=8.0, **extra, **kw)  # fmt: skip


def engine(strategy: str = "vmap") -> tuple[PrivacyEngine, dict[str, torch.Tensor]]:
    data = table()
    x, y = torch.tensor(data.X, dtype=torch.float32), torch.tensor(data.y).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 32), nn.Tanh(), nn.Linear(32, 2))  # 322 noised coordinates
    out = PrivacyEngine()
    out.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     data_loader=DataLoader(TensorDataset(x, y), batch_size=16), criterion=nn.CrossEntropyLoss(),
                     noise_multiplier=1.0, max_grad_norm=C, grad_sample_mode=strategy,
                     feature_map=Columns(private=["sex=F", "sex=M", "race=a", "race=b", "race=c"]),
                     feature_names=data.feature_names, record_epsilon=8.0, epochs=1)  # fmt: skip
    assert out.plan.record_noise_multiplier is not None  # the backstop noises the public batch
    return out, {"x": x, "y": y}


def replay(through: str, strategy: str = "vmap"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the backstop's notice on statistics from the data
        if through == "trainer":
            return replay_step(trainer(strategy=strategy), table(), record=RECORD, batch=BATCH)
        eng, data = engine(strategy)
        report = replay_engine_step(eng, data, record=RECORD, batch=BATCH)
        assert eng.steps == 0  # the replay leaves the run where it was
        return report


def broken_record_gradient(clip: float = 1.0, noised: bool = True):
    """StepCore.record_gradient as an attacker's variant: clipped at ``clip``·C, noised or not."""

    def record_gradient(self, state, split, batch, expected):
        plan = state.plan
        sums = self.clipped_sum(split.public_loss, batch, split.draws(batch, state.public_draws),
                                clip * plan.max_grad_norm)  # fmt: skip
        if noised:
            sums = state.noise.add(sums, plan.record_noise_multiplier * plan.max_grad_norm)
        return {k: v / expected for k, v in sums.items()}

    return record_gradient


@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
@pytest.mark.parametrize("through", ["trainer", "engine"])
def test_the_replay_passes_with_the_backstop_and_checks_both_noisy_sums(through, strategy):
    r = replay(through, strategy)
    assert r.outcome == "passed", str(r)
    checks = {c.name: c for c in r.checks}
    assert set(checks) >= RECORD_CHECKS | {"clipped sum sensitivity", "update divisor", "update sensitivity",
                                           "identical randomness", "noise std requested", "noise std drawn"}
    # x was forced into the record batch: its clipped public gradient moves that sum by exactly C (a tight check)
    assert checks["record clipped sum sensitivity"].value == pytest.approx(C, rel=1e-3)
    assert checks["clipped sum sensitivity"].value == pytest.approx(C, rel=1e-3)
    assert "w·Δ(noisy record sum)" in checks["update divisor"].what


@pytest.mark.parametrize("settings", [{"secure_rng": True}, {"public_weight": 0.5}, {"precision": "bf16"}],
                         ids=["secure", "w=0.5", "bf16"])
def test_the_backstop_replay_passes_with_secure_noise_another_weight_and_bf16(settings):
    # w scales the record sum's term in the update: the divisor check must use w·Δ/(q'·n), not Δ/(q'·n).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = replay_step(trainer(**settings), table(), record=RECORD, batch=BATCH)
    assert r.outcome == "passed", str(r)
    assert {c.name for c in r.checks} >= RECORD_CHECKS


@pytest.mark.parametrize("through", ["trainer", "engine"])
def test_a_record_batch_clipped_at_ten_c_fails_the_replay(through, monkeypatch):
    monkeypatch.setattr(StepCore, "record_gradient", broken_record_gradient(clip=10.0))
    r = replay(through)
    assert r.outcome == "failed", str(r)
    failed = {c.name for c in r.failures()}
    assert "record clipped sum sensitivity" in failed, str(r)
    assert {c.name: c for c in r.checks}["record clipped sum sensitivity"].value > 2 * C


@pytest.mark.parametrize("through", ["trainer", "engine"])
def test_a_record_batch_released_without_noise_fails_the_replay(through, monkeypatch):
    monkeypatch.setattr(StepCore, "record_gradient", broken_record_gradient(noised=False))
    r = replay(through)
    assert r.outcome == "failed", str(r)
    assert "record noise std requested" in {c.name for c in r.failures()}, str(r)


def test_the_faithful_variant_of_the_attackers_helper_passes(monkeypatch):
    # The broken variants above differ from the engine's own step only in the clip or the noise: with both as
    # the engine has them the replay passes, so their failures are the clip's and the noise's, not the helper's.
    monkeypatch.setattr(StepCore, "record_gradient", broken_record_gradient())
    r = replay("trainer")
    assert r.outcome == "passed", str(r)


def test_dpsgd_with_record_epsilon_replays_as_without_it():
    # DP-SGD is record-level already: the backstop only checks E against its epsilon; no second sum to check.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with_e = replay_step(trainer("dpsgd"), table(), record=RECORD, batch=BATCH)
        torch.manual_seed(0)
        without = replay_step(Trainer(mlp(), "dpsgd", steps=5, batch_size=16, noise_multiplier=1.0, max_grad_norm=C,
                                      delta=1e-4, strategy="vmap", progress=False),
                              table(), record=RECORD, batch=BATCH)  # fmt: skip
    assert with_e.outcome == "passed", str(with_e)
    assert [c.name for c in with_e.checks] == [c.name for c in without.checks]
    assert not RECORD_CHECKS & {c.name for c in with_e.checks}

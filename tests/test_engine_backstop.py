"""The record-level backstop (``record_epsilon=E``, issue 34 C): with E every step that reads the public view is a
record-level DP step (Poisson coins from a secret stream of its own, clipping at C, noise σ_pub·C over the expected
batch); without it the run is today's, with no extra coins or noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from _fdp_synth import make_tabular
from featuredp import run as run_module
from featuredp import run_state, sampling
from featuredp.batches import as_batch, gather, to_device
from featuredp.engine import Trainer
from featuredp.errors import UnreachableTargetError
from featuredp.features import Columns
from featuredp.losses import Masking
from featuredp.noise import TorchNoise
from featuredp.run_state import torch_generator
from featuredp.sampling import PoissonSampler

_COLS = ["sex", "race"]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 8), nn.Tanh(), nn.Linear(8, 2))


def _trainer(method: str = "fdp", **kw) -> Trainer:
    settings = dict(steps=4, batch_size=12, public_batch_size=24, noise_multiplier=1.0, max_grad_norm=0.5, lr=0.1,
                    seed=3, progress=False, strategy="vmap")  # fmt: skip
    if method in ("fdp", "fdp_dpsgd"):
        settings["pretrain_epochs"] = 0.5
    if method in ("public", "nonprivate"):
        settings.pop("noise_multiplier")
    settings.update(kw)
    fmap = {} if method in ("dpsgd", "nonprivate") else {"loss_split": Masking(Columns(_COLS))}
    return Trainer(_mlp(), method, **fmap, **settings)


def _state(trainer: Trainer, data):
    b_all = as_batch(data)
    n = int(next(iter(b_all.values())).shape[0])
    state, split = trainer._run_state(data, b_all, n, None)
    return state, split, to_device(b_all, trainer.device)


class _ZeroNoise:
    """Adds nothing; records the std asked for."""

    tail_mass_per_pair = 0.0
    description = "zero (test)"

    def __init__(self) -> None:
        self.stds: list[float] = []

    def add(self, sums, std):
        self.stds.append(float(std))
        return {k: v.detach().clone() for k, v in sums.items()}


# ---------------------------------------------------------------------------------------------------------------
# E = None: today's run
# ---------------------------------------------------------------------------------------------------------------
def _count_draws(monkeypatch) -> dict[str, int]:
    counts = {"noise": 0, "poisson_samplers": 0, "poisson_samples": 0}
    add = TorchNoise.add

    def counting_add(self, sums, std):
        counts["noise"] += 1
        return add(self, sums, std)

    class CountingPoisson(PoissonSampler):
        def __init__(self, *a, **k):
            counts["poisson_samplers"] += 1
            super().__init__(*a, **k)

        def sample(self):
            counts["poisson_samples"] += 1
            return super().sample()

    monkeypatch.setattr(TorchNoise, "add", counting_add)
    monkeypatch.setattr(run_state, "PoissonSampler", CountingPoisson)  # the backstop's samplers
    monkeypatch.setattr(sampling, "PoissonSampler", CountingPoisson)  # the private one (the noise plan's)
    return counts


def test_without_a_backstop_the_run_is_bit_for_bit_and_draws_no_public_noise_or_coins(monkeypatch) -> None:
    data = make_tabular(120, seed=1)
    a, b = _trainer(), _trainer(record_epsilon=None)
    ra, rb = a.fit(data), b.fit(data)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    assert ra.record_epsilon is None and rb.plan.record_noise_multiplier is None
    counts = _count_draws(monkeypatch)
    t = _trainer()
    r = t.fit(data)
    # one noise draw and one Poisson batch per private step, nothing for pre-training or the public batch
    assert r.pretrain_steps > 0 and counts == {"noise": r.steps, "poisson_samplers": 1, "poisson_samples": r.steps}
    assert t.run.state is not None and t.run.state.streams.record_sampling is None
    assert "public_loss" in r.history[-1]  # the public batch's loss is still shown: it reads Ψ(S) only


def test_with_a_backstop_every_public_and_pretraining_step_is_sampled_and_noised(monkeypatch) -> None:
    counts = _count_draws(monkeypatch)
    r = _trainer(record_epsilon=8.0).fit(make_tabular(120, seed=1))
    steps = r.steps + r.pretrain_steps + r.steps  # private, pre-training, Algorithm 1's public batches
    assert counts == {"noise": steps, "poisson_samplers": 3, "poisson_samples": steps}
    assert all("public_loss" not in h for h in r.history)  # a secret batch's unnoised loss is not shown


# ---------------------------------------------------------------------------------------------------------------
# E set: the public step's mechanism
# ---------------------------------------------------------------------------------------------------------------
def test_the_public_step_clips_each_record_at_c() -> None:
    """Replay with every draw fixed: one more record with a huge gradient moves the clipped sum by <= C."""
    data = make_tabular(120, seed=9)
    with torch.no_grad():
        data.X[7] *= 50.0
    t = _trainer(record_epsilon=8.0)
    state, split, b_all = _state(t, data)
    state.noise = _ZeroNoise()  # type: ignore[assignment]
    sampler = state.record_sampler
    assert sampler is not None
    batch = np.arange(20, 44)
    sums = []
    for idx in (batch, np.sort(np.append(batch, 7))):
        sampler.sample = lambda idx=idx: idx  # type: ignore[method-assign]
        g = t.run.record_gradient(state, split, _fetch(b_all), pre=False)
        sums.append(torch.cat([v.flatten() for v in g.values()]) * sampler.expected_batch_size)
    moved = float((sums[1] - sums[0]).norm())
    assert moved <= 0.5 * (1 + 1e-4)
    assert moved > 0.45  # the record's own contribution, clipped to about C: an unclipped step moves far more
    assert state.noise.stds == [t.plan.record_noise_multiplier * 0.5] * 2


def _noise_std_matches(residuals: torch.Tensor, std: float) -> bool:
    return abs(float(residuals.std()) / std - 1) < 0.08


@pytest.mark.statistical
def test_the_public_step_adds_noise_of_std_sigma_pub_times_c() -> None:
    data = make_tabular(120, seed=2)
    t = _trainer(record_epsilon=8.0)
    state, split, b_all = _state(t, data)
    sampler = state.record_sampler
    assert sampler is not None and t.plan is not None and t.plan.record_noise_multiplier is not None
    sampler.sample = lambda: np.arange(30, 54)  # type: ignore[method-assign]
    state.noise = _ZeroNoise()  # type: ignore[assignment]
    clean = torch.cat([v.flatten() for v in t.run.record_gradient(state, split, _fetch(b_all), pre=False).values()])
    state.noise = TorchNoise(torch_generator(12345, t.device))
    residuals = torch.cat([
        torch.cat([v.flatten() for v in t.run.record_gradient(state, split, _fetch(b_all), pre=False).values()]) - clean
        for _ in range(30)]) * sampler.expected_batch_size  # fmt: skip
    target = t.plan.record_noise_multiplier * 0.5
    assert residuals.numel() >= 2000
    assert _noise_std_matches(residuals, target)
    assert not _noise_std_matches(residuals * 2 / 3, target)  # the test has the power to see 2/3 of the noise


@pytest.mark.statistical
def test_the_public_batches_are_poisson_at_rate_m_prime_over_n_from_a_secret_stream_of_their_own() -> None:
    t = _trainer(record_epsilon=8.0)
    state, _, _ = _state(t, make_tabular(120, seed=2))
    rec, pre = state.record_sampler, state.record_pretrain_sampler
    assert rec is not None and pre is not None
    assert rec.sampling_rate == pytest.approx(24 / 120) and pre.sampling_rate == pytest.approx(24 / 120)
    sizes = np.array([len(rec.sample()) for _ in range(400)])
    n, q = 120, 0.2
    assert abs(sizes.mean() - n * q) < 5 * math.sqrt(n * q * (1 - q) / 400)
    assert sizes.var() > 0.5 * n * q * (1 - q)  # Poisson: the size varies (a uniform batch of m' would not)
    # its own stream: neither the private batch's nor a public one
    streams = state.streams
    assert rec.generator is streams.record_sampling
    assert all(rec.generator is not g for g in (streams.private_sampling, streams.public_sampling,
                                                  streams.public_draws, streams.noise))  # fmt: skip


def test_the_public_coins_are_independent_of_the_private_coins_and_not_publicly_seeded() -> None:
    data = make_tabular(120, seed=2)
    # the private coins are those of a run without a backstop (the record stream is a child no one else uses)
    with_e, _, _ = _state(_trainer(record_epsilon=8.0), data)
    without, _, _ = _state(_trainer(), data)
    assert [list(with_e.private_sampler.sample()) for _ in range(5)] == [
        list(without.private_sampler.sample()) for _ in range(5)]  # fmt: skip
    # a published public seed does not fix the backstop's coins (secret: OS entropy without seed=)
    draws = []
    for _ in range(2):
        state, _, _ = _state(_trainer(record_epsilon=8.0, seed=None, public_seed=7), data)
        assert state.record_sampler is not None
        draws.append([list(state.record_sampler.sample()) for _ in range(3)])
    assert draws[0] != draws[1]


# ---------------------------------------------------------------------------------------------------------------
# results and refusals
# ---------------------------------------------------------------------------------------------------------------
def test_record_epsilon_in_the_result_null_without_backstop_eps_for_dpsgd_at_most_e_with_one() -> None:
    data = make_tabular(120, seed=4)
    plain = _trainer().fit(data)
    assert plain.record_epsilon is None and plain.to_dict()["record_epsilon"] is None
    assert "NOT covered" in plain.guarantee
    dp = _trainer("dpsgd").fit(data)
    assert dp.record_epsilon == dp.epsilon
    for method in ("fdp", "fdp_dpsgd", "public"):
        r = _trainer(method, record_epsilon=6.0).fit(data)
        assert r.record_epsilon is not None and 0.99 * 6.0 <= r.record_epsilon <= 6.0, method
        assert r.to_dict()["record_epsilon"] == r.record_epsilon
        assert "DP for whole records (every pre-training, public and private step clipped and noised)" in r.guarantee
        assert r.privacy_report["record_level"]["public_noise_multiplier"] == r.plan.record_noise_multiplier
        if method != "public":
            assert r.epsilon == pytest.approx(plain.epsilon)  # the FDP ε is unchanged
    # w = 0: no public batch, only pre-training is noised
    z = _trainer(record_epsilon=6.0, public_weight=0.0).fit(data)
    assert z.privacy_report["record_level"]["public_steps"] == 0 and z.privacy_report["record_level"][
        "pretrain_steps"] == z.pretrain_steps  # fmt: skip


def test_refusals_are_one_line_naming_record_epsilon(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"record_epsilon .* not method=.nonprivate."):
        _trainer("nonprivate", record_epsilon=4.0)
    for noise in ("bandmf", "blt"):
        with pytest.raises(ValueError, match=f"record_epsilon .* not supported with noise='{noise}'"):
            _trainer(record_epsilon=4.0, noise=noise)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="record_epsilon"):
            _trainer(record_epsilon=bad)
    data = make_tabular(120, seed=4)
    with pytest.raises(UnreachableTargetError, match=r"--record-epsilon 0\.1 cannot be met"):
        _trainer("dpsgd", record_epsilon=0.1).fit(data)
    with pytest.raises(UnreachableTargetError, match=r"--record-epsilon 0\.1 cannot be met: the private steps alone"):
        _trainer(record_epsilon=0.1).fit(data)
    with pytest.raises(ValueError, match="needs noise on the private steps"):
        _trainer(record_epsilon=4.0, noise_multiplier=0.0).fit(data)
    monkeypatch.setattr(run_module, "context", lambda *a, **k: object())
    with pytest.raises(ValueError, match="not supported in data-parallel runs"):
        _trainer(record_epsilon=4.0)


def test_a_backstop_run_resumes_from_its_checkpoint(tmp_path) -> None:
    data = make_tabular(120, seed=4)
    ck = tmp_path / "ck.pt"
    first = _trainer(record_epsilon=8.0, steps=6)
    first.fit(data, checkpoint=ck, max_steps=4)
    again = _trainer(record_epsilon=8.0, steps=6)
    r = again.fit(data, checkpoint=ck, resume=True)
    assert r.steps == 6 and r.record_epsilon is not None and r.record_epsilon <= 8.0


def test_the_replay_self_test_covers_a_backstop_trainer_and_its_record_batch() -> None:
    from featuredp.testing import replay_step

    r = replay_step(_trainer(record_epsilon=8.0), make_tabular(60, seed=1), record=3, batch=[5, 6, 7])
    assert r.outcome == "passed", str(r)
    names = {c.name for c in r.checks}
    assert {"clipped sum sensitivity", "record clipped sum sensitivity", "record noise std requested"} <= names


def test_encoding_statistics_from_the_data_are_named_outside_the_record_level_guarantee() -> None:
    from featuredp.errors import PrivacyLeakWarning

    data = make_tabular(120, seed=4)
    data.statistics_from_data = {"age": "bounds"}  # type: ignore[attr-defined]
    with pytest.warns(PrivacyLeakWarning, match="record-level backstop .* protects whole records"):
        _trainer(record_epsilon=8.0, steps=1).fit(data)




def test_a_resume_rekeys_the_backstop_coins(tmp_path, monkeypatch) -> None:
    """Whoever read the checkpoint must not predict the backstop's public batches after a resume (its coins are as
    secret as the private batch's): the record stream is re-keyed with the private ones, and a secure run's record
    sampler gets a fresh ChaCha20 key as the private sampler does."""
    from featuredp.sampling import PoissonSampler, make_streams

    streams = make_streams(1, record=True)
    assert streams.record_sampling is not None
    before = repr(streams.record_sampling.bit_generator.state)
    streams.rekey_private()
    assert repr(streams.record_sampling.bit_generator.state) != before

    data = make_tabular(120, seed=4)
    ck = tmp_path / "ck.pt"
    _trainer(record_epsilon=8.0, steps=6, secure_rng=True).fit(data, checkpoint=ck, max_steps=3)
    rekeyed: list[float] = []
    original = PoissonSampler.rekey
    monkeypatch.setattr(PoissonSampler, "rekey", lambda self: (rekeyed.append(self.sampling_rate), original(self)))
    _trainer(record_epsilon=8.0, steps=6, secure_rng=True).fit(data, checkpoint=ck, resume=True, max_steps=1)
    assert len(rekeyed) == 2  # the private sampler's key and the backstop's (shared by its two samplers)


def _fetch(batch):
    return lambda idx: gather(batch, idx)

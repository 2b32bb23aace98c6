"""User-level privacy (``user_key=``): a person with many records is one unit.

Written as an attacker would: the frequent author of 500 records must move the released sum by no more than a
one-record author does; the sampler must flip one secret coin per user (not per record, and not by the records'
order); the printed ε must be that of users sampled at q_users; and the two loops must release the same thing.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine
from featuredp.clipping import VmapGradients
from featuredp.engine import Trainer
from featuredp.errors import DataValidationError, PrivacyLeakWarning
from featuredp.run import PrivateRun
from featuredp.users import UserIndex, whole_users
from featuredp.utils.batch_memory_manager import BatchMemoryManager

SIZES = [1, 2, 7, 30, 120, 500]  # one user of each size: the last is the frequent author


def _keys(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


def _data(n: int, d: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = 5 * torch.randn(n, d, generator=g)  # large inputs: every gradient is far above C
    return x, (x[:, 0] > 0).long()


def _loss(m: nn.Module, batch: dict, draws: dict) -> torch.Tensor:
    return nn.functional.cross_entropy(m(batch["x"]), batch["y"], reduction="none")


def _flat(sums: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten() for v in sums.values()]).double()


def _group_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, keys: np.ndarray, chunk: int = 64
               ) -> dict[str, torch.Tensor]:  # fmt: skip
    index = UserIndex(keys)
    rec, groups = index.expand(np.arange(index.num_users), np.random.default_rng(0))
    return VmapGradients(chunk).clipped_sum_by_group(model, _loss, {"x": x[rec], "y": y[rec]}, {}, 1.0,
                                                     torch.from_numpy(groups))[0]  # fmt: skip


# -- clipping -------------------------------------------------------------------------------------------------
def test_one_users_whole_change_moves_the_clipped_sum_by_at_most_c():
    keys = _keys(SIZES)
    x, y = _data(len(keys))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    full = _flat(_group_sum(model, x, y, keys))
    for u, size in enumerate(SIZES):
        keep = keys != u
        without = _flat(_group_sum(model, x[keep], y[keep], keys[keep]))
        assert float((full - without).norm()) <= 1.0 + 1e-5, (size, float((full - without).norm()))
        other_x, other_y = x.clone(), y.clone()  # replace every record of u with other values
        other_x[~keep] = -3 * x[~keep] + 1
        other_y[~keep] = 1 - y[~keep]
        swapped = _flat(_group_sum(model, other_x, other_y, keys))
        assert float((full - swapped).norm()) <= 2.0 + 1e-5, size
    # The same test on per-record clipping fails for the frequent author: it would move the sum by ~500 C.
    keep = keys != len(SIZES) - 1
    record_level = VmapGradients(64).clipped_sum(model, _loss, {"x": x, "y": y}, {}, 1.0)[0]
    record_without = VmapGradients(64).clipped_sum(model, _loss, {"x": x[keep], "y": y[keep]}, {}, 1.0)[0]
    assert float((_flat(record_level) - _flat(record_without)).norm()) > 100


def test_the_group_sum_is_each_users_summed_gradient_clipped_whatever_the_chunking():
    keys = _keys(SIZES)
    x, y = _data(len(keys), seed=1)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    grads = VmapGradients(None).per_example_grads(model, _loss, {"x": x, "y": y}, {})
    flat = torch.cat([g.reshape(len(keys), -1) for g in grads.values()], 1).double()
    expected = torch.zeros(flat.shape[1], dtype=torch.float64)
    for u in range(len(SIZES)):
        g = flat[keys == u].sum(0)
        expected += g * min(1.0, 1.0 / (float(g.norm()) + 1e-6))
    for chunk in (1, 7, 64, 10_000):  # a user cut by many chunks carries its partial sum
        got = _flat(_group_sum(model, x, y, keys, chunk))
        assert torch.allclose(got, expected, atol=1e-5), chunk


def test_groups_must_be_contiguous_users_numbered_in_order():
    x, y = _data(4)
    with pytest.raises(ValueError, match="contiguous"):
        VmapGradients().clipped_sum_by_group(nn.Linear(4, 2), _loss, {"x": x, "y": y}, {}, 1.0,
                                             torch.tensor([0, 1, 0, 1]))  # fmt: skip


def test_a_chunk_holding_part_of_a_user_is_refused():
    groups = np.array([0, 0, 1, 1, 1])
    batch = {"x": torch.zeros(2, 3)}
    with pytest.raises(RuntimeError, match="whole users"):
        whole_users(groups, np.array([1, 2]), batch, {})
    out_batch, _, rows, g = whole_users(groups, np.array([4, 0, 3, 1, 2]), {"x": torch.arange(5.0)[:, None]}, {})
    assert g.tolist() == [0, 0, 1, 1, 1] and rows.tolist() == [0, 1, 4, 3, 2]
    assert out_batch["x"].flatten().tolist() == [1.0, 3.0, 0.0, 2.0, 4.0]


# -- the sampler ----------------------------------------------------------------------------------------------
def _started(keys, *, seed=None, rate=0.1, k=None, public_seed=None):
    x, y = _data(len(keys))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = PrivateRun(nn.Linear(4, 2), "dpsgd", user_key=keys, noise_multiplier=1.0, max_grad_norm=1.0,
                         sampling_rate=rate, steps=10, delta=1e-5, seed=seed, public_seed=public_seed,
                         records_per_user=k, progress=False)  # fmt: skip
        run.bind_users(keys, len(keys))
        run.start({"x": x, "y": y}, "d", len(keys))
    return run


@pytest.mark.statistical
def test_the_sampler_flips_one_coin_per_user_not_per_record():
    keys = _keys(SIZES)
    run = _started(keys, seed=11, rate=0.1)
    draws = 3000
    hits = np.zeros(len(SIZES))
    for _ in range(draws):
        idx, groups = run.draw(run.state)
        users = np.unique(keys[idx])
        assert len(users) == int(groups.max()) + 1 if len(idx) else True
        hits[users] += 1
    # Each user, whatever its size, joins at rate q (±5 sd); per-record coins would put the 500-record user in
    # almost every draw (1 − 0.9^500 ≈ 1).
    sd = math.sqrt(draws * 0.1 * 0.9)
    assert np.all(np.abs(hits - 0.1 * draws) < 5 * sd), hits


def test_the_users_drawn_do_not_depend_on_the_records_order():
    keys = np.array(["ann"] * 3 + ["bob"] * 5 + ["cy"] + ["dee"] * 2 + [f"u{i}" for i in range(40)], dtype=object)
    order = np.random.default_rng(3).permutation(len(keys))
    a, b = _started(list(keys), seed=5, rate=0.3), _started(list(keys[order]), seed=5, rate=0.3)
    for _ in range(20):
        ia, _ = a.draw(a.state)
        ib, _ = b.draw(b.state)
        assert set(keys[ia]) == set(keys[order][ib])


def test_the_coins_are_the_private_streams_not_the_public_seeds():
    keys = _keys([3] * 200)
    a, b = _started(keys, public_seed=0), _started(keys, public_seed=0)
    assert a.state.private_sampler.generator is a.state.streams.private_sampling
    drawn_a = [tuple(a.draw(a.state)[0]) for _ in range(5)]
    drawn_b = [tuple(b.draw(b.state)[0]) for _ in range(5)]
    assert drawn_a != drawn_b  # the same published seed, different secret coins
    assert "seed" not in a.config() or a.config().get("seeded") is False


@pytest.mark.statistical
def test_a_large_users_records_are_a_uniform_secret_subset_of_k():
    keys = _keys([500, 2])
    run = _started(keys, seed=2, rate=1.0, k=3)
    counts = np.zeros(502)
    for _ in range(2000):
        idx, groups = run.draw(run.state)
        assert groups.tolist() == [0, 0, 0, 1, 1]  # k of the large user's, all of the small one's
        assert len(set(idx[:3].tolist())) == 3 and set(idx[:3].tolist()) <= set(range(500))
        counts[idx] += 1
    big = counts[:500]  # each record in 3/500 of the draws: 12 on average; a fixed prefix would be 2000 or 0
    assert big.max() < 40 and (big > 0).mean() > 0.99
    chi2 = float(((big - 12) ** 2 / 12).sum())
    assert chi2 < 500 + 5 * math.sqrt(2 * 500), chi2


# -- accounting -----------------------------------------------------------------------------------------------
def test_the_epsilon_is_dp_accountings_for_users_sampled_at_q_users():
    sizes = [1 + (i * 7) % 40 for i in range(120)]  # 120 users, 2,400-odd records
    keys = _keys(sizes)
    x, y = _data(len(keys))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(nn.Linear(4, 2), "dpsgd", user_key=keys, batch_size=12, steps=30, noise_multiplier=1.1,
                          max_grad_norm=1.0, delta=1e-5, progress=False, num_users=120)  # fmt: skip
        result = trainer.fit({"x": x, "y": y})
    q = 12 / 120
    assert result.plan.sampling_rate == pytest.approx(q) and result.plan.unit == "user"
    for relation, got in ((dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, result.epsilon),
                          (dp_accounting.NeighboringRelation.REPLACE_ONE, result.replacement_epsilon)):
        acc = pld_privacy_accountant.PLDAccountant(relation)
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.1)), 30)
        assert got == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)
    record_q = 12 / len(keys)  # what accounting by records would have used: a far smaller, false ε
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(record_q, dp_accounting.GaussianDpEvent(1.1)), 30)
    assert acc.get_epsilon(1e-5) < 0.5 * result.epsilon
    assert "whole users" in result.guarantee


def test_an_undeclared_number_of_users_is_warned_about_and_a_wrong_one_refused():
    keys = _keys([2, 3, 4])
    x, y = _data(len(keys))
    trainer = Trainer(nn.Linear(4, 2), "dpsgd", user_key=keys, batch_size=1, steps=1, noise_multiplier=1.0,
                      delta=1e-5, progress=False)  # fmt: skip
    with pytest.warns(PrivacyLeakWarning, match="number of users"):
        trainer.fit({"x": x, "y": y})
    wrong = Trainer(nn.Linear(4, 2), "dpsgd", user_key=keys, batch_size=1, steps=1, noise_multiplier=1.0,
                    delta=1e-5, progress=False, num_users=4)  # fmt: skip
    with pytest.raises(DataValidationError, match="num_users=4"):
        wrong.fit({"x": x, "y": y})


# -- the step -------------------------------------------------------------------------------------------------
def test_with_no_noise_and_no_clip_the_user_level_step_is_plain_sgd():
    keys = _keys([3, 1, 6])
    x, y = _data(len(keys))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(model, "dpsgd", user_key=keys, sampling_rate=1.0, steps=1, noise_multiplier=0.0,
                max_grad_norm=math.inf, delta=1e-5, lr=0.5, momentum=0.0, progress=False,
                num_users=3).fit({"x": x, "y": y})  # fmt: skip
    loss = nn.functional.cross_entropy(reference(x), y, reduction="sum") / 3  # the sum over users / m = q·U
    loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.5 * p.grad
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_replacing_every_record_of_the_frequent_author_moves_one_step_by_at_most_2c():
    keys = _keys(SIZES)
    x, y = _data(len(keys))
    other_x, other_y = x.clone(), y.clone()
    big = keys == len(SIZES) - 1
    other_x[big], other_y[big] = -x[big] + 4, 1 - y[big]
    moved = []
    for xs, ys in ((x, y), (other_x, other_y)):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Trainer(model, "dpsgd", user_key=keys, sampling_rate=1.0, steps=1, noise_multiplier=0.0,
                    max_grad_norm=1.0, delta=1e-5, lr=1.0, momentum=0.0, progress=False, seed=9,
                    num_users=len(SIZES)).fit({"x": xs, "y": ys})  # fmt: skip
        moved.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    # θ moves by lr · Δsum / m with m = q·U = 6 users: at most 2C / 6
    assert float((moved[0] - moved[1]).norm()) <= 2.0 / len(SIZES) + 1e-5


@pytest.mark.parametrize("physical", [None, 5])
def test_the_engines_and_the_trainers_user_level_steps_agree(physical):
    keys = _keys([1, 4, 9, 2, 30, 3, 3, 8] * 5)
    x, y = _data(len(keys))
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    steps, users, batch = 5, 40, 8  # one epoch of the engine's loader: ⌈40 users / 8⌉ draws
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trained = copy.deepcopy(model)
        trainer = Trainer(trained, "dpsgd", user_key=keys, noise_multiplier=1.0, max_grad_norm=1.0,
                          sampling_rate=batch / users, steps=steps, delta=1e-5, seed=77, lr=0.1, momentum=0.0,
                          progress=False, records_per_user=5, num_users=users)  # fmt: skip
        trainer.fit({"x": x, "y": y})
        mine = copy.deepcopy(model)
        engine = PrivacyEngine(seed=77)
        m, o, loader = engine.make_private(
            module=mine, optimizer=torch.optim.SGD(mine.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=batch), noise_multiplier=1.0, max_grad_norm=1.0,
            steps=steps, user_key=keys, records_per_user=5, num_users=users)  # fmt: skip
        assert len(loader) == steps
        criterion = nn.CrossEntropyLoss()
        if physical is None:
            batches = loader
        else:
            manager = BatchMemoryManager(data_loader=loader, max_physical_batch_size=physical, optimizer=o)
            batches = manager.__enter__()
        for xb, yb in batches:
            o.zero_grad()
            criterion(m(xb), yb).backward()
            o.step()
    assert engine.steps == trainer.run.state.private_steps == steps
    for a, b in zip(trained.parameters(), mine.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), float((a - b).abs().max())
    assert engine.get_epsilon(1e-5) == trainer.result.epsilon
    assert engine.plan.unit == "user" and engine.plan.dataset_size == users


# -- refusals -------------------------------------------------------------------------------------------------
def test_user_level_settings_that_cannot_hold_are_refused_in_one_line():
    keys = _keys([2, 2])
    with pytest.raises(ValueError, match="strategy='vmap'"):
        Trainer(nn.Linear(4, 2), "dpsgd", user_key=keys, strategy="ghost", steps=1, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="num_users=2 is for user-level"):
        Trainer(nn.Linear(4, 2), "dpsgd", num_users=2, steps=1, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="records_per_user=3 is for user-level"):
        Trainer(nn.Linear(4, 2), "dpsgd", records_per_user=3, steps=1, noise_multiplier=1.0)
    x, y = _data(5)
    trainer = Trainer(nn.Linear(4, 2), "dpsgd", user_key=keys, steps=1, noise_multiplier=1.0, batch_size=1,
                      progress=False)  # fmt: skip
    with pytest.raises(DataValidationError, match="4 keys for 5 records"):
        trainer.fit({"x": x, "y": y})
    x, y = _data(4)
    engine = PrivacyEngine()
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="grad_sample_mode='ghost'"):
        engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            data_loader=DataLoader(TensorDataset(x, y), batch_size=1), noise_multiplier=1.0,
                            max_grad_norm=1.0, grad_sample_mode="ghost", user_key=keys)  # fmt: skip


def test_the_user_key_can_name_a_tensor_of_the_data_which_the_model_never_sees():
    keys = _keys([2, 5, 1, 3])
    x, y = _data(len(keys))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(nn.Linear(4, 2), "dpsgd", user_key="author", sampling_rate=0.5, steps=2,
                          noise_multiplier=1.0, delta=1e-5, progress=False)  # fmt: skip
        result = trainer.fit({"x": x, "y": y, "author": torch.from_numpy(keys)})
    assert result.plan.dataset_size == 4 and result.plan.records == len(keys)
    config = trainer.run.config()
    assert config["unit"] == "user" and config["user_key"] == "author"


# -- the backstop ---------------------------------------------------------------------------------------------
def test_the_backstop_at_user_level_clips_each_users_public_gradients_as_one():
    """With a user key, the backstop's public steps sample users and clip each user's ℓ_pub sum: replacing every
    record of the 500-record author moves one noised public step by at most 2C / (expected users)."""
    from featuredp.features import Columns

    keys = _keys(SIZES)
    x, _ = _data(len(keys))
    big = keys == len(SIZES) - 1
    other = x.clone()
    other[big] = -x[big] + 4
    steps = []
    for xs in (x, other):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = PrivateRun(nn.Linear(4, 2), "public", feature_map=Columns(private=["c1"]), user_key=keys,
                             record_epsilon=8.0, delta=1e-5, max_grad_norm=1.0, steps=2, batch_size=6,
                             public_batch_size=6, seed=5, num_users=len(SIZES), progress=False)  # fmt: skip
            torch.manual_seed(0)
            run.model.load_state_dict(nn.Linear(4, 2).state_dict())
            run.bind_users(keys, len(keys))
            data = {"x": xs, "y": _data(len(keys))[1]}
            state, split = run.start(_named(data), "d", len(keys))
            assert state.plan.public_sampling_rate == 1.0  # every user, every step: the same coins in both runs
            batch = {k: v for k, v in data.items()}

            def fetch(idx, batch=batch):
                return {k: v[torch.as_tensor(idx)] for k, v in batch.items()}

            steps.append(_flat(run.record_gradient(state, split, fetch, pre=False)))
    assert float((steps[0] - steps[1]).norm()) <= 2.0 / len(SIZES) + 1e-5
    assert "whole users" in state.plan.guarantee(1.0, None, record_epsilon=7.9)


def _named(data: dict) -> Any:
    from featuredp.data.tabular import TabularDataset

    return TabularDataset("t", data["x"].numpy(), data["y"].numpy(), [f"c{i}" for i in range(4)],
                          [f"c{i}" for i in range(4)], "y", ["0", "1"])


def test_a_user_level_run_resumes_from_its_checkpoint_and_refuses_other_users(tmp_path):
    keys = _keys([3, 5, 2, 7] * 5)
    x, y = _data(len(keys))
    ck = tmp_path / "ck.pt"

    def trainer() -> Trainer:
        return Trainer(nn.Linear(4, 2), "dpsgd", user_key=keys, sampling_rate=0.25, steps=6, noise_multiplier=1.0,
                       delta=1e-5, progress=False, num_users=20)  # fmt: skip

    first = trainer()
    first.fit({"x": x, "y": y}, checkpoint=ck, max_steps=3)
    again = trainer()
    result = again.fit({"x": x, "y": y}, checkpoint=ck, resume=True)
    assert result.steps == 6 and result.plan.unit == "user"
    moved = np.roll(keys, 1)  # the same records, another grouping: another dataset of users
    other = Trainer(nn.Linear(4, 2), "dpsgd", user_key=moved, sampling_rate=0.25, steps=6, noise_multiplier=1.0,
                    delta=1e-5, progress=False, num_users=20)  # fmt: skip
    with pytest.raises(ValueError, match="data"):
        other.fit({"x": x, "y": y}, checkpoint=ck, resume=True)


def test_the_replay_self_test_says_it_has_no_user_level_replay_yet():
    keys = _keys([2, 3])
    x, y = _data(5)
    trainer = Trainer(nn.Linear(4, 2), "dpsgd", user_key=keys, batch_size=1, steps=1, noise_multiplier=1.0,
                      progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="user-level run's replay"):
        trainer.check_model({"x": x, "y": y})

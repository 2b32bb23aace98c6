"""The user's loop gets no trust: every loop habit that made the printed ε false is refused or accounted for.

Each test is an attack or a habit from the review of the own-loop engine (issue 42), with the old code's figure in
its comment; the printed ε must either answer for what ran or the habit must be refused in one line.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from featuredp import PrivacyEngine
from featuredp.cli import main
from featuredp.errors import PrivacyLeakWarning
from featuredp.features import Columns
from featuredp.step import StepCore


def _data(n: int = 400, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def _private(n: int = 400, batch: int = 40, **kw):
    x, y = _data(n)
    model = nn.Sequential(nn.Linear(x.shape[1], 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    engine = PrivacyEngine()
    loader = kw.pop("loader", None) or DataLoader(TensorDataset(x, y), batch_size=batch)
    out = engine.make_private(module=model, optimizer=opt, data_loader=loader, criterion=nn.CrossEntropyLoss(),
                              noise_multiplier=kw.pop("sigma", 1.0), max_grad_norm=1.0, **kw,
                              grad_sample_mode="ghost")  # fmt: skip
    return engine, (model, *out), (x, y), loader


def _account(sigma: float, q: float, steps: int, capsys) -> float:
    assert main(["account", "--noise-multiplier", str(sigma), "--sampling-rate", str(q), "--steps", str(steps),
                 "--delta", "1e-5", "--json"]) == 0  # fmt: skip
    return float(json.loads(capsys.readouterr().out)["epsilon"])


def _step(model, optimizer, criterion, x, y) -> None:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()


def test_a_batch_reused_for_many_steps_is_refused():
    # Old code: one batch reused for 50 steps printed ε 5.15 while what ran cost 48.2.
    engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    xb, yb = next(iter(loader))
    _step(model, optimizer, criterion, xb, yb)
    with pytest.raises(RuntimeError, match="already trained on") as err:
        criterion(model(xb), yb).backward()
    assert "\n" not in str(err.value)
    assert engine.steps == 1


def test_a_second_step_on_one_draw_is_refused():
    _engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    xb, yb = next(iter(loader))
    _step(model, optimizer, criterion, xb, yb)
    with pytest.raises(RuntimeError, match="already called for this batch"):
        optimizer.step()


def test_the_original_loader_is_refused_and_costs_nothing_unaccounted():
    # Old code: iterating the original loader made 0 sampler draws, printed 0.72 while what ran cost 4.38.
    engine, (_raw, model, optimizer, criterion, _private_loader), _, original = _private()
    for xb, yb in original:
        with pytest.raises(RuntimeError, match="not drawn by the data loader make_private returned"):
            _step(model, optimizer, criterion, xb, yb)
        break
    assert engine.steps == 0 and engine.get_epsilon(1e-5) == 0.0


def test_a_validation_batch_cannot_be_trained_on_after_a_training_batch():
    # Old code: criterion(model(x_val), y_val).backward(); optimizer.step() was counted as a training step.
    _engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    x_val, y_val = _data(50, seed=1)
    xb, yb = next(iter(loader))
    _step(model, optimizer, criterion, xb, yb)
    with pytest.raises(RuntimeError, match=r"already trained on|not the private loader's last batch"):
        criterion(model(x_val), y_val).backward()
    # A batch drawn but not yet trained on: the validation batch is still not it.
    next(iter(loader))
    with pytest.raises(RuntimeError, match="not the private loader's last batch"):
        criterion(model(x_val[:3]), y_val[:3]).backward()


def test_every_drawn_batch_is_charged_even_when_the_loop_skips_it(capsys):
    engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    for i, (xb, yb) in enumerate(loader):
        if i % 2:
            continue  # a loop that filters batches can only over-count
        _step(model, optimizer, criterion, xb, yb)
    assert engine.steps == len(loader) == 10
    assert engine.get_epsilon(1e-5) == pytest.approx(_account(1.0, 0.1, 10, capsys), rel=0.01)


def test_a_moved_or_cast_batch_is_the_same_draw_but_a_batch_transformed_in_the_loop_is_refused():
    # Old code: standardising each batch inside the loop moved one record's clipped contribution by 7.0 C.
    engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    xb, yb = next(iter(loader))
    _step(model, optimizer, criterion, xb.to("cpu").double().float(), yb.view(-1))
    xb, yb = next(iter(loader))
    standardised = (xb - xb.mean(0)) / xb.std(0)
    with pytest.raises(RuntimeError, match="put transforms in the dataset or the collate"):
        _step(model, optimizer, criterion, standardised, yb)
    assert engine.steps == 2  # the refused batch was drawn: it stays charged


@pytest.mark.parametrize("how", ["in place", "through .data"])
def test_a_batch_standardised_in_place_is_refused_however_it_is_written(how):
    """The drawn batch is the engine's copy: a write into the loop's tensor (even one that bumps no version) makes
    it another batch, which is refused; the same tensor passed on unchanged is the draw."""
    engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    xb, yb = next(iter(loader))
    _step(model, optimizer, criterion, xb, yb)  # unchanged: the draw itself
    xb, yb = next(iter(loader))
    target = xb if how == "in place" else xb.data
    target.sub_(xb.mean(0).clone()).div_(xb.std(0).clone())
    with pytest.raises(RuntimeError, match="put transforms in the dataset or the collate"):
        _step(model, optimizer, criterion, xb, yb)
    assert engine.steps == 2


def test_a_checkpoint_reload_never_rewinds_epsilon(tmp_path, capsys):
    # Old code: three attempts of 10 steps each, reloading an early checkpoint in between: ε and the ledger said
    # 2.855, while the 30 steps cost 4.180.
    engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    path = tmp_path / "early.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=optimizer)
    for _attempt in range(3):
        engine.load_checkpoint(path=path, module=model, optimizer=optimizer)
        for xb, yb in loader:
            _step(model, optimizer, criterion, xb, yb)
    assert engine.steps == 30
    assert engine.get_epsilon(1e-5) == pytest.approx(_account(1.0, 0.1, 30, capsys), rel=0.01)


def test_a_new_engine_loading_an_older_checkpoint_is_charged_every_step_the_run_ran(tmp_path, capsys):
    # Old code: the spent steps lived in the process only; a new process (a new engine) that loaded the checkpoint
    # written before 10 steps (a crash after them, no later save) charged 10 where 20 ran.
    engine, (_raw, model, optimizer, criterion, loader), _, _ = _private()
    path = tmp_path / "early.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=optimizer)
    for xb, yb in loader:  # the spent-steps record is brought up to date at every draw
        _step(model, optimizer, criterion, xb, yb)
    engine2, (_raw, model2, optimizer2, criterion2, loader2), _, _ = _private()
    with pytest.warns(UserWarning, match="all 10 stay charged"):
        engine2.load_checkpoint(path=path, module=model2, optimizer=optimizer2)
    for xb, yb in loader2:
        _step(model2, optimizer2, criterion2, xb, yb)
    assert engine2.steps == 20
    assert engine2.get_epsilon(1e-5) == pytest.approx(_account(1.0, 0.1, 20, capsys), rel=0.01)


def test_the_trainers_resume_from_an_older_copy_is_charged_every_step_run(tmp_path, capsys):
    from featuredp.engine import Trainer

    x, y = _data(400)
    data = {"x": x, "y": y}

    def trainer() -> Trainer:
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
        return Trainer(model, "dpsgd", noise_multiplier=1.0, max_grad_norm=1.0, batch_size=40, steps=20, delta=1e-5,
                       progress=False)  # fmt: skip

    ck = tmp_path / "run.pt"
    trainer().fit(data, checkpoint=ck, max_steps=5)
    early = tmp_path / "early.pt"
    early.write_bytes(ck.read_bytes())
    trainer().fit(data, checkpoint=ck, resume=True, max_steps=10)  # 15 private steps run in all
    ck.write_bytes(early.read_bytes())  # the habit: resume from an older copy
    with pytest.warns(UserWarning, match="stay charged"):
        result = trainer().fit(data, checkpoint=ck, resume=True)
    steps = result.privacy_report.get("private_steps") or result.steps
    assert steps == 15 + 15  # the 15 steps run after the rewind are added to the 15 already run
    assert result.epsilon == pytest.approx(_account(1.0, 0.1, 30, capsys), rel=0.01)


class _Texts(Dataset):
    """Records of different lengths; the label is the first token's parity."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.rows = [torch.randint(1, 20, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g)
                     for _ in range(n)]  # fmt: skip

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i], int(self.rows[i][0]) % 2


def _pad_to_longest(items):
    longest = max(len(t) for t, _ in items)
    x = torch.zeros(len(items), longest, dtype=torch.long)
    for i, (t, _) in enumerate(items):
        x[i, : len(t)] = t
    return x, torch.tensor([label for _, label in items])


def _pad_to_fixed(items):
    x = torch.zeros(len(items), 32, dtype=torch.long)
    for i, (t, _) in enumerate(items):
        x[i, : len(t)] = t
    return x, torch.tensor([label for _, label in items])


class _MeanOverPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.emb(x).mean(1))  # the padding counts: a record's output depends on the batch's longest


@pytest.mark.parametrize("mode", ["ghost", "vmap"])
def test_a_collate_that_pads_to_the_batchs_longest_record_is_refused(mode):
    # Old code: one long record moved the clipped sum by 11.3 C (ghost and vmap), and check_model passed 3 of 3.
    torch.manual_seed(0)
    model = _MeanOverPositions()
    loader = DataLoader(_Texts(), batch_size=16, collate_fn=_pad_to_longest)
    engine = PrivacyEngine()
    m, o, private = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                        data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                                        grad_sample_mode={"ghost": "hooks", "vmap": "functorch"}[mode])  # fmt: skip
    c = nn.CrossEntropyLoss()  # Opacus's tutorial: the loop's own criterion
    with pytest.raises(RuntimeError, match="collate makes a record's loss or gradient depend") as err:
        for _ in range(10):
            for x, y in private:
                _step(m, o, c, x, y)
    assert "\n" not in str(err.value)


def test_a_collate_to_a_fixed_length_trains():
    torch.manual_seed(0)
    model = _MeanOverPositions()
    loader = DataLoader(_Texts(), batch_size=16, collate_fn=_pad_to_fixed)
    engine = PrivacyEngine()
    m, o, c, private = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                           data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                                           grad_sample_mode="ghost")  # fmt: skip
    for _ in range(3):
        for x, y in private:
            _step(m, o, c, x, y)
    assert engine.steps == 3 * len(loader)


def test_the_record_alone_check_reads_every_collate_but_the_one_that_cannot_mix(monkeypatch):
    """A TensorDataset's default collate stacks each record's rows unchanged (nothing to check); a collate of the
    user's own is re-read alone on the first draw and a secret share of the others."""
    from featuredp.own_loop_rows import DrawnRows

    calls = []
    real = DrawnRows._compare_alone
    monkeypatch.setattr(DrawnRows, "_compare_alone", lambda self, *a: calls.append(1) or real(self, *a))
    torch.manual_seed(0)
    for collate in (None, _pad_to_fixed):
        calls.clear()
        model = _MeanOverPositions()
        texts = _Texts()
        data = (TensorDataset(torch.stack([_pad_to_fixed([texts[i]])[0][0] for i in range(len(texts))]),
                              torch.tensor([texts[i][1] for i in range(len(texts))]))
                if collate is None else texts)  # fmt: skip
        loader = DataLoader(data, batch_size=16, **({"collate_fn": collate} if collate else {}))
        engine = PrivacyEngine()
        m, o, c, private = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                               data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                                               grad_sample_mode="ghost")  # fmt: skip
        for x, y in private:
            _step(m, o, c, x, y)
        assert (len(calls) == 0) == (collate is None), (collate, len(calls))


@pytest.mark.parametrize("bad", ["weighted", "drop_last", "batch_sampler"])
def test_a_sampler_featuredp_would_replace_is_refused_in_one_line(bad):
    # Old code: replaced silently; in one case a batch of 10 became about 100.
    x, y = _data(100)
    ds = TensorDataset(x, y)
    loader = {
        "weighted": DataLoader(ds, batch_size=10, sampler=WeightedRandomSampler(torch.ones(100), 100)),
        "drop_last": DataLoader(ds, batch_size=10, drop_last=True),
        "batch_sampler": DataLoader(ds, batch_sampler=[[i, i + 1] for i in range(0, 100, 2)]),
    }[bad]
    model = nn.Linear(6, 2)
    with pytest.raises(ValueError, match=r"featuredp draws|drop_last") as err:
        PrivacyEngine().make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                     data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
                                     grad_sample_mode="ghost")  # fmt: skip
    assert "\n" not in str(err.value)


def test_reading_a_private_batchs_output_warns_once():
    _engine, (_raw, model, _optimizer, _criterion, loader), _, _ = _private()
    xb, _yb = next(iter(loader))
    with pytest.warns(PrivacyLeakWarning, match="outputs on a private batch are not covered"):
        model(xb)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        model(xb)  # once


def test_the_backstop_makes_the_engines_public_batch_a_sampled_clipped_noised_step(monkeypatch):
    # Old code: make_private(record_epsilon=E) was accepted and printed "(E, δ)-DP for whole records", while the
    # public batch had no clipping and no noise: one record moved an update by 0.237 where the bound was 0.0063.
    from featuredp.data import load_dataset

    train, _test = load_dataset("adult")
    x = torch.tensor(train.X[:2000], dtype=torch.float32)
    y = torch.tensor(train.y[:2000], dtype=torch.long)
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, 2))
    calls = {"record": 0, "public": 0}
    real_record, real_public = StepCore.record_gradient, StepCore.public_gradient

    def record(self, *a, **k):
        calls["record"] += 1
        return real_record(self, *a, **k)

    def public(self, *a, **k):
        calls["public"] += 1
        return real_public(self, *a, **k)

    monkeypatch.setattr(StepCore, "record_gradient", record)
    monkeypatch.setattr(StepCore, "public_gradient", public)
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=100), noise_multiplier=1.0, max_grad_norm=1.0,
        feature_map=Columns(private=["sex", "race"]), dataset=train, epochs=1, record_epsilon=8.0,
        grad_sample_mode="ghost")  # fmt: skip
    for i, (xb, yb) in enumerate(loader):
        _step(m, o, c, xb, yb)
        if i == 3:
            break
    assert calls == {"record": 4, "public": 0}  # every public batch went through the record-level step
    report = engine.result().privacy_report
    assert report["record_level"]["public_noise_multiplier"] > 0
    assert float(report["record_epsilon"]) <= 8.0


def test_the_record_level_public_step_clips_each_record_at_c(monkeypatch):
    # The attacker's record: one row scaled ×1000 so that its ∇ℓ_pub is huge; with the backstop its share of the
    # engine's update is at most C / (q'·n) whatever its size.
    from featuredp.data import load_dataset

    train, _test = load_dataset("adult")
    x = torch.tensor(train.X[:500], dtype=torch.float32)
    y = torch.tensor(train.y[:500], dtype=torch.long)
    x_attack = x.clone()
    x_attack[0] *= 1000.0
    sums = []
    real = StepCore.clipped_sum

    def spy(self, loss_fn, batch, draws, max_grad_norm, **kw):
        out = real(self, loss_fn, batch, draws, max_grad_norm, **kw)
        sums.append(torch.cat([v.flatten() for v in out.values()]).norm().item())
        return out

    monkeypatch.setattr(StepCore, "clipped_sum", spy)
    for data in (x, x_attack):
        model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, 2))
        engine = PrivacyEngine()
        m, o, c, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(data, y), batch_size=50), noise_multiplier=1.0, max_grad_norm=1.0,
            feature_map=Columns(private=["sex", "race"]), dataset=train, epochs=1, record_epsilon=8.0,
            grad_sample_mode="ghost")  # fmt: skip
        engine.run.state.record_sampler.sample = lambda: np.arange(40)  # record 0 in the public batch
        xb, yb = next(iter(loader))
        _step(m, o, c, xb, yb)
    # Two clipped sums per step (private, then the record-level public one); each is a sum of ≤ 40 terms of norm ≤ C.
    assert len(sums) == 4
    assert all(s <= 40 * 1.0 + 1e-4 for s in sums)


def test_check_model_reads_the_loaders_collate_and_refuses_padding_to_the_longest_record():
    # Old code: check_model passed 3 of 3 on the pad-to-longest collate (it replayed gathered tensors).
    torch.manual_seed(0)
    for collate, refused in ((_pad_to_longest, True), (_pad_to_fixed, False)):
        model = _MeanOverPositions()
        engine = PrivacyEngine()
        engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            data_loader=DataLoader(_Texts(), batch_size=16, collate_fn=collate),
                            noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost")  # fmt: skip
        if refused:
            with pytest.raises(RuntimeError, match="collate makes a record's loss or gradient depend"):
                engine.check_model(records=1, batch_size=8)
        else:
            reports = engine.check_model(records=2, batch_size=8)
            assert [r.outcome for r in reports] == ["passed", "passed"]
        assert engine.steps == 0  # the replay charges nothing: the run has not started


def test_an_optimizer_on_re_created_parameters_is_refused_before_it_trains_nothing():
    # Opacus #820: six DP-LoRA runs trained nothing, silently (model.to(device) after get_peft_model re-created the
    # parameters the optimizer held). Simulated on the CPU by re-creating them.
    x, y = _data(100)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model[2].weight = nn.Parameter(model[2].weight.detach().clone())  # after the optimizer was built
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    with pytest.raises(RuntimeError, match=r"does not hold 1 of the model's 4 trainable parameters") as err:
        PrivacyEngine().make_private(module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0,
                                     max_grad_norm=1.0)  # fmt: skip
    assert "\n" not in str(err.value)
    # ... and when the parameters are re-created after make_private, the first step refuses.
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    m, o, private = PrivacyEngine().make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                                 data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0)
    model[0].bias = nn.Parameter(model[0].bias.detach().clone())
    xb, yb = next(iter(private))
    nn.CrossEntropyLoss()(m(xb), yb).backward()
    with pytest.raises(RuntimeError, match="does not hold"):
        o.step()


def test_an_empty_poisson_draw_steps_with_the_noise_alone():
    """Many models refuse a 0-row forward (GPT-2 does): an empty draw's step is ``optimizer.step()`` with no
    backward, and it releases the noise alone (never the previous draw's sum)."""
    x, y = _data(4)
    model = nn.Linear(x.shape[1], 2)
    engine = PrivacyEngine(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, o, c, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                                              data_loader=DataLoader(TensorDataset(x, y), batch_size=1),
                                              criterion=nn.CrossEntropyLoss(), noise_multiplier=1.0,
                                              max_grad_norm=1.0, grad_sample_mode="ghost")  # fmt: skip
        empty = 0
        for _epoch in range(10):
            for xb, yb in loader:
                before = model.weight.detach().clone()
                o.zero_grad()
                if len(xb) == 0:
                    o.step()  # nothing to call backward on
                    empty += 1
                    assert not torch.equal(model.weight, before)  # the noise moved it
                    with pytest.raises(RuntimeError, match="already called for this batch"):
                        o.step()
                else:
                    c(m(xb), yb).backward()
                    o.step()
    assert empty > 0 and engine.steps == 40

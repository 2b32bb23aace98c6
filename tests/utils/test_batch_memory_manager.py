"""Gradient accumulation with the accounting intact: Opacus's BatchMemoryManager loop with the import changed, and
plain accumulation over physical chunks of one drawn batch; misuse (chunks of two draws, a chunk missing) refused."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine
from featuredp.cli import main
from featuredp.utils.batch_memory_manager import BatchMemoryManager

N, BATCH, SEED = 300, 60, 99


def _engine(seed: int = SEED, mode: str = "ghost"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 5, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    engine = PrivacyEngine(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH), criterion=nn.CrossEntropyLoss(),
            noise_multiplier=1.1, max_grad_norm=1.0, grad_sample_mode=mode)  # fmt: skip
    if len(out) == 3:  # Opacus's hooks/functorch tutorial: the loop's own criterion
        out = (out[0], out[1], nn.CrossEntropyLoss(), out[2])
    m, o, c, loader = out
    return engine, model, m, o, c, loader


@pytest.mark.parametrize("mode", ["ghost", "hooks", "functorch"])
def test_the_opacus_batch_memory_manager_loop_equals_the_one_batch_update_and_its_epsilon(mode, capsys):
    # Opacus's tutorial loop (opacus.utils.batch_memory_manager), with only the import changed.
    engine, raw, model, optimizer, criterion, data_loader = _engine(mode=mode)
    sizes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with BatchMemoryManager(data_loader=data_loader, max_physical_batch_size=16,
                                optimizer=optimizer) as memory_safe_data_loader:  # fmt: skip
            for x, y in memory_safe_data_loader:
                sizes.append(len(x))
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
    assert max(sizes) <= 16 and engine.steps == len(data_loader) == 5
    one_engine, one_raw, m, o, c, loader = _engine(mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x, y in loader:
            o.zero_grad()
            c(m(x), y).backward()
            o.step()
    for a, b in zip(raw.parameters(), one_raw.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same update, to float rounding
    assert main(["account", "--noise-multiplier", "1.1", "--sampling-rate", str(BATCH / N), "--steps", "5",
                 "--delta", "1e-5", "--json"]) == 0  # fmt: skip
    reference = json.loads(capsys.readouterr().out)["epsilon"]
    assert engine.get_epsilon(1e-5) == pytest.approx(reference, rel=0.01)
    assert engine.get_epsilon(1e-5) == one_engine.get_epsilon(1e-5)


def test_plain_accumulation_over_chunks_of_one_draw_equals_the_one_batch_update():
    engine, raw, model, optimizer, criterion, loader = _engine()
    _one, one_raw, m, o, c, one_loader = _engine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for (x, y), (x1, y1) in zip(loader, one_loader, strict=True):
            optimizer.zero_grad()
            half = len(x) // 2
            criterion(model(x[half:]), y[half:]).backward()  # any order of the chunks
            criterion(model(x[:half]), y[:half]).backward()
            optimizer.step()
            o.zero_grad()
            c(m(x1), y1).backward()
            o.step()
    for a, b in zip(raw.parameters(), one_raw.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert engine.steps == 5


def test_a_step_with_a_chunk_missing_is_refused():
    _e, _raw, model, optimizer, criterion, loader = _engine()
    x, y = next(iter(loader))
    criterion(model(x[:10]), y[:10]).backward()
    with pytest.raises(RuntimeError, match="a chunk of the batch is missing") as err:
        optimizer.step()
    assert "\n" not in str(err.value)


def test_chunks_of_two_draws_in_one_step_are_refused():
    _e, _raw, model, _optimizer, criterion, loader = _engine()
    it = iter(loader)
    x, y = next(it)
    criterion(model(x), y).backward()  # no step: the loop tries to accumulate across drawn batches
    with pytest.raises(RuntimeError, match="gradients are not accumulated across batches"):
        next(it)


def test_a_chunk_in_two_backwards_is_refused():
    _e, _raw, model, _optimizer, criterion, loader = _engine()
    x, y = next(iter(loader))
    criterion(model(x[:20]), y[:20]).backward()
    with pytest.raises(RuntimeError, match="twice on rows of one drawn batch"):
        criterion(model(x[10:30]), y[10:30]).backward()


def test_the_manager_takes_only_the_private_loader_and_optimizer():
    _e, _raw, _model, optimizer, _criterion, loader = _engine()
    with pytest.raises(TypeError, match="loader make_private returned"):
        BatchMemoryManager(data_loader=DataLoader(TensorDataset(torch.zeros(4, 5))), max_physical_batch_size=2,
                           optimizer=optimizer)  # fmt: skip
    with pytest.raises(ValueError, match="max_physical_batch_size"):
        BatchMemoryManager(data_loader=loader, max_physical_batch_size=0, optimizer=optimizer)

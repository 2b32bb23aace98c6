"""PEFT LoRA (``peft.get_peft_model``) in the user's loop: the adapters train under ghost and vmap, the replay
self-test passes on the PEFT model, and the Opacus #820 ordering (parameters re-created after the optimizer was
built, as ``model.to(device)`` after ``get_peft_model`` does) is refused instead of training nothing."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine

peft = pytest.importorskip("peft")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _lora() -> nn.Module:
    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["fc1", "fc2"], lora_dropout=0.0)
    return peft.get_peft_model(Net(), config)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, generator=g)
    return x, (x[:, 0] > 0).long()


@pytest.mark.parametrize("mode", ["ghost", "hooks", "functorch"])
def test_lora_adapters_train_and_only_they_move(mode):
    x, y = _data()
    model = _lora()
    frozen = {k: v.detach().clone() for k, v in model.named_parameters() if not v.requires_grad}
    adapters = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    assert adapters and all("lora_" in k for k in adapters)
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        out = engine.make_private(module=model, optimizer=optimizer, data_loader=DataLoader(TensorDataset(x, y),
                                  batch_size=20), noise_multiplier=0.5, max_grad_norm=1.0, grad_sample_mode=mode)
        m, o, loader = out[0], out[1], out[-1]
        criterion = nn.CrossEntropyLoss()
        for xb, yb in loader:
            o.zero_grad()
            criterion(m(xb), yb).backward()
            o.step()
    assert engine.steps == len(loader)
    after = dict(model.named_parameters())
    assert all(torch.equal(after[k], v) for k, v in frozen.items())
    assert all(not torch.equal(after[k], v) for k, v in adapters.items())


@pytest.mark.parametrize("mode", ["ghost", "vmap"])
def test_the_replay_self_test_passes_on_a_peft_model(mode):
    x, y = _data()
    model = _lora()
    engine = PrivacyEngine()
    engine.make_private(module=model, optimizer=torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                        lr=0.5), data_loader=DataLoader(TensorDataset(x, y), batch_size=20), noise_multiplier=0.5,
                        max_grad_norm=1.0, grad_sample_mode=mode)  # fmt: skip
    assert [r.outcome for r in engine.check_model({"x": x, "y": y}, records=2)] == ["passed", "passed"]


def test_the_opacus_820_ordering_is_refused():
    x, y = _data()
    model = _lora()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for module in model.modules():  # what a move to another device does to the adapters after the optimizer
        for name, p in list(module.named_parameters(recurse=False)):
            if p.requires_grad:
                setattr(module, name, nn.Parameter(p.detach().clone()))
    with pytest.raises(RuntimeError, match=r"does not hold .* trainable parameters"):
        PrivacyEngine().make_private(module=model, optimizer=optimizer, data_loader=DataLoader(TensorDataset(x, y),
                                     batch_size=20), noise_multiplier=0.5, max_grad_norm=1.0)  # fmt: skip

"""LoRA adapters: only the adapters train, the base stays bit-for-bit frozen, ghost clipping is exact with them.

Ghost clipping must neither fall back nor refuse when most layers (GPT-2's Conv1D, Embedding, LayerNorm) have
no trainable parameter; its per-example norms and clipped sums equal per-example autograd's; and a private
step of the Trainer changes the adapters only.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from transformers.pytorch_utils import Conv1D

from featuredp import Trainer
from featuredp.clipping import get_strategy, trainable_parameters
from featuredp.features.tabular import FunctionMap
from featuredp.losses import LossSplit
from featuredp.models.hf import load_causal_lm
from featuredp.models.lora import LoRA, add_lora, lora_parameters, merge_lora

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clipping"))
from test_ghost import assert_matches, double, single
from test_hf_lm import lm_batch, lm_loss, tiny_gpt2_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_gpt2_folder(tmp_path_factory.mktemp("gpt2_lora"))


def _randomise_up(model: nn.Module, seed: int = 0) -> None:
    """Adapters start with up = 0 (no gradient reaches down); give them a trained-looking state."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora_parameters(model).items():
            if ".up." in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


@pytest.fixture
def lora_lm(folder):
    model = add_lora(load_causal_lm(folder)[0], rank=4, alpha=8, seed=0)
    _randomise_up(model)
    return model


# -- the adapter ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_adapter_starts_as_the_base_and_merges_exactly(kind):
    torch.manual_seed(0)
    base = nn.Linear(6, 4) if kind == "linear" else Conv1D(4, 6)
    model = nn.Sequential(base, nn.Tanh())
    x = torch.randn(3, 5, 6)
    before = model(x)
    add_lora(model, rank=2, alpha=4, targets=("0",), seed=1)
    adapter = model[0]
    assert isinstance(adapter, LoRA) and adapter.base is base and adapter.scale == 2.0
    torch.testing.assert_close(model(x), before)  # up = 0
    assert not adapter.up.weight.any() and adapter.down.weight.any()
    _randomise_up(model)
    adapted = model(x)
    assert not torch.allclose(adapted, before)
    merge_lora(model)
    assert model[0] is base and not any(isinstance(m, LoRA) for m in model.modules())
    torch.testing.assert_close(model(x), adapted, rtol=1e-5, atol=1e-6)


def test_only_adapters_are_trainable(folder):
    model = add_lora(load_causal_lm(folder)[0], rank=4)
    trainable = trainable_parameters(model)
    assert set(trainable) == set(lora_parameters(model))
    # 2 blocks x (c_attn, attn.c_proj, c_fc, mlp.c_proj) x (down, up)
    assert len(trainable) == 16
    assert all(type(m) in (nn.Linear,) for n, m in model.named_modules() if n.endswith((".down", ".up")))
    base = [p for n, p in model.named_parameters() if n not in trainable]
    assert base and not any(p.requires_grad for p in base)


def test_seeded_init_leaves_the_global_rng_alone():
    a, b = nn.Sequential(nn.Linear(5, 5)), nn.Sequential(Conv1D(5, 5))
    state = torch.random.get_rng_state()
    add_lora(a, rank=2, targets=("0",), seed=3)
    add_lora(b, rank=2, targets=("0",), seed=3)
    assert torch.equal(state, torch.random.get_rng_state())
    assert torch.equal(a[0].down.weight, b[0].down.weight)


def test_bad_targets_are_refused():
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    with pytest.raises(ValueError, match=r"match no nn\.Linear or Conv1D"):
        add_lora(model, targets=("c_attn",))
    with pytest.raises(ValueError, match=r"selects layer '1' \(LayerNorm\)"):
        add_lora(model, targets=("1",))
    with pytest.raises(ValueError, match="rank must be"):
        add_lora(model, targets=("0",), rank=0)
    add_lora(model, targets=lambda name, m: isinstance(m, nn.Linear))
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        add_lora(model, targets=("0",))


# -- ghost clipping with a frozen base ----------------------------------------------------------------------------


def test_ghost_lora_gpt2_is_exact_without_fallback(lora_lm):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: frozen layers are simply not differentiated
        strategy = assert_matches(lora_lm, lm_loss, lm_batch(), rtol=1e-4)
    plan = strategy.plan(lora_lm)
    assert strategy.fallback_layers == [] and plan.fallback == [] and not plan.whole_model_fallback
    covered = {p for layer in plan.layers for p in layer.params.values()}
    assert covered == set(lora_parameters(lora_lm))


@pytest.mark.parametrize("passes", ["single", "double"])
def test_ghost_lora_small_is_exact(passes):
    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(6, 5), nn.GELU(), nn.Linear(6, 3), nn.LayerNorm(3))
    add_lora(model, rank=2, targets=("0", "2"))
    _randomise_up(model)
    x, pad = torch.randn(7, 4, 5), torch.randn(7, 4, 5)
    strategy = assert_matches(model, single() if passes == "single" else double(), {"x": x}, {"pad": pad})
    assert strategy.fallback_layers == []


class NextToken(LossSplit):
    """ℓ = per-example mean token NLL of the whole text (test only: Ψ is the identity here)."""

    name = "next_token_test"

    def __init__(self) -> None:
        super().__init__(FunctionMap(lambda b: b, "the whole text (test only)", hides="nothing"))

    def loss(self, model, batch, draws):
        return lm_loss(model, batch, draws)

    def _public_loss(self, model, view, draws):
        return lm_loss(model, view, draws)


def test_a_private_step_changes_only_the_adapters(lora_lm):
    frozen = {n: p.detach().clone() for n, p in lora_lm.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in lora_parameters(lora_lm).items()}
    trainer = Trainer(lora_lm, "dpsgd", loss_split=NextToken(), noise_multiplier=1.0, delta=1e-3, max_grad_norm=1.0,
                      batch_size=4, steps=1, lr=0.5, momentum=0.0, public_seed=0, strategy="ghost")  # fmt: skip
    trainer.fit(lm_batch(8, 10, seed=1))
    after = dict(lora_lm.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in frozen.items()), "a frozen parameter moved"
    assert all(not torch.equal(after[n], v) for n, v in adapters.items()), "an adapter did not train"
    assert trainer.strategy.fallback_layers == []


def test_ghost_strategy_sums_only_adapters(lora_lm):
    sums, norms = get_strategy("ghost").clipped_sum(lora_lm, lm_loss, lm_batch(), {}, 0.5)
    assert set(sums) == set(lora_parameters(lora_lm)) and norms.shape == (4,)

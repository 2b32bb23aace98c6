"""``outputs = model(**batch); outputs.loss.backward()``: the loss a Hugging Face-style model computes from
``labels`` is recomputed per example by the engine (causal LM with the shift and -100 labels; sequence
classification), with the returned criterion nowhere in the loop."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader

from featuredp import PrivacyEngine
from featuredp.hf_losses import CausalLMLoss

V, L = 13, 6


class TinyLM(nn.Module):
    """A causal LM with Hugging Face's calling convention: ``model(input_ids=..., labels=...)`` returns an output
    with ``.logits`` and ``.loss`` (the mean next-token cross-entropy over the batch's counted tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, 8)
        self.head = nn.Linear(8, V)

    def forward(self, input_ids, labels=None):
        logits = self.head(torch.tanh(self.emb(input_ids)))
        out = SimpleNamespace(logits=logits, loss=None)
        if labels is not None:  # as transformers' ForCausalLMLoss: shift, -100 ignored, mean over counted tokens
            shifted = functional.pad(labels, (0, 1), value=-100)[..., 1:]
            out.loss = functional.cross_entropy(logits.reshape(-1, V), shifted.reshape(-1), ignore_index=-100)
        return out


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(problem_type=None)
        self.emb = nn.Embedding(V, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids).mean(1))
        return SimpleNamespace(logits=logits, loss=None if labels is None else functional.cross_entropy(logits, labels))


def _records(n: int = 60, *, ignore: bool = True):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, V, (L,), generator=g)
        labels = ids.clone()
        if ignore:
            labels[int(torch.randint(1, L, (1,), generator=g)):] = -100  # padding, as a collator marks it
        out.append({"input_ids": ids, "labels": labels})
    return out


def test_the_causal_lm_loss_is_transformers_shifted_mean_and_counts_each_examples_own_tokens():
    torch.manual_seed(0)
    logits = torch.randn(4, L, V)
    labels = torch.randint(0, V, (4, L))
    labels[1, 3:] = -100
    loss = CausalLMLoss()
    shifted = functional.pad(labels, (0, 1), value=-100)[..., 1:]
    reference = functional.cross_entropy(logits.reshape(-1, V), shifted.reshape(-1), ignore_index=-100)
    assert torch.allclose(loss(logits, labels), reference)
    loss.reduction = "none"
    per = loss(logits, labels)
    assert per.shape == (4, L) and torch.all(per[:, -1] == 0) and torch.all(per[1, 2:] == 0)
    assert CausalLMLoss.counted(labels).tolist() == [L - 1, 2, L - 1, L - 1]


def test_outputs_loss_of_a_causal_lm_is_the_engines_and_its_update_is_the_clipped_per_example_sum():
    torch.manual_seed(1)
    model = TinyLM()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, o, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                                           data_loader=DataLoader(_records(), batch_size=12), noise_multiplier=0.0,
                                           max_grad_norm=0.05)  # fmt: skip
        batch = next(iter(loader))
        o.zero_grad()
        outputs = m(**batch)
        outputs.loss.backward()
        o.step()
    # Independent reference: each example's own loss as the model computes it for a batch of one, its gradient
    # clipped at C, summed, divided by the expected batch size m (σ = 0: no noise), lr = 1.
    ref = TinyLM()
    ref.load_state_dict(start)
    total = [torch.zeros_like(p) for p in ref.parameters()]
    for i in range(len(batch["input_ids"])):
        grads = torch.autograd.grad(ref(input_ids=batch["input_ids"][i:i + 1],
                                        labels=batch["labels"][i:i + 1]).loss, list(ref.parameters()))  # fmt: skip
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        total = [t + g * min(1.0, 0.05 / max(float(norm), 1e-12)) for t, g in zip(total, grads, strict=True)]
    for p0, p1, t in zip(ref.parameters(), model.parameters(), total, strict=True):
        torch.testing.assert_close(p1, p0 - t / engine.plan.expected_batch_size, rtol=1e-4, atol=1e-6)


def test_outputs_loss_of_a_sequence_classifier_trains_through_the_engine():
    torch.manual_seed(2)
    records = [{"input_ids": r["input_ids"], "labels": int(r["input_ids"][0]) % 3} for r in _records(ignore=False)]
    model = TinyClassifier()
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, o, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                           data_loader=DataLoader(records, batch_size=10), noise_multiplier=0.5,
                                           max_grad_norm=1.0)  # fmt: skip
        for batch in loader:
            o.zero_grad()
            m(**batch).loss.backward()
            o.step()
    assert engine.steps == len(loader)


def test_a_model_loss_the_engine_cannot_recompute_is_refused_in_one_line():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(L, 4)

        def forward(self, input_ids, labels=None):
            logits = self.lin(input_ids.float()).reshape(-1, 2, 2, 1)  # a 4-D output: which loss made .loss?
            return SimpleNamespace(logits=logits, loss=logits.sum())

    model = Odd()
    m, _o, loader = PrivacyEngine().make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                                 data_loader=DataLoader(_records(), batch_size=10),
                                                 noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    batch = next(iter(loader))
    with pytest.raises(TypeError, match="cannot recompute this model's own loss per example") as err:
        m(**batch)
    assert "\n" not in str(err.value)


def test_the_wrapped_model_forwards_generate_save_pretrained_and_config_and_evaluates_without_a_graph(tmp_path):
    class WithGenerate(TinyLM):
        config = SimpleNamespace(problem_type=None, name="tiny")

        @torch.no_grad()
        def generate(self, input_ids, max_new_tokens=3):
            for _ in range(max_new_tokens):
                nxt = self(input_ids=input_ids).logits[:, -1].argmax(-1, keepdim=True)
                input_ids = torch.cat([input_ids, nxt], 1)
            return input_ids

        def save_pretrained(self, path):
            torch.save(self.state_dict(), path / "weights.pt")

    model = WithGenerate()
    m, _o, _loader = PrivacyEngine().make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                                  data_loader=DataLoader(_records(), batch_size=10),
                                                  noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    assert m.generate(torch.zeros(2, 3, dtype=torch.long)).shape == (2, 6)
    m.save_pretrained(tmp_path)
    assert (tmp_path / "weights.pt").exists() and m.config.name == "tiny"
    with torch.no_grad():
        assert not m(input_ids=torch.zeros(2, 3, dtype=torch.long)).logits.requires_grad

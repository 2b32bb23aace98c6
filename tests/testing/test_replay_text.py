"""The replay self-test on the text task: one private step with and without a record, texts of different lengths.

An attacker adds one record whose text is the longest of the batch (or the shortest) and checks that the released
clipped sum moves by at most C and nothing else changes: right padding and the causal mask must keep every
example's gradient a function of its own row, under every strategy and every private method.
"""

from __future__ import annotations

import warnings

import pytest

from featuredp.data.text import ByteTokenizer, TextDataset
from featuredp.data.text_corpus import support_dialogues
from featuredp.engine import Trainer
from featuredp.features.text import TextSpans
from featuredp.features.tokens import TokenView
from featuredp.losses import CausalLMSplit
from featuredp.models import build_model
from featuredp.testing import replay_step

PSI = TextSpans(("name", "email", "phone", "card", "address", "date", "number"))


@pytest.fixture(scope="module")
def data() -> TextDataset:
    return TextDataset(support_dialogues(40, seed=3), PSI, max_len=128)


@pytest.mark.parametrize("strategy", ["vmap", "ghost"])
@pytest.mark.parametrize("method", ["dpsgd", "fdp_dpsgd", "fdp"])
@pytest.mark.parametrize("which", ["longest", "shortest"])
def test_one_more_text_moves_the_step_by_at_most_C(data, method, strategy, which):
    lengths = (data.batch()["y"] != -100).sum(1)
    record = int(lengths.argmax() if which == "longest" else lengths.argmin())
    batch = [i for i in range(len(data)) if i != record][:12]
    assert len({int(lengths[i]) for i in batch}) > 3  # texts of many lengths in one batch
    net = build_model({"kind": "causal_transformer", "vocab_size": ByteTokenizer().vocab_size, "max_len": 128,
                       "d_model": 16, "n_layers": 1, "n_heads": 2}, seed=0)  # fmt: skip
    trainer = Trainer(net, method, loss_split=CausalLMSplit(TokenView(PSI)), steps=3, batch_size=12,
                      noise_multiplier=1.0, max_grad_norm=0.05, delta=1e-4, strategy=strategy, progress=False,
                      public_seed=0)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no torch.func fallback, no per-example warning
        report = replay_step(trainer, data.batch(), record=record, batch=batch)
    assert report.outcome == "passed", str(report)

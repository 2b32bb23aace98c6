"""Causal LM pieces: the per-example token NLL, the loss split ℓ = ℓ_priv + ℓ_pub on text, and the helpers audits
use (perplexity, the suffix scorer, the greedy generator), checked on hand cases and a bigram model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from featuredp.clipping import get_strategy
from featuredp.data.text import IGNORE_INDEX, ByteTokenizer, TextDataset, TextRecord
from featuredp.data.text_corpus import support_dialogues
from featuredp.features import Columns, TokenView
from featuredp.features.text import Span, TextSpans
from featuredp.lm import lm_generator, lm_scorer, perplexity, token_nll
from featuredp.losses import CausalLMSplit

pytestmark = pytest.mark.filterwarnings("ignore:GhostGradients:UserWarning")

TOK = ByteTokenizer()
V = TOK.vocab_size
PSI = TextSpans(("name", "email", "phone", "card", "number", "date", "address"))


class Bigram(nn.Module):
    """logits[b, t] = W[x[b, t]]: the next token depends on the current one only, so NLLs are easy by hand."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x]


def _bigram(seed: int = 0, vocab: int = V) -> Bigram:
    return Bigram(torch.randn(V, vocab, generator=torch.Generator().manual_seed(seed)))


def _tiny(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(V, 8), nn.Linear(8, V))


# ------------------------------------------------------------------------------------------------ token_nll


def test_token_nll_is_the_mean_over_each_rows_own_targets():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    targets = torch.tensor([[1, 2, 3, -100, -100], [4, -100, -100, -100, -100], [-100] * 5])
    logp = logits.log_softmax(-1)
    by_hand = [-(logp[0, 0, 1] + logp[0, 1, 2] + logp[0, 2, 3]) / 3, -logp[1, 0, 4], torch.tensor(0.0)]
    torch.testing.assert_close(token_nll(logits, targets), torch.stack(by_hand))
    # nothing crosses examples: each row alone gives the same, and so does vmap
    for i in range(3):
        one = token_nll(logits[i : i + 1], targets[i : i + 1])
        torch.testing.assert_close(one, token_nll(logits, targets)[i : i + 1])
    per = torch.func.vmap(lambda lg, t: token_nll(lg[None], t[None])[0])(logits, targets)
    torch.testing.assert_close(per, token_nll(logits, targets))
    with pytest.raises(ValueError, match="logits must be"):
        token_nll(logits[0], targets[0])


# ------------------------------------------------------------------------------------------------ CausalLMSplit


def _data(n: int = 6, seed: int = 0) -> TextDataset:
    return TextDataset(support_dialogues(n, seed=seed), PSI, max_len=128)


def test_split_losses_are_the_nll_of_the_text_and_of_its_public_view():
    ds = _data()
    batch, model = ds.batch(), _tiny()
    split = CausalLMSplit(TokenView(PSI)).bind(ds)
    full = token_nll(model(batch["x"]), batch["y"])
    public = token_nll(model(batch["x_pub"]), batch["y_pub"])
    torch.testing.assert_close(split.loss(model, batch, {}), full)
    torch.testing.assert_close(split.public_loss(model, batch, {}), public)
    torch.testing.assert_close(split.private_loss(model, batch, {}), full - public)
    assert split.draws(batch, torch.Generator()) == {}
    d = split.describe()
    assert d["split"] == "causal_lm" and d["feature_map"]["hides"] == PSI.describe().hides


def test_public_loss_ignores_the_contents_of_private_spans():
    """The attack on ℓ_pub: two datasets that differ only inside the spans give bitwise the same public loss."""
    recs = [TextRecord("I'm Ann Lee, ann@ex.org", [Span(4, 11, "name"), Span(13, 23, "email")]),
            TextRecord("card 4111 1111 1111 1111 ok", [Span(5, 24, "card")])]  # fmt: skip
    other = [TextRecord("I'm Bo, bo.k.wu@mail.example.com", [Span(4, 6, "name"), Span(8, 32, "email")]),
             TextRecord("card 5500-0000-0000-0004 ok", [Span(5, 24, "card")])]  # fmt: skip
    a, b = TextDataset(recs, PSI).batch(), TextDataset(other, PSI).batch()
    split, model = CausalLMSplit(TokenView(PSI)), _tiny()
    assert torch.equal(split.public_loss(model, a, {}), split.public_loss(model, b, {}))
    assert not torch.equal(split.loss(model, a, {}), split.loss(model, b, {}))


@pytest.mark.parametrize("strategy", ["vmap", "ghost"])
@pytest.mark.parametrize("which", ["private_loss", "loss", "public_loss"])
def test_per_example_gradients_match_one_at_a_time(strategy, which):
    ds = _data(6, seed=3)
    batch, model = ds.batch(), _tiny(1)
    loss_fn = getattr(CausalLMSplit(TokenView(PSI)).bind(ds), which)
    params = list(model.parameters())
    norms, grads = [], []
    for i in range(6):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        g = torch.autograd.grad(loss_fn(model, one, {}).sum(), params)
        grads.append(g)
        norms.append(math.sqrt(sum(float(x.double().pow(2).sum()) for x in g)))
    C = float(np.median(norms))  # some clipped, some not
    sums, got = get_strategy(strategy).clipped_sum(model, loss_fn, batch, {}, C)
    torch.testing.assert_close(got.double(), torch.tensor(norms, dtype=torch.float64), rtol=1e-5, atol=1e-7)
    for j, (name, _) in enumerate(model.named_parameters()):
        ref = sum(min(1.0, C / (n + 1e-6)) * g[j] for n, g in zip(norms, grads))
        torch.testing.assert_close(sums[name], ref, rtol=1e-4, atol=1e-6)


def test_split_needs_a_token_view():
    with pytest.raises(TypeError, match="must be a TokenView"):
        CausalLMSplit(Columns(["sex"]))


# ------------------------------------------------------------------------------------------------ perplexity


def test_perplexity_is_exp_of_the_mean_token_nll_over_the_corpus():
    ds = TextDataset([TextRecord("hello", []), TextRecord("a longer text here", []), TextRecord("", [])], PSI,
                     max_len=16)  # fmt: skip
    batch, model = ds.batch(), _bigram()
    logp = model.table.detach().double().log_softmax(-1)
    total, count = 0.0, 0
    for x_row, y_row in zip(batch["x"].tolist(), batch["y"].tolist()):
        for a, b in zip(x_row, y_row):
            if b != IGNORE_INDEX:
                total, count = total - float(logp[a, b]), count + 1
    assert count == 6 + 16 + 1  # targets: each text's bytes and EOS (the long one cut at max_len = 16)
    model.train()
    assert perplexity(model, batch) == pytest.approx(math.exp(total / count), rel=1e-6)
    assert perplexity(model, batch, batch_size=1) == pytest.approx(math.exp(total / count), rel=1e-6)
    assert perplexity(model, ds) == pytest.approx(math.exp(total / count), rel=1e-6)
    assert model.training  # the mode is restored
    # texts of one length: the corpus value is exp of the mean per-example NLL
    same = TextDataset([TextRecord("abc", []), TextRecord("xyz", [])], PSI, max_len=8).batch()
    mean = float(token_nll(model(same["x"]), same["y"]).mean().detach())
    assert perplexity(model, same) == pytest.approx(math.exp(mean), rel=1e-5)
    assert perplexity(model, same, key="x_pub") == pytest.approx(math.exp(mean), rel=1e-5)
    with pytest.raises(ValueError, match="key must name"):
        perplexity(model, same, key="y")
    with pytest.raises(ValueError, match="no target tokens"):
        perplexity(model, {"x": same["x"], "y": torch.full_like(same["y"], IGNORE_INDEX)})


# ------------------------------------------------------------------------------------------------ scorer


def test_scorer_gives_the_nll_of_the_suffix_given_the_prefix():
    model = _bigram(1)
    logp = model.table.detach().double().log_softmax(-1)
    score = lm_scorer(model, TOK, max_len=16, batch_size=2)

    def by_hand(prefix: str, suffix: str) -> float:
        seq = [TOK.bos_id, *TOK.encode(prefix), *TOK.encode(suffix)]
        first = 1 + len(TOK.encode(prefix))
        return -sum(float(logp[seq[i - 1], seq[i]]) for i in range(first, len(seq)))

    pairs = [("my pin is ", "1234"), ("", "whole text"), ("[NAME] said", " hi"), ("x", ""), ("é", "ü")]
    got = score([p for p, _ in pairs], [s for _, s in pairs])
    assert got.dtype == np.float64 and got.shape == (5,)
    np.testing.assert_allclose(got, [by_hand(p, s) for p, s in pairs], rtol=1e-6)
    assert got[3] == 0.0
    # exactly at the limit: prefix + suffix = max_len tokens is fine, one more is refused
    np.testing.assert_allclose(score(["abcdefgh"], ["ijklmnop"]), [by_hand("abcdefgh", "ijklmnop")], rtol=1e-6)
    with pytest.raises(ValueError, match=r"suffixes\[1\].*would be cut"):
        score(["a", "abcdefghi"], ["b", "jklmnopq"])
    with pytest.raises(ValueError, match="same length"):
        score(["a"], ["b", "c"])


def test_scorer_ranks_a_memorised_secret_first():
    """A bigram model that learned "9"→"4" scores the suffix "94" lower than other candidates."""
    table = torch.zeros(V, V)
    table[ord("9"), ord("4")] = 8.0
    table[ord(" "), ord("9")] = 8.0
    score = lm_scorer(Bigram(table), TOK, max_len=16)
    candidates = [f"{i:02d}" for i in range(100)]
    nll = score(["pin "] * 100, candidates)
    assert candidates[int(np.argmin(nll))] == "94"


# ------------------------------------------------------------------------------------------------ generator


def _chain_model(extra: int = 0) -> Bigram:
    """a → b → [NAME] → EOS, greedily; ``extra`` logits beyond the vocabulary that must never be chosen."""
    table = torch.zeros(V, V + extra)
    table[TOK.bos_id, ord("a")] = 5.0
    table[ord("a"), ord("b")] = 5.0
    table[ord("b"), TOK.placeholder_id("name")] = 5.0
    table[TOK.placeholder_id("name"), TOK.eos_id] = 5.0
    if extra:
        table[:, V:] = 100.0
    return Bigram(table)


def test_generator_is_greedy_stops_at_eos_and_returns_the_continuation():
    model = _chain_model(extra=3)
    model.train()
    generate = lm_generator(model, TOK, max_len=16)
    assert generate("a", 10) == "b[NAME]"
    assert generate("", 10) == "ab[NAME]"
    assert generate("a", 1) == "b" and generate("a", 0) == ""
    assert model.training
    # the context never outgrows max_len: [BOS, a] predicts b, and there is no room to read b
    assert lm_generator(model, TOK, max_len=2)("a", 10) == "b"
    assert lm_generator(model, TOK, max_len=3)("a", 10) == "b[NAME]"
    with pytest.raises(ValueError, match="do not fit max_len"):
        lm_generator(model, TOK, max_len=3)("abc", 5)


def test_generator_and_scorer_agree_on_a_random_bigram_model():
    """Each generated token is the argmax after the one before, and the scorer's NLL of the continuation is the
    sum of those steps' log-probabilities (the scorer pads rows to max_len, the generator too)."""
    model = _bigram(4)
    with torch.no_grad():
        model.table[:, 128:256] = -1e4  # ASCII only, so the continuation decodes and re-encodes to its tokens
    text = lm_generator(model, TOK, max_len=20)("hi", 6)
    ids = [TOK.bos_id, *TOK.encode("hi"), *TOK.encode(text)]
    assert 3 < len(ids) <= 3 + 6
    table = model.table.detach().double()
    assert all(int(table[ids[i - 1]].argmax()) == ids[i] for i in range(3, len(ids)))
    step = -sum(float(table.log_softmax(-1)[ids[i - 1], ids[i]]) for i in range(3, len(ids)))
    assert lm_scorer(model, TOK, 20)(["hi"], [text])[0] == pytest.approx(step, rel=1e-6)

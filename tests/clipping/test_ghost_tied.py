"""Ghost clipping of a parameter shared by two ruled layers (a token embedding tied to the output head).

The tied (V, d) table gets a Rows contribution from the lookups and an Outer (or Passes) one from the head; its
per-example squared norm needs the cross terms 2⟨Rows_i, Outer_i⟩. Ghost clipping must compute them exactly
without falling back to torch.func (which it did before: "shared with another layer"), for a toy and for the
causal transformer, single pass and FDP's two passes ℓ(x) − ℓ(x_pub), against the one-example-at-a-time autograd
reference of ``test_ghost``. A parameter shared with a layer without a rule, or reused functionally, still falls
back.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_ghost import assert_matches, double, single
from torch import nn
from torch.nn import functional as nnf

from featuredp.clipping import GhostGradients, contributions
from featuredp.clipping import ghost as ghost_module
from featuredp.clipping.contributions import Dense, Outer, Passes, Rows
from featuredp.clipping.mixed import Mixed, combine
from featuredp.models import CausalTransformer

V, D = 13, 6


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def no_torch_func(monkeypatch):
    """Ghost must not differentiate any parameter per example with torch.func: fail the test if it tries."""

    def refuse(*args, **kwargs):
        raise AssertionError("ghost fell back to torch.func per-example gradients")

    monkeypatch.setattr(ghost_module, "per_example_grads", refuse)


def ghost_only(model, loss_fn, batch, draws=None):
    """assert_matches with warnings as errors (no fallback notice, no demotion after the autograd check)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy = assert_matches(model, loss_fn, batch, draws)
    plan = strategy.plan(model)
    assert plan.fallback == [] and plan.fallback_layers == [] and not plan.whole_model_fallback
    assert strategy.fallback_layers == []
    return strategy


class TiedToy(nn.Module):
    """Embedding → Linear → tanh → head whose weight is the embedding's (over every token, or pooled)."""

    def __init__(self, padding_idx=None, pooled=False):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=padding_idx)
        self.mid = nn.Linear(D, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight
        self.pooled = pooled

    def forward(self, idx):
        h = torch.tanh(self.mid(self.emb(idx)))
        return self.head(h.mean(1) if self.pooled else h)


def lm_loss(logits, y):
    """Mean token NLL over each example's non-ignored targets (-100)."""
    nll = nnf.cross_entropy(logits.transpose(1, 2), y, reduction="none", ignore_index=-100)
    return nll.sum(1) / (y != -100).sum(1).clamp(min=1)


def lm(model, batch, draws):
    return lm_loss(model(batch["x"]), batch["y"])


def lm_fdp(model, batch, draws):
    """ℓ(x) − ℓ(x_pub): two different token inputs through the same tied layers."""
    return lm(model, batch, draws) - lm_loss(model(batch["x_pub"]), batch["y_pub"])


def text_batch(B, L, vocab, lengths=None):
    """Right-padded ids x, targets y (-100 after the end), and a public view sharing most tokens."""
    lengths = lengths or [L - (i % 4) for i in range(B)]
    x = torch.zeros(B, L, dtype=torch.long)
    y = torch.full((B, L), -100)
    for i, n in enumerate(lengths):
        toks = torch.randint(1, vocab, (n + 1,))
        x[i, :n], y[i, :n] = toks[:-1], toks[1:]
    x_pub, y_pub = x.clone(), y.clone()
    x_pub[:, 2:4] = 1  # a private span replaced by its placeholder
    y_pub[:, 1:3] = torch.where(y[:, 1:3] == -100, -100, 1)
    return {"x": x, "y": y, "x_pub": x_pub, "y_pub": y_pub}


# -- the tied toy ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("passes", ["single", "double"])
def test_tied_toy_is_exact_without_torch_func(padding_idx, passes, no_torch_func):
    model = TiedToy(padding_idx)
    idx = torch.randint(0, V, (7, 5))
    idx[:, :2] = 0  # repeated rows in an example, and the padding row (which the head still trains)
    draws = {"pad": torch.randint(0, V, (7, 5))}
    ghost_only(model, single() if passes == "single" else double(), {"x": idx}, draws)


def test_tied_toy_pooled_head_single_token_passes(no_torch_func):
    """A pooled head sees one token per pass: two passes are kept apart (Passes), crossed with the Rows."""
    model = TiedToy(pooled=True)
    idx = torch.randint(0, V, (6, 4))
    ghost_only(model, double(), {"x": idx}, {"pad": torch.randint(0, V, (6, 4))})


def test_the_tied_weight_is_one_mixed_contribution():
    model = TiedToy()
    seen = {}

    def inspect(combined, parts, norms):
        seen.update(combined=combined, parts=parts)

    strategy = GhostGradients()
    plan = strategy.plan(model)
    assert {layer.name for layer in plan.layers if "weight" in layer.params and layer.params["weight"] == "emb.weight"
            } == {"emb", "head"}  # fmt: skip
    batch, draws = {"x": torch.randint(0, V, (5, 4))}, {"pad": torch.randint(0, V, (5, 4))}
    strategy._chunk(plan, model, double(), batch, draws, math.inf, dict(model.named_parameters()), inspect)
    tied = seen["combined"]["emb.weight"]
    assert isinstance(tied, Mixed) and sorted(type(p).__name__ for p in tied.parts) == ["Outer", "Rows"]
    assert len(seen["parts"]["emb.weight"]) == 4  # two passes through each of the two layers


class SharedLinears(nn.Module):
    """Two Linear layers with one weight and their own biases (ALBERT-style sharing): two Outer parts, one kind."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(D, D)
        self.second = nn.Linear(D, D)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


@pytest.mark.parametrize("passes", ["single", "double"])
def test_a_weight_shared_by_two_linear_layers_is_exact_without_torch_func(passes, no_torch_func):
    x = torch.randn(6, 4, D)
    ghost_only(SharedLinears(), single() if passes == "single" else double(), {"x": x}, {"pad": torch.randn(6, 4, D)})


# -- the causal transformer -----------------------------------------------------------------------------------


def transformer():
    return CausalTransformer(17, max_len=9, d_model=8, n_layers=2, n_heads=2)


def test_transformer_dpsgd_is_exact_without_torch_func(no_torch_func):
    ghost_only(transformer(), lm, text_batch(5, 9, 17))


def test_transformer_fdp_two_inputs_is_exact_without_torch_func(no_torch_func):
    ghost_only(transformer(), lm_fdp, text_batch(5, 9, 17))


def test_transformer_physical_batches_agree(no_torch_func):
    batch = text_batch(6, 9, 17)
    model = transformer()
    for strategy in (GhostGradients(physical_batch_size=4),):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert_matches(model, lm_fdp, batch, strategy=strategy)


def test_untied_transformer_matches_too(no_torch_func):
    model = CausalTransformer(17, max_len=9, d_model=8, n_layers=1, n_heads=2, tie_embeddings=False)
    ghost_only(model, lm_fdp, text_batch(4, 9, 17))


# -- the replay self-test (one step with and without a record, identical randomness) -------------------------


class TabularLM(nn.Module):
    """The tied transformer over the replay zoo's 7-column table (columns bucketised into tokens)."""

    def __init__(self):
        super().__init__()
        self.lm = CausalTransformer(16, max_len=7, d_model=8, n_layers=1, n_heads=2)

    def forward(self, x):
        codes = (x.clamp(-1.9, 1.9) * 2 + 4).long() + 8 * (torch.arange(7, device=x.device) % 2)
        return self.lm(codes)[:, -1, :2]


# The replay used to read the tied alias head.weight in state_dict() as a frozen tensor that changed.
@pytest.mark.parametrize("method", ["dpsgd", "fdp"])
def test_replay_of_the_tied_transformer_passes(method):
    from _fdp_synth import make_tabular
    from featuredp.engine import Trainer
    from featuredp.features import Columns
    from featuredp.testing import replay_step

    data = make_tabular(64, seed=1)
    data.X[5] = [30.0, -2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    extra = {} if method == "dpsgd" else {"feature_map": Columns(["sex", "race"])}
    trainer = Trainer(TabularLM(), method, steps=5, batch_size=16, noise_multiplier=1.0, max_grad_norm=0.1,
                      delta=1e-4, strategy="ghost", progress=False, **extra)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no torch.func fallback notice
        report = replay_step(trainer, data, record=5, batch=list(range(10, 34)))
    assert report.outcome == "passed", str(report)


# -- what still falls back ------------------------------------------------------------------------------------


class MyLinear(nn.Linear):
    """A subclass (it may override forward): no ghost rule."""


def test_a_weight_shared_with_a_layer_without_a_rule_falls_back_exactly():
    model = TiedToy()
    model.head = MyLinear(D, V, bias=False)
    model.head.weight = model.emb.weight
    with pytest.warns(UserWarning, match="emb.weight"):
        strategy = assert_matches(model, single(), {"x": torch.randint(0, V, (5, 4))})
    assert strategy.plan(model).fallback == ["emb.weight"]
    assert any("shared with a layer without a ghost rule" in s for s in strategy.fallback_layers)


def test_a_tied_weight_also_used_functionally_is_demoted_after_the_autograd_check():
    class AlsoFunctional(TiedToy):
        def forward(self, idx):
            return super().forward(idx) + nnf.linear(self.emb(idx), self.emb.weight)

    model = AlsoFunctional()
    with pytest.warns(UserWarning, match="outside the layer"):
        strategy = assert_matches(model, single(), {"x": torch.randint(0, V, (5, 4))})
    assert strategy.plan(model).fallback == ["emb.weight"]  # once, though two layers held it


# -- Mixed as a contribution ----------------------------------------------------------------------------------


def _parts(B=5, T=3, n=4):
    shape = torch.Size([V, D])
    example = torch.arange(B).repeat_interleave(n)
    index = torch.randint(0, V, (B * n,))
    index[::n] = index[1::n]  # some rows hit twice by one example
    r = Rows(example, index, torch.randn(B * n, D), B, shape)
    o = Outer(torch.randn(B, T, 1, D), torch.randn(B, T, 1, V), shape)
    return r, o


def _dense(c, B):
    return c.examples(torch.arange(B)).double()


def test_mixed_contribution_methods_match_materialised_gradients():
    B = 5
    r, o = _parts(B)
    mixed = combine([r, o])
    assert isinstance(mixed, Mixed)
    truth = _dense(r, B) + _dense(o, B)
    torch.testing.assert_close(mixed.examples(torch.arange(B)).double(), truth, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mixed.squared_norms(), truth.pow(2).sum((1, 2)), rtol=1e-5, atol=1e-8)
    f = torch.rand(B)
    torch.testing.assert_close(mixed.weighted_sum(f).double(), (truth * f.double().view(B, 1, 1)).sum(0),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert bool((mixed.abs_sum().double() >= truth.sum(0).abs() - 1e-5).all())
    rows = torch.tensor([3, 1])
    assert bool((mixed.term_bounds(rows) >= truth[rows].pow(2).sum((1, 2)).sqrt() - 1e-6).all())
    drop = torch.tensor([False, True, False, False, True])
    dropped = mixed.without(drop)
    torch.testing.assert_close(dropped.squared_norms()[drop], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(dropped.squared_norms()[~drop], mixed.squared_norms()[~drop])
    # Combining again regroups by kind: the two Outer parts become one (tokens side by side), with the Rows.
    again = combine([mixed, o])
    assert isinstance(again, Mixed) and len(again.parts) == 2
    torch.testing.assert_close(again.squared_norms(), (truth + _dense(o, B)).pow(2).sum((1, 2)), rtol=1e-5,
                               atol=1e-8)  # fmt: skip
    assert combine([r, r]).__class__ is Rows  # one kind stays that kind


def test_rows_crossed_with_single_token_passes():
    B = 4
    r, _ = _parts(B)
    p1 = Outer(torch.randn(B, 1, 1, D), torch.randn(B, 1, 1, V), r.shape)
    p2 = Outer(torch.randn(B, 1, 1, D), torch.randn(B, 1, 1, V), r.shape)
    mixed = combine([r, p1, p2])
    assert isinstance(mixed, Mixed) and {type(p) for p in mixed.parts} == {Rows, Passes}
    truth = _dense(r, B) + _dense(p1, B) + _dense(p2, B)
    torch.testing.assert_close(mixed.squared_norms(), truth.pow(2).sum((1, 2)), rtol=1e-5, atol=1e-8)


def test_pairs_without_a_formula_are_materialised_in_blocks(monkeypatch):
    """Dense × Outer has no cross-term formula: per-example gradients, a block of examples at a time."""
    monkeypatch.setattr(contributions, "_BLOCK_ELEMENTS", 3 * V * D)  # blocks of one example
    B = 5
    _, o = _parts(B)
    d = Dense(torch.randn(B, V, D))
    mixed = combine([d, o])
    truth = _dense(d, B) + _dense(o, B)
    torch.testing.assert_close(mixed.squared_norms(), truth.pow(2).sum((1, 2)), rtol=1e-5, atol=1e-8)


def test_parts_that_cancel_are_recomputed_from_the_gradients():
    """Rows_i ≈ −Outer_i: the float32 own norms cancel against the cross term; the small remainder must be right
    (it is what clipping scales), not rounding noise or a negative square."""
    B, shape = 4, torch.Size([V, D])
    o = Outer(10 * torch.randn(B, 1, 1, D), 10 * torch.randn(B, 1, 1, V), shape)
    dense = _dense(o, B).float()  # (B, V, D)
    rest = 1e-3 * torch.randn(B, V, D)
    r = Rows(torch.arange(B).repeat_interleave(V), torch.arange(V).repeat(B), (rest - dense).reshape(B * V, D), B,
             shape)  # fmt: skip
    got = combine([r, o]).squared_norms().sqrt()
    want = (_dense(r, B) + _dense(o, B)).pow(2).sum((1, 2)).sqrt()
    torch.testing.assert_close(got, want, rtol=1e-3, atol=0)
    assert bool((want < 1e-3 * dense.double().pow(2).sum((1, 2)).sqrt()).all())  # it did cancel


def test_contributions_for_different_shapes_are_refused():
    r, _ = _parts()
    wrong = Outer(torch.randn(5, 3, 1, D), torch.randn(5, 3, 1, V + 1), torch.Size([V + 1, D]))
    with pytest.raises(TypeError, match=r"different shapes: Rows \(13, 6\), Outer \(14, 6\)"):
        combine([r, wrong])


def test_a_bias_whose_gradient_cancels_to_zero_stays_on_its_rule():
    """A conv bias before GroupNorm(C, C) (what ModuleValidator.fix makes of BatchNorm) and an attention key bias
    under softmax have gradient exactly 0: their terms cancel. Old code compared that cancelled sum with rounding
    of its own size and demoted the bias to torch.func with a wrong diagnosis ("used outside the layer's call")."""
    from featuredp.clipping import get_strategy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(8, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 3))  # fmt: skip
    batch = {"x": torch.randn(16, 1, 6, 6), "y": torch.randint(0, 3, (16,))}

    def loss_fn(m, b, _draws):
        return nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback warning
        sums, norms = get_strategy("ghost").clipped_sum(model, loss_fn, batch, {}, 1.0)
    reference, ref_norms = get_strategy("vmap").clipped_sum(model, loss_fn, batch, {}, 1.0)
    torch.testing.assert_close(norms, ref_norms, rtol=1e-4, atol=1e-6)
    for k in reference:
        torch.testing.assert_close(sums[k], reference[k], rtol=1e-4, atol=1e-6)

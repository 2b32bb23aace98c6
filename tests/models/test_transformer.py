"""The causal transformer: shapes, tied head, causality, per-example separability under right padding, specs."""

from __future__ import annotations

import pytest
import torch

from featuredp.models import CausalTransformer, build_model, spec_for
from featuredp.models.transformer import _Block

V, L, PAD = 19, 12, 0


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def small(**kw):
    return CausalTransformer(V, max_len=L, d_model=16, n_layers=2, n_heads=2, **kw).eval()


def test_shapes_parameters_and_tied_head():
    m = small()
    assert m(torch.randint(0, V, (3, 7))).shape == (3, 7, V)
    assert m(torch.randint(0, V, (1, L))).shape == (1, L, V)
    assert m.head.weight is m.tok.weight  # one parameter, listed once
    names = [n for n, _ in m.named_parameters()]
    assert "tok.weight" in names and "head.weight" not in names
    untied = small(tie_embeddings=False)
    assert untied.head.weight is not untied.tok.weight
    assert sum(p.numel() for p in untied.parameters()) == sum(p.numel() for p in m.parameters()) + V * 16
    # Only layers with ghost rules hold parameters (the blocks' own code is parameter-free).
    held = {type(mod).__name__ for mod in m.modules() if any(True for _ in mod.parameters(recurse=False))}
    assert held == {"Embedding", "Linear", "LayerNorm"}
    assert all(isinstance(b, _Block) for b in m.blocks) and len(m.blocks) == 2
    assert CausalTransformer(V, max_len=L, d_model=8, n_heads=2).blocks[0].fc1.out_features == 32  # d_ff = 4·d


def test_a_token_changes_no_logit_before_it():
    m = small()
    x = torch.randint(1, V, (2, L))
    base = m(x)
    for t in (0, 5, L - 1):
        y = x.clone()
        y[:, t] = (y[:, t] % (V - 1)) + 1  # another token
        out = m(y)
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=0)
        assert (out[:, t:] - base[:, t:]).abs().amax() > 1e-4  # it does change its own and later positions


def test_right_padded_examples_are_computed_separately():
    """An example's logits at its real positions depend on its own real tokens only: not on the other examples of
    the batch, their lengths, nor on what follows its end (padding or anything else)."""
    m = small()
    lengths = [3, 8, L]
    x = torch.full((3, L), PAD)
    for i, n in enumerate(lengths):
        x[i, :n] = torch.randint(1, V, (n,))
    out = m(x)
    for i, n in enumerate(lengths):
        alone = m(x[i : i + 1, :n])  # the example by itself, trimmed to its own length
        torch.testing.assert_close(out[i, :n], alone[0], rtol=1e-5, atol=1e-6)
        other = x.clone()
        other[:, n:] = torch.randint(1, V, (3, L - n))  # garbage after its end
        other[[j for j in range(3) if j != i]] = torch.randint(1, V, (2, L))  # the other examples replaced
        torch.testing.assert_close(m(other)[i, :n], out[i, :n], rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="d_model=10 must be a multiple of n_heads=4"):
        CausalTransformer(V, d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        CausalTransformer(1)
    m = small()
    with pytest.raises(ValueError, match=f"sequence length {L + 1} exceeds max_len={L}"):
        m(torch.zeros(1, L + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="integer token ids of shape"):
        m(torch.zeros(2, 3))


def test_state_dict_round_trip_keeps_the_tie():
    m = small()
    fresh = small()
    fresh.load_state_dict(m.state_dict())
    assert fresh.head.weight is fresh.tok.weight
    x = torch.randint(0, V, (2, 5))
    torch.testing.assert_close(fresh(x), m(x))


def test_build_model_spec():
    spec = {"kind": "causal_transformer", "vocab_size": V, "max_len": L, "d_model": 16, "n_layers": 1, "n_heads": 2}
    a, b = build_model(spec, seed=3), build_model(spec, seed=3)
    assert isinstance(a, CausalTransformer) and len(a.blocks) == 1 and a.max_len == L and a.head.weight is a.tok.weight
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    state = torch.get_rng_state()
    build_model(spec, seed=4)
    assert torch.equal(state, torch.get_rng_state())  # the caller's generator is left alone
    untied = build_model({**spec, "tie_embeddings": False})
    assert not untied.tie_embeddings and untied.head.weight is not untied.tok.weight
    with pytest.raises(ValueError, match="causal_transformer spec needs vocab_size"):
        build_model({"kind": "causal_transformer", "max_len": 8})
    with pytest.raises(ValueError, match="d_modle"):
        build_model({**spec, "d_modle": 8})


def test_spec_for_is_for_tables_only():
    with pytest.raises(ValueError, match="causal_transformer"):
        spec_for(object(), "causal_transformer")

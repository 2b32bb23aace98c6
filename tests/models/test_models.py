"""Models: shapes, specs, the sparse categorical model's masked codes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from featuredp.data import TabularDataset
from featuredp.models import MLP, ColumnLinear, LogisticRegression, SparseLogisticRegression, build_model, spec_for


def _data(codes: bool) -> TabularDataset:
    rng = np.random.default_rng(0)
    n = 10
    if codes:
        return TabularDataset("t", rng.normal(size=(n, 2)), rng.integers(0, 2, n), ["a", "b"], ["a", "b"], "y",
                              ["0", "1"], X_cat=rng.integers(0, 3, (n, 2)), cat_sources=["c", "d"],
                              cat_cardinalities=[3, 3])  # fmt: skip
    return TabularDataset("t", rng.normal(size=(n, 3)), rng.integers(0, 3, n), ["a", "b", "c"], ["a", "b", "c"],
                          "y", ["0", "1", "2"])  # fmt: skip


def test_shapes():
    x = torch.randn(5, 6)
    assert MLP(6, (8, 4), 3)(x).shape == (5, 3)
    assert MLP(6, (), 2, activation="tanh")(x).shape == (5, 2)
    assert LogisticRegression(6, 4)(x).shape == (5, 4)
    m = SparseLogisticRegression([0, 1], [3, 2], 2)
    out = m({"x": x, "x_cat": torch.tensor([[0, 1]] * 5)})
    assert out.shape == (5, 2) and torch.all(out[:, 0] == 0)
    assert SparseLogisticRegression([0], [3], 4)({"x": x, "x_cat": torch.zeros(5, 1, dtype=torch.long)}).shape == (5, 4)


def test_sparse_masked_code_contributes_nothing():
    m = SparseLogisticRegression([], [3, 2], 2)
    with torch.no_grad():
        m.embedding.weight.normal_()
    x = torch.zeros(2, 0)
    full = m({"x": x, "x_cat": torch.tensor([[2, 1], [0, 0]])})
    masked = m({"x": x, "x_cat": torch.tensor([[-1, 1], [0, -1]])})
    w = m.embedding.weight[:, 0]
    torch.testing.assert_close(full[:, 1] - masked[:, 1], torch.stack([w[2], w[3]]))
    # Offsets: column 2's code 1 is row 3 + 1 = 4.
    only = m({"x": x, "x_cat": torch.tensor([[-1, 1]])})
    torch.testing.assert_close(only[0, 1], w[4] + m.bias[0])


def test_specs_round_trip_and_seeded_init():
    d = _data(False)
    spec = spec_for(d, "mlp", hidden=[7])
    assert spec == {"kind": "mlp", "in_features": 3, "hidden": [7], "n_classes": 3, "activation": "relu"}
    a, b = build_model(spec, seed=3), build_model(spec, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    state = torch.random.get_rng_state()
    build_model(spec, seed=4)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched
    sp = spec_for(_data(True), "sparse_logreg")
    assert sp["dense_index"] == [0, 1] and sp["cat_cardinalities"] == [3, 3]
    assert isinstance(build_model(sp), SparseLogisticRegression)
    assert isinstance(build_model(spec_for(d, "logreg")), LogisticRegression)


def test_bad_arguments():
    with pytest.raises(ValueError, match="activation must be one of"):
        MLP(3, (4,), 2, activation="swish")
    with pytest.raises(ValueError, match="n_classes must be >= 2"):
        LogisticRegression(3, 1)
    with pytest.raises(ValueError, match="needs categorical codes"):
        spec_for(_data(False), "sparse_logreg")
    with pytest.raises(ValueError, match="'kind'"):
        build_model({"in_features": 3})
    with pytest.raises(ValueError, match="model kind must be one of"):
        build_model({"kind": "cnn"})


# -- ColumnLinear: a column subset of an input whose other columns are zero -------------------------------------


def _zero_outside(x: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    full = torch.zeros_like(x)
    full[:, columns] = x[:, columns]
    return full


@pytest.mark.parametrize("make", [lambda: MLP(9, (6,), 3), lambda: MLP(9, (), 3), lambda: LogisticRegression(9, 4)])
def test_column_subset_forward_and_gradient_equal_the_full_input(make):
    torch.manual_seed(0)
    model = make()
    assert model.accepts_columns
    columns = torch.tensor([0, 3, 4, 8])
    x = _zero_outside(torch.randn(5, 9), columns)
    full = model(x)
    sub = model(x[:, columns], columns=columns)
    torch.testing.assert_close(sub, full, rtol=1e-6, atol=1e-6)
    params = list(model.parameters())
    g_full = torch.autograd.grad(full.pow(2).sum(), params)
    g_sub = torch.autograd.grad(sub.pow(2).sum(), params)
    for a, b in zip(g_sub, g_full):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    first = next(m for m in model.modules() if isinstance(m, ColumnLinear))
    outside = torch.ones(9, dtype=torch.bool)
    outside[columns] = False
    assert bool((g_sub[params.index(first.weight)][:, outside] == 0).all())  # zero columns get exactly no gradient


def test_column_linear_is_a_linear_with_the_same_state_dict_and_a_named_error():
    layer = ColumnLinear(4, 2)
    assert isinstance(layer, torch.nn.Linear)
    assert set(MLP(4, (3,), 2).state_dict()) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    with pytest.raises(ValueError, match="3 columns but columns lists 2"):
        layer(torch.randn(2, 3), columns=torch.tensor([0, 1]))


_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
def test_models_compute_on_their_own_device(device):
    # "meta" tensors refuse to mix with CPU ones: any tensor a forward made on the CPU would fail here.
    x = torch.randn(5, 6, device=device)
    columns = torch.tensor([0, 2, 5], device=device)
    assert MLP(6, (8,), 3).to(device)(x[:, [0, 2, 5]], columns=columns).device.type == device
    assert LogisticRegression(6, 2).to(device)(x).device.type == device
    for bias, dense in ((True, [0, 1]), (True, []), (False, [0])):
        m = SparseLogisticRegression(dense, [3, 2], 2, bias=bias).to(device)
        out = m({"x": x, "x_cat": torch.tensor([[0, -1]] * 5, device=device)})
        assert out.device.type == device and out.shape == (5, 2)

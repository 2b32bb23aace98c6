"""Ghost clipping's separability check runs on every step, on secretly chosen rows; non-finite gradients add zero.

Attacks reproduced on the release before (issue 23, findings 1 and 4), each written as the attacker would:

* a sequence model that trims padding to the longest sequence *in the batch* and mean-pools passes a check
  that looks only at the first batch, then lets one long record move the clipped sum by many C;
* one record with a NaN feature turns the whole noisy update into NaN, so the released model shows its presence.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from _fdp_synth import make_tabular
from featuredp.clipping import GhostGradients, VmapGradients, alone, distances, ghost_checks
from featuredp.engine import Trainer
from featuredp.errors import BatchMixingError
from featuredp.features import Columns
from featuredp.models import LogisticRegression


class TrimToLongest(nn.Module):
    """Tokens (B, L, d) with lengths (B,): trims the padding to the batch's longest sequence, then mean-pools
    over the trimmed length (padding included): a common NLP speed-up that mixes the batch through its shape."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        longest = int(lengths.max())
        return self.head(torch.tanh(self.embed(x[:, :longest])).mean(1))


def seq_loss(model, batch, draws):
    return nn.functional.cross_entropy(model(batch["x"], batch["len"]), batch["y"], reduction="none")


def seq_batch(n: int, *, long: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, 64, 4)
    lengths = torch.ones(n, dtype=torch.int64)
    x[:, 0] = torch.randn(n, 4, generator=g)
    if long:  # the last record is 64 tokens long
        x[-1] = torch.randn(64, 4, generator=g)
        lengths[-1] = 64
    return {"x": x, "len": lengths, "y": torch.randint(0, 3, (n,), generator=g)}


def flat(sums: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten() for v in sums.values()])


def test_trimming_model_breaks_sensitivity_when_unchecked(monkeypatch):
    # What the check prevents: with it off, adding the long record moves the clipped sum by far more than C.
    monkeypatch.setattr(GhostGradients, "_check_separability", False)
    model, C = TrimToLongest(), 0.1
    without = seq_batch(17, long=True)
    without = {k: v[:-1] for k, v in without.items()}
    with_long = seq_batch(17, long=True)
    s = GhostGradients()
    moved = float((flat(s.clipped_sum(model, seq_loss, with_long, {}, C)[0])
                   - flat(s.clipped_sum(model, seq_loss, without, {}, C)[0])).norm())  # fmt: skip
    assert moved > 3 * C


def test_trimming_model_is_refused_on_the_later_batch_that_holds_the_long_record(comparison):
    # The old check looked at the first batch only (short records: nothing to see) and never again.
    model, s = TrimToLongest(), GhostGradients()
    for step in range(3):
        s.clipped_sum(model, seq_loss, seq_batch(16, seed=step), {}, 0.1)
    with pytest.raises(BatchMixingError, match="strategy='vmap'"):
        s.clipped_sum(model, seq_loss, seq_batch(17, long=True, seed=9), {}, 0.1)


def test_vmap_refuses_nothing_it_cannot_bound_on_the_trimming_model():
    # vmap differentiates each example alone: the long record cannot change another example's gradient.
    model, C = TrimToLongest(), 0.1
    with_long = seq_batch(17, long=True)
    without = {k: v[:-1] for k, v in with_long.items()}
    v = VmapGradients()
    try:
        moved = float((flat(v.clipped_sum(model, seq_loss, with_long, {}, C)[0])
                       - flat(v.clipped_sum(model, seq_loss, without, {}, C)[0])).norm())  # fmt: skip
    except Exception as exc:  # refusing (a data-dependent shape under vmap) is as good as bounding
        assert "vmap" in type(exc).__name__.lower() or "data-dependent" in str(exc) or "item" in str(exc)
        return
    assert moved <= C * (1 + 1e-5)


def test_the_checked_rows_are_chosen_secretly_and_everywhere_in_the_batch(monkeypatch):
    picked: list[list[int]] = []
    original = GhostGradients._alone

    def spy(model, loss_fn, batch, draws, params, rows, **kwargs):
        picked.append(list(rows))
        return original(model, loss_fn, batch, draws, params, rows, **kwargs)

    monkeypatch.setattr(GhostGradients, "_alone", staticmethod(spy))
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))

    def loss(m, b, d):
        return nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    batch = {"x": torch.randn(64, 6), "y": torch.randint(0, 3, (64,))}
    runs = []
    for _ in range(2):  # the same published seeds twice: the checked rows must still differ
        torch.manual_seed(0)
        np.random.seed(0)
        picked.clear()
        s = GhostGradients()
        for _ in range(80 // ghost_checks._SEPARABILITY_EXAMPLES):  # 80 checked rows per run
            s.clipped_sum(model, loss, batch, {}, 1.0)
        runs.append([tuple(p) for p in picked])
    assert runs[0] != runs[1]
    seen = {i for run in runs for rows in run for i in rows}
    assert len(seen) > 48 and max(seen) > 56  # not only the head of the batch
    assert all(len(rows) == len(set(rows)) == ghost_checks._SEPARABILITY_EXAMPLES for run in runs for rows in run)


def test_the_checked_pair_is_uniform_over_all_pairs():
    # Any pair of rows is as likely as any other: a model cannot place a mixing row where checks look less.
    s = GhostGradients()
    s._secret = np.random.default_rng(20261129)  # fixed for the test only; runs use OS entropy
    n, draws = 6, 15_000
    counts = np.zeros((n, n))
    for _ in range(draws):
        i, j = s._pick(torch.ones(n))
        assert i < j
        counts[i, j] += 1
    observed = counts[np.triu_indices(n, 1)]
    expected = draws / len(observed)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 36.1  # the 0.999 quantile of chi-square with 14 degrees of freedom
    assert s._pick(torch.tensor([1.0, float("nan"), 2.0])).tolist() == [0, 2]


def test_chunked_batches_check_a_random_chunk(monkeypatch):
    # A mixing layer inside physical chunks is caught whichever chunk the check lands on.
    class Centre(nn.Module):
        def forward(self, x):
            return x - x.mean(0, keepdim=True)

    model = nn.Sequential(nn.Linear(6, 8), Centre(), nn.Linear(8, 3))

    def loss(m, b, d):
        return m(b["x"]).pow(2).sum(1)

    for _ in range(5):
        with pytest.raises(BatchMixingError):
            GhostGradients(physical_batch_size=4).clipped_sum(model, loss, {"x": torch.randn(16, 6)}, {}, 1.0)


@pytest.mark.parametrize("strategy", [GhostGradients, VmapGradients])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_record_with_a_non_finite_gradient_adds_zero(strategy, bad):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))

    def loss(m, b, d):
        return nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    g = torch.Generator().manual_seed(1)
    clean = {"x": torch.randn(9, 5, generator=g), "y": torch.randint(0, 3, (9,), generator=g)}
    poisoned = {k: v.clone() for k, v in clean.items()}
    poisoned["x"][4, 2] = bad
    s = strategy()
    sums, norms = s.clipped_sum(model, loss, poisoned, {}, 0.5)
    keep = torch.arange(9) != 4
    ref, _ = strategy().clipped_sum(model, loss, {k: v[keep] for k, v in clean.items()}, {}, 0.5)
    assert torch.isfinite(flat(sums)).all()
    torch.testing.assert_close(flat(sums), flat(ref), rtol=1e-5, atol=1e-6)
    assert not torch.isfinite(norms[4]) and torch.isfinite(norms[keep]).all()


@pytest.mark.parametrize("strategy", ["ghost", "vmap"])
def test_the_released_model_no_longer_reveals_an_overflowing_record(capsys, strategy):
    # The attack: train with and without a record whose private feature overflows its gradient (NaN in the data
    # itself is refused up front); on the old code the released model was NaN whenever the record was sampled.
    # Now it is always finite, and only the analyst's stderr says that records were zeroed.
    data = make_tabular(200, seed=3)
    data.X[7, 2] = 3e38  # the private column sex=F
    finite = []
    for _ in range(4):
        torch.manual_seed(0)
        model = LogisticRegression(7, 2)
        res = Trainer(model, "fdp", feature_map=Columns(["sex", "race"]), steps=10, batch_size=100,
                      noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-4, strategy=strategy,
                      progress=False).fit(data)  # fmt: skip
        finite.append(all(torch.isfinite(p).all() for p in model.parameters()))
        assert "nan" not in repr(res.history).lower() and "non-finite" not in repr(res.privacy_report)
    assert all(finite)
    err = capsys.readouterr().err
    assert "non-finite gradient" in err and "contributed zero" in err


def test_a_diverged_run_with_tiny_gradients_is_not_refused_as_mixing():
    # Seen in a real run (DP-SGD with the default lr 1 and momentum, batches of 16 on 300 Adult rows): the model
    # saturates, most rows' gradients are ~1e-21 (float32 Gram norms of those lose whole digits: their squares are
    # denormal), and when both checked rows were such rows, a floor relative to them alone refused an ordinary MLP
    # as mixing (the first of these runs, every time). The floor now follows the chunk's largest gradient.
    from featuredp.data import load_dataset
    from featuredp.experiments.train_one import train_one

    train, test = load_dataset("adult")
    rows = np.sort(np.random.default_rng(300).choice(train.n, 300, replace=False))
    data = (train.subset(rows), test.subset(np.arange(500)))
    for seed in range(3):
        train_one(method="dpsgd", data=data, private=["sex", "race"], epsilon=2.0, progress=False, public_seed=seed,
                  batch_size=16, epochs=16)  # fmt: skip


@pytest.mark.slow  # six trainings; and a rarer false refusal remains (about one suite run in ten, not understood)
def test_a_fully_saturated_batch_is_not_refused_as_mixing(tmp_path, capsys):
    # Seen on sklearn's breast-cancer table with the DP-SGD defaults (`featuredp train --data`): every gradient of a
    # chunk is ~1e-22, so the chunk's own scale gives no floor, and Gram norms 11% off (denormal squares) refused an
    # ordinary MLP in about one run in three. Differences below 1e-6·C cannot move a clipped contribution by more.
    import numpy as np
    from sklearn.datasets import load_breast_cancer

    from featuredp.cli import main

    frame = load_breast_cancer(as_frame=True).frame.rename(columns={"target": "label"})
    frame["label"] = np.where(frame["label"] == 1, "benign", "malignant")
    path = tmp_path / "cancer.csv"
    frame.to_csv(path, index=False)
    args = ["train", "--data", str(path), "--label", "label", "--private", "mean radius,mean texture", "--method",
            "dpsgd", "--epsilon", "2", "--no-baselines", "--quiet"]  # fmt: skip
    for _ in range(6):
        assert main(args) == 0, capsys.readouterr().err


def test_the_rounding_allowance_is_measured_alone_and_is_tiny_for_an_ordinary_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))

    def loss(m, b, d):
        return nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    batch = {"x": torch.randn(6, 5), "y": torch.randint(0, 3, (6,))}
    params = dict(model.named_parameters())
    picked = np.array([1, 4])
    alone = GhostGradients._alone(model, loss, batch, {}, params, picked, twice=False)
    noise = GhostGradients._rounding_noise(model, loss, batch, {}, params, picked, alone)
    norms = torch.stack([torch.cat([alone[n][j].flatten() for n in params]).norm() for j in range(2)]).double()
    assert noise is not None and (noise < 1e-5 * norms).all()  # float32 rounding of a well-conditioned example
    assert all(p.dtype == torch.float32 for p in model.parameters())  # measured on a copy


@pytest.fixture(params=["flat", "compact"])
def comparison(request, monkeypatch):
    """Both ways the every-step check compares: materialised rows (small models) and compact forms (large ones)."""
    if request.param == "compact":
        monkeypatch.setattr(distances, "FLAT_ELEMENTS", 0)
    calls = {"flat": 0}
    original = distances.flat

    def spy(*args):
        calls["flat"] += 1
        return original(*args)

    monkeypatch.setattr(distances, "flat", spy)
    yield request.param
    assert (calls["flat"] > 0) == (request.param == "flat")


def test_the_every_step_check_compares_directions_not_only_norms(monkeypatch, comparison):
    """A reference with the right norms but the opposite direction is refused: the check's distance is
    ‖ghost − alone‖ (materialised, or from Gram forms and inner products), not the difference of the norms."""
    original = alone.example_gradients

    def flipped(*args):  # every batch-of-one gradient, float32 and float64 alike (the rounding retry's too)
        return [[-g for g in grads] for grads in original(*args)]

    monkeypatch.setattr(alone, "example_gradients", flipped)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))

    def loss(m, b, d):
        return nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    batch = {"x": torch.randn(16, 6), "y": torch.randint(0, 3, (16,))}
    with pytest.raises(BatchMixingError):
        GhostGradients().clipped_sum(model, loss, batch, {}, 1.0)

"""TokenView: Ψ on token batches reads the tokens of Ψ(text) and nothing else, and names what Ψ hides."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from featuredp.data.text import TextDataset, TextRecord
from featuredp.data.text_corpus import support_dialogues
from featuredp.errors import DataValidationError
from featuredp.features import TokenView
from featuredp.features.text import Span, TextSpans

PSI = TextSpans(("name", "email", "phone", "card", "number", "date", "address"))


def _batch(n: int = 8) -> dict[str, torch.Tensor]:
    return TextDataset(support_dialogues(n, seed=11), PSI, max_len=128).batch()


def test_view_is_the_public_tokens_under_the_model_keys():
    batch = _batch()
    view = TokenView(PSI)(batch)
    assert sorted(view) == ["x", "y"]
    assert view["x"] is batch["x_pub"] and view["y"] is batch["y_pub"]


def test_view_reads_nothing_but_the_public_tokens():
    """An attacker's view of two batches that differ everywhere except x_pub/y_pub must be the same."""
    batch = _batch()
    g = torch.Generator().manual_seed(0)
    other = {k: (v if k in ("x_pub", "y_pub") else torch.randint(0, 267, v.shape, generator=g)) for k, v in
             batch.items()}  # fmt: skip
    other["extra"] = torch.randn(8, 3, generator=g)
    a, b = TokenView(PSI)(batch), TokenView(PSI)(other)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_describe_is_the_disclosure_of_the_psi_it_was_built_from():
    d = TokenView(PSI).describe()
    assert d == PSI.describe()
    assert "name, email, phone, card, number, date, address" in d.hides
    assert TokenView(PSI).private_entries() == {}


def test_bind_checks_the_data_carries_public_tokens_of_this_psi():
    ds = TextDataset(support_dialogues(4, seed=12), PSI)
    view = TokenView(PSI)
    assert view.bind(ds) is view and view.bind(ds.batch()) is view
    # a dataset whose public tokens were made with a weaker Ψ (emails only) must not be described as this one
    weaker = TextDataset(ds.records, TextSpans(("email",)))
    with pytest.raises(DataValidationError, match="public tokens were made with"):
        view.bind(weaker)
    with pytest.raises(DataValidationError, match="missing"):
        view.bind({"x": torch.zeros(1, 4), "y": torch.zeros(1, 4)})
    with pytest.raises(DataValidationError, match="needs a text dataset"):
        view.bind(np.zeros((3, 4)))
    with pytest.raises(DataValidationError, match="'x_pub' and 'y_pub'"):
        view({"x": torch.zeros(1, 4, dtype=torch.long)})
    with pytest.raises(TypeError, match="psi must be a TextSpans"):
        TokenView("email")  # type: ignore[arg-type]


def test_public_tokens_carry_no_token_of_a_private_span():
    rec = TextRecord("Mail Zoë at zoe@ex.org", [Span(5, 8, "name"), Span(12, 22, "email")])
    batch = TextDataset([rec], PSI, max_len=32).batch()
    view = TokenView(PSI)(batch)
    row = view["x"][0].tolist()
    assert b"zoe@ex.org" not in bytes(t for t in row if t < 256)
    assert b"Zo" not in bytes(t for t in row if t < 256)

"""privacy_utility_plot: what is drawn, PNG written atomically, bad input refused."""

from __future__ import annotations

import pytest

from featuredp.experiments.plots import privacy_utility_plot


def _rows():
    rows = [{"method": "nonprivate", "target_epsilon": None, "accuracy": a} for a in (0.9, 0.92)]
    rows += [{"method": "public", "target_epsilon": float("nan"), "accuracy": 0.5}]
    for eps, accs in ((1.0, (0.2, 0.4)), (4.0, (0.6, 0.6))):
        rows += [{"method": "fdp", "target_epsilon": eps, "accuracy": a} for a in accs]
    return rows


def test_plot_draws_means_stds_and_reference_lines(tmp_path) -> None:
    path = tmp_path / "sub" / "pu.png"
    drawn = privacy_utility_plot(_rows(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["pu.png"]  # no temporary file left behind
    xs, means, stds = drawn["lines"]["fdp"]
    assert xs == [1.0, 4.0] and means == pytest.approx([30.0, 60.0]) and stds == pytest.approx([14.142, 0.0], 1e-3)
    assert drawn["references"]["nonprivate"][0] == pytest.approx(91.0)
    assert drawn["references"]["public"] == (pytest.approx(50.0), 0.0)  # NaN ε counts as a reference
    assert "dpsgd" not in drawn["lines"]


def test_plot_refuses_empty_rows_and_keeps_old_file(tmp_path) -> None:
    path = tmp_path / "pu.png"
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match="at least one result"):
        privacy_utility_plot([], path)
    assert path.read_bytes() == b"old"

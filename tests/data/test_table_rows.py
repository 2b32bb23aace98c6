"""Row ranges of a table file: what a rank of a sharded data-parallel run loads (docs/distributed.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from featuredp.data.files import count_rows, load_table, read_table
from featuredp.errors import DataValidationError


@pytest.fixture
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 1003
    return pd.DataFrame({"age": rng.integers(18, 90, n), "city": rng.choice(["a", "b", "c"], n),
                         "sex": rng.choice(["f", "m"], n), "label": rng.choice(["no", "yes"], n)})  # fmt: skip


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_row_ranges_are_the_slices_of_the_whole_file_and_cover_it(tmp_path, frame, kind):
    path = tmp_path / f"t.{kind}"
    if kind == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False, row_group_size=100)  # ranges cross row groups
    assert count_rows(path) == len(frame)
    parts = [read_table(path, rows=r) for r in ((0, 250), (250, 501), (501, 1003), (1003, 1003))]
    assert [len(p) for p in parts] == [250, 251, 502, 0]
    pd.testing.assert_frame_equal(pd.concat(parts[:3], ignore_index=True), read_table(path))
    with pytest.raises(ValueError, match="start <= stop"):
        read_table(path, rows=(5, 2))


def test_a_shard_must_not_read_its_statistics_from_itself(tmp_path, frame):
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DataValidationError, match=r"age \(bounds\).*city \(categories\).*label \(classes\)"):
        load_table(path, label="label", private=["sex"], numeric=["age"], categorical=["city", "sex"], rows=(0, 500))
    declared = dict(label="label", private=["sex"], numeric=["age"], categorical=["city", "sex"],
                    bounds={"age": (18, 90)}, categories={"city": ["a", "b", "c"], "sex": ["f", "m"]},
                    classes=["no", "yes"], test_fraction=0.5)  # fmt: skip
    shard_a, _ = load_table(path, rows=(0, 500), **declared)
    shard_b, _ = load_table(path, rows=(500, 1003), **declared)
    assert shard_a.feature_names == shard_b.feature_names and not shard_a.statistics_from_data
    assert len(shard_a.y) + len(shard_b.y) == pytest.approx(1003 / 2, abs=2)

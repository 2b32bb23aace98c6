"""Image sets fetch themselves without root: Fashion-MNIST from a (fake) Debian package, Animal-MNIST's wheel.

Everything runs against local fakes: a .deb built here with small IDX files, served by a fake
``apt-get`` on PATH, and a wheel served by a fake ``pip`` client. No network.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from deb_synth import calls, fake_apt_get, fake_client, make_deb

import featuredp.data.images as images
from featuredp.cli import main
from featuredp.data.debian import DebPackage
from featuredp.data.images import fetch_animal_mnist, fetch_fashion_mnist, load_animal_mnist, load_fashion_mnist
from featuredp.errors import DataValidationError

SIZES = {"train": 30, "t10k": 10}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _idx(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return gzip.compress(header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes(), mtime=0)


def _fake_idx_files() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    out = {}
    for prefix, n in SIZES.items():
        out[f"{prefix}-images-idx3-ubyte.gz"] = _idx(rng.integers(0, 256, (n, 28, 28)))
        out[f"{prefix}-labels-idx1-ubyte.gz"] = _idx(np.arange(n) % 10)
    return out


def _leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture
def fake_debian(tmp_path: Path, monkeypatch) -> dict:
    """A fake dataset-fashion-mnist .deb, a fake apt-get serving it, a fresh cache; its checksums accepted."""
    idx = _fake_idx_files()
    pkg = images.FASHION_MNIST_DEB
    (tmp_path / "mirror").mkdir()
    inside = {f"usr/share/datasets/fashion-mnist/{k}": v for k, v in idx.items()}
    deb = make_deb(tmp_path / "mirror" / pkg.filename, inside)
    bin_dir = tmp_path / "bin"
    fake_apt_get(bin_dir, deb)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    monkeypatch.delenv("FEATUREDP_FASHION_MNIST", raising=False)
    monkeypatch.setattr(images, "FASHION_MNIST_DIRS", ())  # a machine with the real package installed: ignore it
    monkeypatch.setattr(images, "FASHION_MNIST_DEB", DebPackage(pkg.name, pkg.version, _sha(deb.read_bytes())))
    monkeypatch.setattr(images, "FASHION_MNIST_SHA256", {k: _sha(v) for k, v in idx.items()})
    return {"deb": deb, "bin": bin_dir, "cache": tmp_path / "cache", "idx": idx}


def test_fetch_on_a_fresh_cache_from_the_cli(fake_debian, capsys) -> None:
    assert main(["data", "fetch", "fashion-mnist", "--quiet"]) == 0
    folder = fake_debian["cache"] / "fashion-mnist"
    assert _leftovers(fake_debian["cache"]) == ["fashion-mnist", *sorted(f"fashion-mnist/{k}" for k in
                                                                         fake_debian["idx"])]  # fmt: skip
    version = images.FASHION_MNIST_DEB.version
    assert calls(fake_debian["bin"], "apt-get") == [f"download dataset-fashion-mnist={version}"]
    out = capsys.readouterr()
    assert f"cached in {folder}" in out.out and "fetching Fashion-MNIST" in out.err
    train, test = load_fashion_mnist()
    assert train.images.shape == (30, 1, 28, 28) and test.images.shape == (10, 1, 28, 28)
    assert main(["data", "fetch", "fashion-mnist", "--quiet"]) == 0  # complete: nothing fetched again
    assert len(calls(fake_debian["bin"], "apt-get")) == 1


def test_load_fetches_on_first_use_then_reads_the_cache(fake_debian, capsys) -> None:
    train, _ = load_fashion_mnist()  # before: FileNotFoundError "apt-get install dataset-fashion-mnist" (root)
    assert len(train) == 30 and "fetching Fashion-MNIST" in capsys.readouterr().err
    fake_debian["deb"].unlink()  # the second use reads the cache
    assert len(load_fashion_mnist()[0]) == 30 and len(calls(fake_debian["bin"], "apt-get")) == 1


def test_a_wrong_package_checksum_is_refused_and_nothing_is_written(fake_debian, monkeypatch) -> None:
    pkg = images.FASHION_MNIST_DEB
    monkeypatch.setattr(images, "FASHION_MNIST_DEB", DebPackage(pkg.name, pkg.version, "0" * 64))
    got = _sha(fake_debian["deb"].read_bytes())
    with pytest.raises(DataValidationError, match=rf"sha256 of {pkg.filename} is {got}, expected 0{{64}}; refusing"):
        load_fashion_mnist()
    assert _leftovers(fake_debian["cache"]) == []  # no dataset folder, no partial folder, no .deb
    assert main(["data", "fetch", "fashion-mnist", "--quiet"]) == 2
    assert _leftovers(fake_debian["cache"]) == []


def test_a_wrong_idx_checksum_is_refused_and_nothing_is_written(fake_debian, monkeypatch) -> None:
    bad = dict(images.FASHION_MNIST_SHA256, **{"t10k-labels-idx1-ubyte.gz": "f" * 64})
    monkeypatch.setattr(images, "FASHION_MNIST_SHA256", bad)
    with pytest.raises(DataValidationError, match=r"sha256 of t10k-labels-idx1-ubyte.gz in .* expected f{64}"):
        fetch_fashion_mnist(progress=False)
    assert _leftovers(fake_debian["cache"]) == []


def test_offline_names_the_fetch_command(fake_debian, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"downloads are off.*`featuredp data fetch fashion-mnist`"):
        load_fashion_mnist()
    monkeypatch.delenv("FEATUREDP_OFFLINE")
    code = main(["compare", "--task", "image-classification", "--offline", "--quick", "--out",
                 str(fake_debian["cache"].parent / "out")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "`featuredp data fetch fashion-mnist`" in err
    assert calls(fake_debian["bin"], "apt-get") == [] and _leftovers(fake_debian["cache"]) == []


def test_without_apt_get_the_error_says_how_else(fake_debian, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(fake_debian["cache"].parent / "empty"))
    where = r"deb\.debian\.org/debian/pool/main/d/dataset-fashion-mnist/"
    pattern = rf"apt-get is not available.*{where}.*--source FILE\.deb.*--dataset-path"
    with pytest.raises(FileNotFoundError, match=pattern):
        load_fashion_mnist()
    assert main(["data", "fetch", "fashion-mnist", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "apt-get is not available" in err
    # ... and the .deb fetched by hand works without apt-get (and without network)
    assert main(["data", "fetch", "fashion-mnist", "--source", str(fake_debian["deb"]), "--quiet"]) == 0
    assert len(load_fashion_mnist()[1]) == 10


def test_a_failing_apt_get_is_one_line(fake_debian, capsys) -> None:
    fake_client(fake_debian["bin"], "apt-get",
                "print('E: Failed to fetch http://deb.debian.org/...', file=sys.stderr)\nsys.exit(100)")
    assert main(["data", "fetch", "fashion-mnist", "--quiet"]) == 2
    fetching, error = capsys.readouterr().err.splitlines()  # the one progress line, then the one-line error
    assert fetching.startswith("featuredp: fetching Fashion-MNIST")
    assert error.startswith("featuredp data: error:") and "failed (exit 100): E: Failed to fetch" in error
    assert _leftovers(fake_debian["cache"]) == []


# -- Animal-MNIST: the wheel through `pip download` --------------------------------------------------------
@pytest.fixture
def fake_pypi(tmp_path: Path, monkeypatch) -> dict:
    """A fake animal_mnist-0.4 wheel with 20 images, a fake pip serving it, a fresh cache; its checksums accepted."""
    x = np.random.default_rng(1).integers(0, 256, (20, 28, 28)).astype(np.uint8)
    y = np.repeat(np.arange(10), 2)
    members = {"animal_data_version_3.gz": gzip.compress(pickle.dumps(x), mtime=0),
               "animal_label_version_3.gz": gzip.compress(pickle.dumps(y), mtime=0)}  # fmt: skip
    wheel = tmp_path / "mirror" / images.ANIMAL_MNIST_WHEEL
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(f"animal_mnist/data/Animal_MNIST/{name}", data)
    bin_dir = tmp_path / "bin"
    pip = fake_client(bin_dir, "pip", f"assert sys.argv[1] == 'download'\n"
                                      f"shutil.copy({str(wheel)!r}, sys.argv[sys.argv.index('-d') + 1])")  # fmt: skip
    monkeypatch.setattr(images, "_pip_command", lambda: [str(pip)])
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    monkeypatch.setattr(images, "ANIMAL_MNIST_WHEEL_SHA256", _sha(wheel.read_bytes()))
    monkeypatch.setattr(images, "ANIMAL_MNIST_SHA256", {k: _sha(v) for k, v in members.items()})
    return {"wheel": wheel, "bin": bin_dir, "cache": tmp_path / "cache"}


def test_animal_mnist_wheel_is_fetched_and_then_found(fake_pypi, capsys) -> None:
    assert main(["data", "fetch", "animal-mnist", "--quiet"]) == 0
    assert _leftovers(fake_pypi["cache"]) == ["animal-mnist", f"animal-mnist/{images.ANIMAL_MNIST_WHEEL}"]
    assert calls(fake_pypi["bin"], "pip")[0].startswith("download animal-mnist==0.4 --no-deps")
    assert "fetching Animal-MNIST" in capsys.readouterr().err
    train, test = load_animal_mnist()  # read from the cached wheel: the package is never installed
    assert len(train) + len(test) == 20 and train.classes[0] == "bear"
    assert fetch_animal_mnist(progress=False) == fake_pypi["cache"] / "animal-mnist" / images.ANIMAL_MNIST_WHEEL
    assert len(calls(fake_pypi["bin"], "pip")) == 1  # cached with the right sha256: not fetched again


def test_animal_mnist_wrong_checksum_and_offline(fake_pypi, monkeypatch) -> None:
    monkeypatch.setattr(images, "ANIMAL_MNIST_WHEEL_SHA256", "0" * 64)
    with pytest.raises(DataValidationError, match=r"sha256 of animal_mnist-0.4-py3-none-any.whl is [0-9a-f]{64}, "
                                                  r"expected 0{64}"):  # fmt: skip
        fetch_animal_mnist(progress=False)
    assert _leftovers(fake_pypi["cache"]) == []
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"downloads are off.*`featuredp data fetch animal-mnist`"):
        fetch_animal_mnist(progress=False)
    assert calls(fake_pypi["bin"], "pip") == [calls(fake_pypi["bin"], "pip")[0]]  # offline: pip never ran again
    assert _leftovers(fake_pypi["cache"]) == []


def test_a_folder_the_user_names_is_used_and_nothing_is_fetched(fake_debian, tmp_path: Path, monkeypatch) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    for name, data in fake_debian["idx"].items():
        (mine / name).write_bytes(data)
    monkeypatch.setenv("FEATUREDP_FASHION_MNIST", str(mine))
    assert len(load_fashion_mnist()[0]) == 30
    assert calls(fake_debian["bin"], "apt-get") == [] and _leftovers(fake_debian["cache"]) == []

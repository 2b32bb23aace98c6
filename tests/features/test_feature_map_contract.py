"""The contract every public feature map Ψ keeps, checked on a zoo holding every map class of featuredp.

* ``describe()`` is a valid :class:`~featuredp.plan.Disclosure` that hides something;
* Ψ is deterministic, per example (a batch's view is the stack of its examples' views, also under
  ``torch.func.vmap`` as the clipping strategies call it) and leaves the input batch alone;
* Ψ reads no private entry: changing only what the map hides leaves the view bitwise unchanged
  (the Gaussian blur, which attenuates rather than erases, gets a bound instead: see ``_checkerboard``);
* every tensor of the view lives on the batch's device.

Adding a feature map = the class + its entry in ``ZOO`` below (the recipe is in
:mod:`featuredp.features.base`): :func:`test_every_map_class_has_a_zoo_entry` finds every concrete
``PublicFeatureMap`` subclass of the package and fails for one without an entry.

The last test trains a tiny image model through the engine and checks that its guarantee names what
the image map hides (image maps once described themselves with other keys and the clause was lost).
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import featuredp
import featuredp.features
from _fdp_synth import make_tabular
from featuredp.batches import as_batch
from featuredp.data.text import TextDataset, TextRecord
from featuredp.data.text_corpus import support_dialogues
from featuredp.diffusion import DiffusionLoss, NoiseSchedule, build_unet
from featuredp.engine import Trainer
from featuredp.features import (
    Batch,
    BoxMask,
    Columns,
    FunctionMap,
    GaussianBlur,
    LabelPrivate,
    Pixelate,
    PublicFeatureMap,
    TokenView,
)
from featuredp.features.text import Span, TextSpans
from featuredp.plan import Disclosure

Perturb = Callable[[PublicFeatureMap, Batch, torch.Generator], Batch]


# --------------------------------------------------------------------------------------------------------
# Changing only what a map hides
# --------------------------------------------------------------------------------------------------------
def _random_like(value: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    if value.is_floating_point():
        return torch.randn(value.shape, generator=g, dtype=value.dtype) * 5 + 3
    return torch.randint(-1, 7, value.shape, generator=g, dtype=value.dtype)


def scramble_declared(fmap: PublicFeatureMap, batch: Batch, g: torch.Generator) -> Batch:
    """Scramble what the map declares private: its ``private_entries()`` masks and every key its view drops."""
    view = fmap(batch)
    masks = fmap.private_entries()
    out = dict(batch)
    for key, value in batch.items():
        if key not in view:
            out[key] = _random_like(value, g)
        elif key in masks:
            out[key] = torch.where(masks[key].expand_as(value), _random_like(value, g), value)
    return out


def _then_declared(change_x: Callable[[PublicFeatureMap, Batch, torch.Generator], torch.Tensor]) -> Perturb:
    """Change the image as ``change_x`` says, then scramble the declared-private keys (a hidden label)."""

    def perturb(fmap: PublicFeatureMap, batch: Batch, g: torch.Generator) -> Batch:
        return scramble_declared(fmap, {**batch, "x": change_x(fmap, batch, g)}, g)

    return perturb


def _checkerboard(fmap: PublicFeatureMap, batch: Batch, g: torch.Generator) -> torch.Tensor:
    """Add detail at the finest scale: a ±a checkerboard per image (a random amplitude each).

    A Gaussian blur hides no entry exactly: it is a linear low-pass filter, invertible in exact
    arithmetic, so "reads no private entry" cannot mean "bitwise unchanged" for it. What it hides
    is the fine detail, which it attenuates: a checkerboard reaches the view scaled by ĝ(π)²
    (about 2·10⁻⁴ at σ = 1). The zoo entry bounds the change of the view by that factor.
    """
    x = batch["x"]
    h, w = x.shape[-2:]
    board = (-1.0) ** (torch.arange(h).view(-1, 1) + torch.arange(w).view(1, -1))
    amplitude = torch.rand((x.shape[0], 1, 1, 1), generator=g, dtype=x.dtype) + 0.5
    return x + amplitude * board.to(x.dtype)


def _within_blocks(fmap: PublicFeatureMap, batch: Batch, g: torch.Generator) -> torch.Tensor:
    """Add ±a to two pixels of every block (a dyadic a per block): each block keeps its mean exactly.

    The images and the changes are multiples of 1/8, so every block sum is exact in float32 and the
    pixelated view must be bitwise unchanged.
    """
    assert isinstance(fmap, Pixelate)
    f = fmap.factor
    x = batch["x"].clone()
    h, w = x.shape[-2:]
    for top in range(0, h, f):
        for left in range(0, w, f):
            bottom, right = min(top + f, h) - 1, min(left + f, w) - 1
            if (bottom, right) == (top, left):
                continue  # a one-pixel block has nothing to hide
            a = torch.randint(1, 8, (x.shape[0], x.shape[1]), generator=g).to(x.dtype) / 8
            x[:, :, top, left] += a
            x[:, :, bottom, right] -= a
    return x


def _inside_boxes(fmap: PublicFeatureMap, batch: Batch, g: torch.Generator) -> torch.Tensor:
    """Replace every pixel inside each image's box by a random value."""
    assert isinstance(fmap, BoxMask)
    x = batch["x"].clone()
    for i, (top, left, bh, bw) in enumerate(batch[fmap.key].tolist()):
        patch = x[i, :, top : top + bh, left : left + bw]
        patch.copy_(torch.randn(patch.shape, generator=g, dtype=x.dtype))
    return x


_TEXTS = support_dialogues(6, seed=0)
_TEXT_PSI = TextSpans(("name", "email", "phone", "card", "number", "date", "address"))


def _token_view() -> tuple[PublicFeatureMap, Batch]:
    return TokenView(_TEXT_PSI), TextDataset(_TEXTS, _TEXT_PSI, max_len=64).batch()


def _inside_spans(fmap: PublicFeatureMap, batch: Batch, g: torch.Generator) -> Batch:
    """The batch of the same records with every private span's contents rewritten (other characters, other
    lengths): only what Ψ hides changes, so the full-text tokens move and the public tokens must not."""
    alphabet = "abcXYZ0189@.-é "
    records = []
    for r in _TEXTS:
        parts, spans, at = [], [], 0
        for sp in r.spans:
            parts.append(r.text[at : sp.start])
            start = sum(map(len, parts))
            n = int(torch.randint(1, 12, (1,), generator=g))
            value = "".join(alphabet[int(i)] for i in torch.randint(0, len(alphabet), (n,), generator=g))
            parts.append(value)
            spans.append(Span(start, start + n, sp.type))
            at = sp.end
        parts.append(r.text[at:])
        records.append(TextRecord("".join(parts), spans))
    return TextDataset(records, _TEXT_PSI, max_len=64).batch()


# --------------------------------------------------------------------------------------------------------
# The zoo
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One map of the zoo: how to build it with a small batch, and how to change only what it hides.

    ``max_change`` bounds max|ΔΨ| / max|Δx| under ``perturb``; 0 means the view must be bitwise unchanged.
    """

    id: str
    build: Callable[[], tuple[PublicFeatureMap, Batch]]
    perturb: Perturb = scramble_declared
    max_change: float = 0.0


def _tabular(
    private: list[str] | None = None, *, public: list[str] | None = None, label_private: bool = False,
    codes: bool = False,
) -> Callable[[], tuple[PublicFeatureMap, Batch]]:
    def build() -> tuple[PublicFeatureMap, Batch]:
        data = make_tabular(12, seed=0, codes=codes)
        return Columns(private, public=public, label_private=label_private).bind(data), as_batch(data)

    return build


def _label_private() -> tuple[PublicFeatureMap, Batch]:
    return LabelPrivate(), as_batch(make_tabular(12, seed=1))


def _function_map() -> tuple[PublicFeatureMap, Batch]:
    private = torch.tensor([False, False, True, True, True, True, True])  # sex and race, one-hot

    def public_columns(batch: Batch) -> Batch:
        return {"x": torch.where(private.to(batch["x"].device), 0.0, batch["x"]), "y": batch["y"]}

    fmap = FunctionMap(public_columns, "age, hours and the label", private={"x": private},
                       hides="the one-hot columns of sex and race")  # fmt: skip
    return fmap, as_batch(make_tabular(12, seed=2))


def _images(*, box: bool = False) -> Batch:
    """Six 2-channel 8×8 images with values on a 1/8 grid, labels, and (``box``) one box per image."""
    g = torch.Generator().manual_seed(0)
    batch = {
        "x": torch.randint(-8, 9, (6, 2, 8, 8), generator=g).float() / 8,
        "y": torch.randint(0, 10, (6,), generator=g),
    }
    if box:  # (top, left, height, width); one empty box, one at the border, one covering everything
        boxes = [[1, 2, 3, 4], [0, 0, 0, 0], [5, 5, 3, 3], [0, 0, 8, 8], [2, 0, 1, 8], [4, 4, 2, 2]]
        batch["box"] = torch.tensor(boxes)
    return batch


def _image(fmap: PublicFeatureMap, *, box: bool = False) -> Callable[[], tuple[PublicFeatureMap, Batch]]:
    return lambda: (fmap, _images(box=box))


ZOO: list[Case] = [
    Case("columns", _tabular(["sex", "race"])),
    Case("columns-codes-private-label", _tabular(["sex", "label"], codes=True)),
    Case("columns-public-list", _tabular(public=["age", "sex"], label_private=True)),
    Case("label-private", _label_private),
    Case("function-map", _function_map),
    Case("gaussian-blur", _image(GaussianBlur(1.0)), _then_declared(_checkerboard), max_change=1e-3),
    Case("gaussian-blur-private-label", _image(GaussianBlur(1.0, label_public=False)),
         _then_declared(_checkerboard), max_change=1e-3),
    Case("pixelate", _image(Pixelate(2)), _then_declared(_within_blocks)),
    Case("pixelate-partial-blocks-private-label", _image(Pixelate(3, label_public=False)),
         _then_declared(_within_blocks)),
    Case("box-mask", _image(BoxMask(fill=-1.0), box=True), _then_declared(_inside_boxes)),
    Case("box-mask-private-label", _image(BoxMask(label_public=False), box=True), _then_declared(_inside_boxes)),
    Case("token-view", _token_view, _inside_spans),
]  # fmt: skip

cases = pytest.mark.parametrize("case", ZOO, ids=[c.id for c in ZOO])


def _map_classes() -> set[type]:
    """Every concrete PublicFeatureMap subclass defined in featuredp (all of featuredp.features imported)."""
    for info in pkgutil.walk_packages(featuredp.features.__path__, "featuredp.features."):
        importlib.import_module(info.name)
    found: set[type] = set()
    todo: list[type] = [PublicFeatureMap]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith(featuredp.__name__ + ".") and not inspect.isabstract(sub):
                found.add(sub)
    return found


def _assert_same(a: Batch, b: Batch) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


# --------------------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------------------
def test_every_map_class_has_a_zoo_entry() -> None:
    covered = {type(case.build()[0]) for case in ZOO}
    missing = sorted(cls.__qualname__ for cls in _map_classes() - covered)
    assert not missing, (
        f"feature map(s) without a zoo entry: {missing}; add a Case to ZOO in "
        "tests/features/test_feature_map_contract.py (see the recipe in featuredp.features.base)"
    )
    assert {"Columns", "LabelPrivate", "FunctionMap", "GaussianBlur", "Pixelate", "BoxMask"} <= {
        cls.__name__ for cls in covered
    }


@cases
def test_describe_is_a_valid_disclosure_that_hides_something(case: Case) -> None:
    fmap, _ = case.build()
    d = fmap.describe()
    assert isinstance(d, Disclosure)
    assert d.map.strip() and d.reveals.strip() and d.hides.strip()
    as_dict = json.loads(json.dumps(d.to_dict()))  # JSON-able, for run.json
    assert (as_dict["map"], as_dict["reveals"], as_dict["hides"]) == (d.map, d.reveals, d.hides)


@cases
def test_view_is_deterministic_new_and_leaves_the_batch_alone(case: Case) -> None:
    fmap, batch = case.build()
    before = {k: v.clone() for k, v in batch.items()}
    first, second = fmap(batch), fmap(batch)
    assert first is not batch and first.keys() == second.keys()
    _assert_same(first, second)
    _assert_same(batch, before)


@cases
def test_view_is_per_example(case: Case) -> None:
    fmap, batch = case.build()
    view = fmap(batch)
    n = next(iter(batch.values())).shape[0]
    for i in range(n):
        one = fmap({k: v[i : i + 1] for k, v in batch.items()})
        _assert_same(one, {k: v[i : i + 1] for k, v in view.items()})


@cases
def test_view_under_vmap_as_the_clipping_strategies_call_it(case: Case) -> None:
    fmap, batch = case.build()

    def per_example(example: Batch) -> Batch:
        out = fmap({k: v.unsqueeze(0) for k, v in example.items()})
        return {k: v.squeeze(0) for k, v in out.items()}

    _assert_same(torch.func.vmap(per_example)(batch), fmap(batch))


@cases
def test_view_reads_no_private_entry(case: Case) -> None:
    fmap, batch = case.build()
    before = {k: v.clone() for k, v in batch.items()}
    changed = case.perturb(fmap, batch, torch.Generator().manual_seed(7))
    _assert_same(batch, before)  # the perturbation made a new batch
    assert any(not torch.equal(changed[k], batch[k]) for k in batch), "the perturbation changed nothing"
    view, other = fmap(batch), fmap(changed)
    if case.max_change == 0:
        _assert_same(other, view)
        return
    assert other.keys() == view.keys()
    for key in view:
        if key != "x":
            assert torch.equal(other[key], view[key]), key
    moved = float((changed["x"] - batch["x"]).abs().max())
    assert float((other["x"] - view["x"]).abs().max()) <= case.max_change * moved


@cases
def test_private_entry_masks_fit_one_example(case: Case) -> None:
    fmap, batch = case.build()
    for key, mask in fmap.private_entries().items():
        assert mask.dtype == torch.bool and tuple(mask.shape) == tuple(batch[key].shape[1:]), key


_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
@cases
def test_view_follows_the_batch_device(case: Case, device: str) -> None:
    # "meta" tensors carry no data but refuse to mix with CPU tensors: a map that makes a CPU tensor fails here.
    fmap, batch = case.build()
    on_device = {k: v.to(device) for k, v in batch.items()}
    view = fmap(on_device)
    assert all(v.device.type == device for v in view.values())
    if device != "meta":
        cpu = fmap(batch)
        for key in cpu:
            torch.testing.assert_close(view[key].cpu(), cpu[key])


# --------------------------------------------------------------------------------------------------------
# The engine names what Ψ hides
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fdp", "public"])
def test_image_run_guarantee_names_what_it_protects(method: str) -> None:
    images = _images()
    data = {"x": images["x"].clamp(-1, 1), "y": images["y"] % 3}
    fmap = GaussianBlur(1.0)
    split = DiffusionLoss(fmap, NoiseSchedule("cosine", 50))
    model = build_unet("tiny", in_channels=2, base_channels=8, channel_mults=(1, 2), num_classes=3)
    trainer = Trainer(model, method, loss_split=split, steps=2, batch_size=3, noise_multiplier=1.0,
                      max_grad_norm=1.0, lr=1e-3, public_seed=0, progress=False)  # fmt: skip
    result = trainer.fit(data)
    hides = "the image detail the Gaussian blur (σ=1 px) removes"
    assert f"protecting {hides}" in result.guarantee
    assert result.guarantee.startswith("(0, 0)-FDP" if method == "public" else "(")
    report = result.to_dict()["privacy_report"]
    assert report["feature_map"] == fmap.describe().to_dict()
    assert report["loss_split"]["feature_map"]["hides"] == hides  # the split embeds Ψ's disclosure

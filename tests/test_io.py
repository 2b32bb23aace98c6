"""``featuredp._io``: names from data become safe file names, and writes stay inside their folder."""

from __future__ import annotations

import os

import pytest

from featuredp._io import inside, safe_filename


@pytest.mark.parametrize("name", ["age", "sex", "hours-per-week", "native.country", "A_1"])
def test_safe_names_are_kept_as_they_are(name: str) -> None:
    assert safe_filename(name) == name


@pytest.mark.parametrize(
    "name", ["../../../evil", "a/b", "..", ".", "", ".hidden", "a\\b", "C:\\x", "a\x00b", "é", "x" * 300, "a b",
             "/etc/passwd", "~", "a\nb"],
)  # fmt: skip
def test_any_name_becomes_one_safe_component(name: str, tmp_path) -> None:
    safe = safe_filename(name)
    assert safe and len(safe) <= 64 and not safe.startswith(".") and safe not in (".", "..")
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in safe)
    assert os.sep not in safe and safe_filename(safe) == safe  # a fixed point: already safe
    (tmp_path / f"attribute_{safe}.md").write_text("x")  # one file right here, no folder
    assert [p.name for p in tmp_path.iterdir()] == [f"attribute_{safe}.md"]


def test_different_names_never_share_a_file() -> None:
    names = ["a/b", "a?b", "a_b", "a b", "..", "...", "", "_", "x" * 100, "x" * 101]
    assert len({safe_filename(n) for n in names}) == len(names)


def test_bounded_length_is_checked() -> None:
    assert len(safe_filename("y" * 500, max_length=30)) == 30
    with pytest.raises(ValueError, match="max_length"):
        safe_filename("a", max_length=5)


def test_inside_refuses_a_path_leading_out_of_its_folder(tmp_path) -> None:
    out = tmp_path / "audit"
    assert inside(out, "attribute_sex.md") == out / "attribute_sex.md"
    for name in ("../evil.md", "attribute_../../../evil.md", "/etc/passwd", ".", ".."):
        with pytest.raises(ValueError, match="leads outside"):
            inside(out, name)
    out.mkdir()
    (out / "link.md").symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(ValueError, match="leads outside"):
        inside(out, "link.md")

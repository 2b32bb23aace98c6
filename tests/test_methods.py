"""The method records: one per method, consistent flags, and the lists derived from them."""

from __future__ import annotations

import dataclasses

import pytest

from featuredp.methods import METHOD_NAMES, METHODS, PRIVATE_METHODS, Method, get_method


def test_names_are_unique_and_keyed_by_themselves() -> None:
    assert len(set(METHOD_NAMES)) == len(METHOD_NAMES) == len(METHODS)
    assert tuple(METHODS) == METHOD_NAMES
    assert all(key == record.name for key, record in METHODS.items())
    assert set(METHOD_NAMES) == {"nonprivate", "public", "dpsgd", "fdp_dpsgd", "fdp"}  # the CLI's --method choices


def test_private_methods_follow_the_records() -> None:
    assert tuple(m.name for m in METHODS.values() if m.private) == PRIVATE_METHODS
    assert PRIVATE_METHODS == ("dpsgd", "fdp_dpsgd", "fdp")
    for m in METHODS.values():
        if m.private:
            assert m.clipped_loss in ("loss", "private_loss"), m.name
        else:
            assert m.clipped_loss is None and not m.public_batch, m.name


def test_flags_that_read_psi_need_a_feature_map() -> None:
    for m in METHODS.values():
        if m.public_batch or m.pretrains or m.public_steps or m.clipped_loss == "private_loss":
            assert m.needs_feature_map, m.name
    assert get_method("fdp").clipped_loss == "private_loss" and get_method("fdp").public_batch
    assert get_method("public").public_steps and not get_method("public").private


def test_labels_and_styles_are_distinct() -> None:
    labels = [m.label for m in METHODS.values()]
    assert len(set(labels)) == len(labels) and all(label.strip() for label in labels)
    styles = [(m.color, m.marker, m.linestyle) for m in METHODS.values()]
    assert len(set(styles)) == len(styles)
    assert {m.name for m in METHODS.values() if m.reference} == {"nonprivate", "public"}


def test_get_method_names_the_choices() -> None:
    assert get_method("dpsgd") is METHODS["dpsgd"]
    assert get_method(METHODS["fdp"]) is METHODS["fdp"]
    with pytest.raises(ValueError, match=r"one of nonprivate, public, dpsgd, fdp_dpsgd, fdp, got 'fpd'"):
        get_method("fpd")


def test_records_are_frozen_and_contradictions_refused() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        METHODS["fdp"].private = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="private exactly when it has a clipped_loss"):
        Method("x", "X", private=True, needs_feature_map=False, public_batch=False, clipped_loss=None)
    with pytest.raises(ValueError, match="needs_feature_map"):
        Method("x", "X", private=True, needs_feature_map=False, public_batch=True, clipped_loss="private_loss")
    with pytest.raises(ValueError, match="public_steps"):
        Method("x", "X", private=False, needs_feature_map=False, public_batch=False, clipped_loss=None,
               public_steps=True)  # fmt: skip

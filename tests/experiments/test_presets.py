"""The preset store: one entry per dataset, per-method parameters derived from the method records."""

from __future__ import annotations

import dataclasses

import pytest

import featuredp.experiments.presets as presets
from featuredp.experiments.presets import (
    DEFAULT_PRESET,
    METHOD_DEFAULTS,
    PRESETS,
    method_defaults,
    method_params,
    preset_for,
    unused_params,
)
from featuredp.methods import METHOD_NAMES, get_method

_PRIVATE_ONLY = {"noise_multiplier", "max_grad_norm", "alpha", "public_weight", "public_batch_size", "pretrain_epochs",
                 "pretrain_lr", "pretrain_batch_size", "strategy", "physical_batch_size"}  # fmt: skip


def test_every_preset_covers_every_method_with_only_keys_it_reads():
    for name, preset in PRESETS.items():
        assert {"load", "quick_load", "model", "loss_split", "delta", "methods", "tune"} <= set(preset), name
        assert set(preset["methods"]) == set(METHOD_NAMES), name
        for method, params in preset["methods"].items():
            assert not set(params) & unused_params(method), (name, method)
            assert set(preset["tune"].get(method, {})) <= set(params), (name, method)


def test_unused_params_follow_the_records():
    # The table the grid and `featuredp train` each kept before the records existed.
    assert unused_params("nonprivate") == unused_params("public") == _PRIVATE_ONLY
    assert unused_params("dpsgd") == {"alpha", "public_weight", "public_batch_size", "pretrain_epochs", "pretrain_lr",
                                      "pretrain_batch_size"}
    assert unused_params("fdp_dpsgd") == {"alpha", "public_weight"}  # m' is its pre-training batches' default
    assert unused_params("fdp") == set()


def test_a_method_without_an_entry_borrows_the_most_similar_one():
    fdp2 = dataclasses.replace(get_method("fdp"), name="fdp2", label="FDP 2")
    assert method_params(PRESETS["purchase-style"]["methods"], fdp2) == PRESETS["purchase-style"]["methods"]["fdp"]
    ref = dataclasses.replace(get_method("nonprivate"), name="nonprivate2")
    assert method_params(PRESETS["adult"]["methods"], ref) == PRESETS["adult"]["methods"]["nonprivate"]


def test_defaults_and_fallback_preset():
    assert METHOD_DEFAULTS is PRESETS[DEFAULT_PRESET]["methods"]
    d = method_defaults("fdp")
    d["lr"] = 123.0
    assert METHOD_DEFAULTS["fdp"]["lr"] != 123.0  # a copy
    assert method_defaults("dpsgd", "census-income")["lr"] == 0.5
    other = preset_for("my-csv")
    assert other["methods"] == PRESETS[DEFAULT_PRESET]["methods"] and other["load"] == {}
    assert other["loss_split"] is None and other["hidden"] == [64]
    other["methods"]["fdp"]["lr"] = 9.0
    assert PRESETS[DEFAULT_PRESET]["methods"]["fdp"]["lr"] != 9.0  # a deep copy
    with pytest.raises(ValueError, match="method must be one of"):
        method_defaults("sgd")


def test_preset_for_gives_every_registered_method_an_entry(monkeypatch):
    fdp2 = dataclasses.replace(get_method("fdp"), name="fdp2", label="FDP 2")
    monkeypatch.setattr(presets, "METHODS", {**presets.METHODS, "fdp2": fdp2})
    monkeypatch.setattr("featuredp.methods.METHODS", {**presets.METHODS, "fdp2": fdp2})
    assert presets.preset_for("census-income")["methods"]["fdp2"] == PRESETS["census-income"]["methods"]["fdp"]


def test_every_preset_tunes_its_private_methods_with_the_same_budget():
    """Unequal candidate counts would credit a method with its search (issue 25: equal tuning)."""
    import math

    from featuredp.experiments.presets import IMAGE_PRESETS, PRESETS

    for name, preset in {**PRESETS, **IMAGE_PRESETS}.items():
        space = preset.get("tune") or {}
        budgets = {m: math.prod(len(v) for v in grid.values()) for m, grid in space.items()}
        assert len(set(budgets.values())) <= 1, (name, budgets)


def test_the_fitted_schedule_gives_dpsgd_a_learning_rate_for_hundreds_of_steps():
    """Adult's DP-SGD lr of 1 (set for ~130 steps) fell below the majority class on small tables at ~600 steps."""
    from featuredp.experiments.presets import FITTED_DPSGD_LR, fitted_schedule

    assert fitted_schedule(2_000, "dpsgd")["lr"] == FITTED_DPSGD_LR == 0.1
    assert "lr" not in fitted_schedule(2_000, "fdp") and "lr" not in fitted_schedule(2_000, "fdp_dpsgd")

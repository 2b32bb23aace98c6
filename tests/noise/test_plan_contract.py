"""The noise-plan contract (issue 36, item 1), checked for every registered plan (featuredp.noise.NOISE_PLANS).

Each plan owns, in one place, what depends on its kind: its accounted terms and hence its one DP event, the
calibration of σ (never overshooting), the budget stop (the most affordable steps), a resumed segment's event, its
sampler and noise source, and its dict form. These tests hold each plan to that, and show that a fourth kind is one
class registered from outside the library (here, from this test) that a Trainer fits with, no library edit needed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pytest
import torch

from _fdp_synth import make_tabular
from featuredp import Trainer
from featuredp.accounting import compute_epsilon, dpsgd_event
from featuredp.accounting.bandmf import bandmf_epsilon
from featuredp.accounting.blt import blt_epsilon
from featuredp.features import Columns
from featuredp.models import LogisticRegression
from featuredp.noise import (
    BLT,
    NOISE_PLANS,
    BandMF,
    Independent,
    NoisePlan,
    TorchNoise,
    noise_plan,
    noise_plan_from_dict,
    plan_settings,
    register_noise_plan,
)
from featuredp.plan import PrivacyPlan

KINDS = list(NOISE_PLANS)
N, M, T, DELTA = 1000, 50.0, 60, 1e-5


def _planned(kind: str) -> NoisePlan:
    return noise_plan(kind).planned(N, M, T, target_epsilon=None, delta=DELTA, momentum=0.0, relation="add-remove",
                                    accountant="pld")  # fmt: skip


def _plan(kind: str, sigma: float = 1.0) -> PrivacyPlan:
    return PrivacyPlan("dpsgd", N, M, M / N, T, noise_multiplier=sigma, max_grad_norm=1.0, delta=DELTA,
                       noise=_planned(kind))  # fmt: skip


def test_the_library_registers_its_three_kinds_default_first():
    assert KINDS[:1] == ["independent"] and {"bandmf", "blt"} <= set(KINDS)
    assert all(NOISE_PLANS[k].kind == k for k in KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_a_plan_carries_privacy_not_presentation(kind):
    # Plot styles live with the plots (featuredp.experiments.plots), whether --bands applies with the CLI, which
    # reads the plan's settings (plan_settings); the protocol keeps what the privacy needs.
    cls = NOISE_PLANS[kind]
    assert not {"takes_bands", "line_style", "plot_style"} & set(dir(cls))
    assert ("bands" in plan_settings(cls)) == (cls is BandMF)
    assert set(_planned(kind).settings()) <= set(plan_settings(cls))


@pytest.mark.parametrize("kind", KINDS)
def test_the_event_is_the_one_built_from_its_terms(kind):
    plan = _plan(kind)
    for t in (1, 7, T):
        assert plan.event(t) == dpsgd_event(*plan.dpsgd_terms(t))
        assert plan.epsilon(t) == compute_epsilon(dpsgd_event(*plan.dpsgd_terms(t)), DELTA)
        # a resumed segment is accounted by the plan's segment rule, never below the steps it ran
        seg = plan.noise.segment_steps(plan, t)
        assert seg >= t and plan.event(t, segment=True) == dpsgd_event(*plan.dpsgd_terms(seg))


@pytest.mark.parametrize("kind", KINDS)
def test_calibration_never_overshoots_and_is_tight(kind):
    plan, target = _plan(kind), 2.0
    sigma = plan.calibrated_noise_multiplier(target)
    assert replace(plan, noise_multiplier=sigma).epsilon() <= target
    # 3% less noise spends more than the target, or within the calibration's 1% tolerance of it
    assert replace(plan, noise_multiplier=sigma * 0.97).epsilon() > target * 0.99


@pytest.mark.parametrize("kind", KINDS)
def test_the_budget_stop_is_the_largest_affordable_step_count(kind):
    plan = _plan(kind, sigma=3.0)
    target = 0.6 * plan.epsilon()  # the budget binds before the planned steps, so "largest" is tested
    stop = plan.affordable_steps(target)
    assert 1 <= stop < T
    assert plan.epsilon(stop) <= target < plan.epsilon(stop + 1)


@pytest.mark.parametrize("kind", KINDS)
def test_the_plan_round_trips_through_its_dict_and_json(kind):
    noise = _planned(kind)
    assert noise.is_planned and noise_plan_from_dict(json.loads(json.dumps(noise.to_dict()))) == noise
    plan = _plan(kind)
    back = PrivacyPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and back.epsilon() == plan.epsilon()
    assert plan.to_dict()["noise"]["kind"] == kind


@pytest.mark.parametrize("kind", KINDS)
def test_the_sampler_and_noise_source_draw_the_right_shapes(kind):
    plan, dim = _plan(kind), 11
    sampler, noise = plan.noise.sampler_and_noise(plan, 0, N, np.random.default_rng(), TorchNoise(torch.Generator()),
                                                  dim)  # fmt: skip
    seen = [np.asarray(sampler.sample()) for _ in range(5)]
    assert all(idx.ndim == 1 and ((idx >= 0) & (idx < N)).all() for idx in seen)
    assert 0 < np.mean([idx.size for idx in seen]) < 3 * M
    sums = {"w": torch.zeros(3, 3), "b": torch.zeros(2)}
    noisy = noise.add(sums, 1.0)
    assert {k: v.shape for k, v in noisy.items()} == {k: v.shape for k, v in sums.items()}
    assert all(torch.isfinite(v).all() and v.abs().sum() > 0 for v in noisy.values())
    block = plan.noise.report(plan, T)
    assert (block is None) == (not plan.noise.correlated)
    assert isinstance(plan.noise.progress_label("fdp"), str) and "{T}" in plan.noise.describe(plan, "add/remove")


def _model() -> LogisticRegression:
    torch.manual_seed(1)
    return LogisticRegression(7, 2)


def _fdp(noise: object, **kw) -> Trainer:
    args = dict(feature_map=Columns(["sex", "race"]), steps=16, batch_size=20, noise_multiplier=1.0,
                max_grad_norm=1.0, delta=1e-4, progress=False)  # fmt: skip
    args.update(kw)
    return Trainer(_model(), "fdp", noise=noise, **args)


@pytest.mark.parametrize("kind", KINDS)
def test_the_replay_self_test_passes_with_each_plan(kind):
    from featuredp.testing import verdict

    reports = _fdp(NOISE_PLANS[kind]()).check_model(make_tabular(200, seed=1), records=2)
    assert all(c.ok for r in reports for c in r.checks) and verdict(reports).startswith("safe")


def test_a_plan_instance_and_its_name_give_the_same_run_plan():
    by_name = _fdp("bandmf", bands=4).make_plan(200)
    assert _fdp(BandMF(bands=4)).make_plan(200) == by_name and by_name.bands == 4
    with pytest.raises(ValueError, match="bands is for noise='bandmf', got bands=4 with noise='blt'"):
        _fdp(BLT(), bands=4)
    with pytest.raises(ValueError, match="bands=2 disagrees with the noise plan's bands=4"):
        _fdp(BandMF(bands=4), bands=2)


# -- plan dicts of earlier versions (run.json, checkpoints) ----------------------------------------------------

_OLD = {"method": "fdp", "dataset_size": 1000, "expected_batch_size": 50.0, "sampling_rate": 0.05, "steps": 60,
        "pretrain_steps": 0, "public_batch_size": 200, "pretrain_batch_size": None, "noise_multiplier": 1.1,
        "max_grad_norm": 1.0, "alpha": 1.0, "public_weight": 1.0, "delta": 1e-5, "target_epsilon": None,
        "budget_steps": None, "relation": "add-remove", "accountant": "pld"}  # fmt: skip


def test_an_old_plan_dict_without_noise_loads_as_independent_noise():
    plan = PrivacyPlan.from_dict(dict(_OLD))
    assert plan.noise == Independent() and plan.bands is None and plan.noise_coeffs is None
    assert plan.epsilon() == compute_epsilon(dpsgd_event(1.1, 0.05, 60), 1e-5)


def test_an_old_independent_plan_dict_loads():
    old = {**_OLD, "noise": "independent", "bands": None, "noise_coeffs": None, "record_target_epsilon": None,
           "record_noise_multiplier": None}  # fmt: skip
    plan = PrivacyPlan.from_dict(old)
    assert plan.noise == Independent() and PrivacyPlan.from_dict(plan.to_dict()) == plan


def test_an_old_bandmf_plan_dict_loads_with_its_bands_and_coefficients():
    old = {**_OLD, "noise": "bandmf", "bands": 2, "noise_coeffs": [1.0, 0.5], "record_target_epsilon": None,
           "record_noise_multiplier": None}  # fmt: skip
    plan = PrivacyPlan.from_dict(old)
    assert plan.noise == BandMF(bands=2, coeffs=(1.0, 0.5)) and plan.bands == 2 and plan.noise_coeffs == (1.0, 0.5)
    # accounted as that BandMF run, not as independent noise
    assert plan.epsilon() == bandmf_epsilon(1.1, 50.0, 1000, 60, 2, [1.0, 0.5], 1e-5)
    assert plan.epsilon() != compute_epsilon(dpsgd_event(1.1, 0.05, 60), 1e-5)


def test_an_old_blt_plan_dict_loads_with_its_parameters():
    old = {**_OLD, "noise": "blt", "bands": None, "noise_coeffs": [0.9, 0.3], "record_target_epsilon": None,
           "record_noise_multiplier": None}  # fmt: skip
    plan = PrivacyPlan.from_dict(old)
    assert plan.noise == BLT(coeffs=(0.9, 0.3)) and plan.noise_coeffs == (0.9, 0.3)
    assert plan.epsilon() == blt_epsilon(1.1, [0.9, 0.3], 50.0, 1000, 60, 1e-5)


# -- a fourth kind: one class, registered from outside the library ---------------------------------------------


@dataclass(frozen=True)
class Echo(Independent):
    """Independent noise under another name: the smallest possible new kind."""

    kind: ClassVar[str] = "echo_test"
    label: ClassVar[str] = "Echo"
    order: ClassVar[int] = 5


@pytest.fixture
def echo():
    register_noise_plan(Echo)
    try:
        yield Echo
    finally:
        NOISE_PLANS.pop(Echo.kind, None)


def test_a_new_kind_needs_one_class_and_no_library_edit(echo):
    from featuredp.cli._flags import NOISES

    assert "echo_test" in NOISES and list(NOISE_PLANS)[-1] == "echo_test"  # the CLI's --noise choices
    data = make_tabular(200, seed=3)
    res = _fdp("echo_test", seed=0).fit(data)
    ref = _fdp("independent", seed=0).fit(data)
    assert res.plan.noise == Echo() and res.plan.noise.kind == "echo_test"
    assert res.epsilon == ref.epsilon and math.isfinite(res.epsilon)
    assert PrivacyPlan.from_dict(json.loads(json.dumps(res.plan.to_dict()))) == res.plan
    assert res.privacy_report.get("correlated_noise") is None


def test_a_kind_name_is_registered_once(echo):
    @dataclass(frozen=True)
    class Other(Independent):
        kind: ClassVar[str] = "echo_test"

    with pytest.raises(ValueError, match="already registered"):
        register_noise_plan(Other)
    with pytest.raises(ValueError, match="noise must be one of"):
        noise_plan("nope")

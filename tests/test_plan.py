"""The privacy plan, the Disclosure of Ψ, and the guarantee sentence (read from the method records)."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys

import pytest

from featuredp.methods import METHOD_NAMES, METHODS, get_method
from featuredp.plan import Disclosure, PrivacyPlan, TrainResult, inf_to_str, str_to_inf

BLUR = Disclosure("gaussian_blur", reveals="the blurred image", hides="the fine detail", details={"sigma": 1.0})


def _plan(method: str, **kw: object) -> PrivacyPlan:
    args: dict = {"dataset_size": 1000, "expected_batch_size": 100, "sampling_rate": 0.1, "steps": 50}
    if get_method(method).private:
        args.update(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)
    return PrivacyPlan(method, **{**args, **kw})


def test_plan_and_methods_import_no_torch() -> None:
    # Tables, plots and the accountant read these: they must not pull in torch.
    code = "import sys, featuredp.plan, featuredp.methods; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_disclosure_needs_phrases_and_serialises() -> None:
    with pytest.raises(ValueError, match=r"Disclosure\.hides"):
        Disclosure("m", reveals="everything", hides=" ")
    with pytest.raises(ValueError, match=r"Disclosure\.map"):
        Disclosure("", reveals="a", hides="b")
    d = BLUR.to_dict()
    assert d == {"sigma": 1.0, "map": "gaussian_blur", "reveals": "the blurred image", "hides": "the fine detail"}
    assert json.loads(json.dumps(d)) == d


def test_disclosure_keeps_dict_style_reads_for_older_callers() -> None:
    assert BLUR["hides"] == "the fine detail" and BLUR["sigma"] == 1.0
    assert BLUR.get("missing", 3) == 3 and "reveals" in BLUR and "nope" not in BLUR
    with pytest.raises(KeyError):
        BLUR["nope"]


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_guarantee_follows_the_method_record(name: str) -> None:
    m = METHODS[name]
    text = _plan(name).guarantee(1.25, BLUR)
    if m.public_steps:
        assert text.startswith("(0, 0)-FDP protecting the fine detail")
    elif not m.private:
        assert text == "no privacy guarantee (non-private training)"
    elif not m.needs_feature_map:
        assert text.startswith("(1.25, 1e-05)-DP for whole records") and "protecting" not in text
    else:
        assert text.startswith("(1.25, 1e-05)-FDP protecting the fine detail: ")
        assert ("Algorithm 1" in text) == m.public_batch
    assert text == _plan(name).guarantee(1.25, BLUR.to_dict())  # the run.json form reads the same


def test_guarantee_and_epsilon_compare_no_method_names() -> None:
    for fn in (PrivacyPlan.guarantee, PrivacyPlan.epsilon, PrivacyPlan.is_private.fget):
        body = inspect.getsource(fn).split('"""')[-1]  # the code after the docstring
        assert not [name for name in METHOD_NAMES if f'"{name}"' in body or f"'{name}'" in body], fn


def test_guarantee_mentions_pretraining_and_no_map() -> None:
    assert "after public pre-training" in _plan("fdp", pretrain_steps=10).guarantee(1.0, BLUR)
    assert "protecting" not in _plan("fdp").guarantee(1.0, None)


def test_epsilon_by_method_and_steps() -> None:
    assert _plan("public").epsilon() == 0.0
    assert math.isinf(_plan("nonprivate").epsilon())
    fdp = _plan("fdp")
    assert fdp.epsilon(0) == 0.0 and 0 < fdp.epsilon(10) < fdp.epsilon() < fdp.epsilon(100)
    assert fdp.epsilon() == _plan("dpsgd").epsilon()  # same (σ, p, T): same ε
    assert math.isinf(_plan("fdp", noise_multiplier=0.0).epsilon())
    with pytest.raises(ValueError, match="needs delta"):
        _plan("fdp", delta=None).epsilon()


def test_epsilon_matches_dp_accounting_on_the_plan_numbers_directly() -> None:
    # An independent reference (not the plan's own terms): the Poisson-subsampled Gaussian at q = m/n, σ, T,
    # self-composed, through dp-accounting's PLD accountant. DP-SGD accounted at q/2 gives about half this ε.
    import dp_accounting

    for method in ("dpsgd", "fdp"):
        plan = _plan(method)
        step = dp_accounting.PoissonSampledDpEvent(100 / 1000, dp_accounting.GaussianDpEvent(1.0))
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
        acc.compose(dp_accounting.SelfComposedDpEvent(step, 50))
        ref = acc.get_epsilon(1e-5)
        assert plan.epsilon() == pytest.approx(ref, rel=5e-3), method


def test_plan_round_trips_through_json() -> None:
    plan = _plan("fdp", target_epsilon=math.inf, budget_steps=40)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["target_epsilon"] == "inf" and PrivacyPlan.from_dict(data) == plan
    assert inf_to_str(None) is None and str_to_inf("x") == "x"


def test_train_result_writes_disclosures_as_dicts() -> None:
    plan = _plan("fdp")
    result = TrainResult("fdp", plan, math.inf, 1e-5, 3, 0, False, None, "g", {"feature_map": BLUR, "n": {"m": BLUR}})
    d = json.loads(json.dumps(result.to_dict()))
    assert d["epsilon"] == "inf" and d["privacy_report"]["feature_map"] == BLUR.to_dict()
    assert d["privacy_report"]["n"]["m"]["hides"] == "the fine detail"


def test_guarantee_states_the_delta_it_is_given() -> None:
    # The engine states the plan's δ plus the noise sampler's tail (featuredp.accounting.sampler_tail_delta).
    plan = _plan("fdp")
    assert plan.guarantee(1.0, BLUR).startswith("(1, 1e-05)-FDP")
    assert plan.guarantee(1.0, BLUR, delta=1.5e-5).startswith("(1, 1.5e-05)-FDP")
    assert _plan("dpsgd").guarantee(2.0, None, delta=2e-5).startswith("(2, 2e-05)-DP for whole records")

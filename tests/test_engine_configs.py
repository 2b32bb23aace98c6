"""The Trainer's settings as frozen configs, the flat keyword form, and the device seam."""

from __future__ import annotations

import pytest
import torch

from _fdp_synth import make_tabular
from featuredp.config import PerformanceConfig, PrivacyConfig, ScheduleConfig, split_settings
from featuredp.engine import Trainer
from featuredp.features import Columns
from featuredp.models import LogisticRegression


def _model() -> LogisticRegression:
    torch.manual_seed(0)
    return LogisticRegression(7, 2)


def test_flat_keywords_and_configs_build_the_same_trainer():
    flat = Trainer(_model(), "fdp", feature_map=Columns(["sex"]), steps=4, batch_size=20, noise_multiplier=1.0,
                   lr=0.05, strategy="vmap", progress=False)  # fmt: skip
    cfg = Trainer(_model(), "fdp", feature_map=Columns(["sex"]),
                  privacy=PrivacyConfig(noise_multiplier=1.0), schedule=ScheduleConfig(steps=4, batch_size=20, lr=0.05),
                  performance=PerformanceConfig(strategy="vmap", progress=False))  # fmt: skip
    assert flat.privacy == cfg.privacy and flat.schedule == cfg.schedule
    assert flat.config() == cfg.config()
    assert flat.lr == 0.05 and flat.noise_multiplier == 1.0  # flat reads still work


def test_configs_are_frozen_and_validated_up_front():
    with pytest.raises(ValueError, match="exactly one of epochs= or steps="):
        ScheduleConfig()
    with pytest.raises(ValueError, match="lr"):
        ScheduleConfig(steps=1, lr=-1)
    with pytest.raises(ValueError, match="max_grad_norm"):
        PrivacyConfig(max_grad_norm=0)
    cfg = ScheduleConfig(steps=3)
    with pytest.raises(AttributeError):
        cfg.steps = 5  # type: ignore[misc]


def test_unknown_or_doubled_settings_are_named():
    with pytest.raises(TypeError, match="unknown Trainer setting 'learning_rate'"):
        Trainer(_model(), "nonprivate", steps=1, learning_rate=0.1)
    with pytest.raises(TypeError, match="give schedule= or the flat settings"):
        Trainer(_model(), "nonprivate", schedule=ScheduleConfig(steps=1), lr=0.1)
    assert set(split_settings({"alpha": 1.0})) == {"privacy"}


def test_auto_is_the_default_strategy_and_chooses_ghost_on_a_one_position_model():
    t = Trainer(_model(), "dpsgd", steps=1, batch_size=20, noise_multiplier=1.0, progress=False)
    assert t.strategy.name == "auto"
    t.fit(make_tabular(100, seed=1))
    assert t.strategy.name == "auto:ghost" and t.config()["strategy"] == "auto:ghost"


def test_cpu_device_runs_and_is_recorded():
    t = Trainer(_model(), "fdp", feature_map=Columns(["sex"]), steps=3, batch_size=20, noise_multiplier=1.0,
                device="cpu", progress=False)  # fmt: skip
    t.fit(make_tabular(100, seed=1))
    assert t.config()["device"] == "cpu" and next(t.model.parameters()).device.type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_absent_device_is_a_one_line_error_before_any_work():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="CUDA is not available"):
        Trainer(model, "dpsgd", steps=1, noise_multiplier=1.0, device="cuda")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="device must be"):
        Trainer(model, "dpsgd", steps=1, noise_multiplier=1.0, device="tpu")


def test_auto_device_is_cpu_without_accelerators():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    t = Trainer(_model(), "nonprivate", steps=1, device="auto")
    assert t.device.type in ("cpu", "mps")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_keeps_every_tensor_on_the_device():
    t = Trainer(_model(), "fdp", feature_map=Columns(["sex"]), steps=3, batch_size=20, noise_multiplier=1.0,
                device="cuda", progress=False)  # fmt: skip
    res = t.fit(make_tabular(100, seed=1))
    assert next(t.model.parameters()).is_cuda and res.steps == 3

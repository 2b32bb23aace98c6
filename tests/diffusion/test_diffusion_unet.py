"""U-Net (GroupNorm only, no mixing across the batch), schedules and samplers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from featuredp.clipping import check_no_batch_mixing
from featuredp.diffusion.sampler import ddim_sample, ddpm_sample, generate
from featuredp.diffusion.schedule import NoiseSchedule
from featuredp.diffusion.unet import PRESETS, UNetConfig, build_unet, count_parameters


@pytest.mark.parametrize("preset", list(PRESETS))
def test_groupnorm_only(preset: str) -> None:
    model = build_unet(preset)
    norms = [m for m in model.modules() if "Norm" in type(m).__name__]
    assert norms and all(isinstance(m, nn.GroupNorm) for m in norms)
    check_no_batch_mixing(model)  # the engine's refusal of BatchNorm passes


def test_sizes_of_the_presets() -> None:
    n = {p: count_parameters(build_unet(p)) for p in ("tiny", "small")}
    assert 0.2e6 < n["tiny"] < 0.35e6 and 0.8e6 < n["small"] < 1.3e6


def test_no_mixing_across_the_batch_and_any_size() -> None:
    torch.manual_seed(0)
    model = build_unet("tiny")
    nn.init.normal_(model.conv_out.weight, std=0.1)
    x = torch.randn(4, 1, 28, 28)
    t = torch.tensor([0, 10, 500, 999])
    y = torch.tensor([0, 3, 9, 10])  # 10 = the null class
    out = model(x, t, y)
    x2 = x.clone()
    x2[1:] = torch.randn(3, 1, 28, 28)
    assert torch.allclose(model(x2, t, y)[0], out[0], atol=1e-6)
    assert build_unet("tiny", in_channels=3, num_classes=2)(torch.randn(2, 3, 32, 32), t[:2]).shape == (2, 3, 32, 32)
    with pytest.raises(ValueError, match="preset"):
        build_unet("huge")
    with pytest.raises(ValueError, match="num_res_blocks"):
        build_unet("tiny", num_res_blocks=0)
    assert UNetConfig().to_dict()["channel_mults"] == [1, 2, 2]


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_schedules(kind: str) -> None:
    s = NoiseSchedule(kind, 1000)
    a = s.alphas_cumprod
    assert torch.all(a[1:] < a[:-1]) and 0.98 < float(a[0]) < 1 and float(a[-1]) < 1e-3
    x0 = torch.randn(3, 1, 4, 4)
    eps = torch.randn(3, 1, 4, 4)
    xt = s.q_sample(x0, torch.tensor([0, 0, 999]), eps)
    assert torch.allclose(xt[:2], x0[:2], atol=0.15) and torch.allclose(xt[2], eps[2], atol=0.05)
    with pytest.raises(ValueError, match="schedule"):
        NoiseSchedule("quadratic")


class _Oracle(nn.Module):
    """The exact ε-predictor for data that is always the image ``c``: ε = (x_t − √ᾱ c)/√(1 − ᾱ)."""

    def __init__(self, schedule: NoiseSchedule, c: torch.Tensor) -> None:
        super().__init__()
        self.s, self.c = schedule, c

    def forward(self, x, t, y=None):
        a = self.s.abar(t).view(-1, 1, 1, 1)
        return (x - a.sqrt() * self.c) / (1 - a).sqrt()


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_samplers_recover_a_point_mass(kind: str) -> None:
    s = NoiseSchedule(kind, 200)
    c = torch.linspace(-0.8, 0.8, 16).view(1, 1, 4, 4)
    g = torch.Generator().manual_seed(0)
    out = ddim_sample(_Oracle(s, c), s, (1, 4, 4), n=5, steps=20, generator=g)
    assert torch.allclose(out, c.expand(5, -1, -1, -1), atol=1e-4)
    out = ddpm_sample(_Oracle(s, c), s, (1, 4, 4), n=3, generator=g)
    assert torch.allclose(out, c.expand(3, -1, -1, -1), atol=1e-3)
    out = ddim_sample(_Oracle(s, c), s, (1, 4, 4), n=2, steps=10, eta=1.0, generator=g)
    assert torch.allclose(out, c.expand(2, -1, -1, -1), atol=1e-3)


def test_generate_is_reproducible_and_checks_its_arguments() -> None:
    model = build_unet("tiny")
    s = NoiseSchedule("cosine", 100)
    labels = torch.arange(6) % 3
    a = generate(model, s, (1, 28, 28), labels, steps=2, batch_size=4, seed=1, progress=False)
    b = generate(model, s, (1, 28, 28), labels, steps=2, batch_size=4, seed=1, progress=False)
    assert a.shape == (6, 1, 28, 28) and torch.equal(a, b) and float(a.abs().max()) <= 1
    with pytest.raises(ValueError, match="steps"):
        ddim_sample(model, s, (1, 28, 28), n=1, steps=101)
    with pytest.raises(ValueError, match="labels or n"):
        ddim_sample(model, s, (1, 28, 28))


def test_a_linear_schedule_too_short_for_its_betas_is_refused() -> None:
    with pytest.raises(ValueError, match="timesteps > 20"):
        NoiseSchedule("linear", 20)
    assert float(NoiseSchedule("linear", 21).alphas_cumprod[-1]) > 0


_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
def test_samplers_follow_the_model_device(device: str) -> None:
    # "meta" tensors refuse to mix with CPU ones: a timestep, label or noise made on the CPU would fail here.
    model = build_unet("tiny", base_channels=8, channel_mults=(1, 2), num_classes=3).to(device)
    s = NoiseSchedule("cosine", 20)
    labels = torch.tensor([0, 1, 2])  # CPU labels are moved to the model
    g = torch.Generator().manual_seed(0)  # a CPU generator: the noise is drawn there, then moved
    assert ddim_sample(model, s, (1, 8, 8), labels=labels, steps=3, eta=1.0, generator=g).device.type == device
    assert ddpm_sample(model, s, (1, 8, 8), n=2, generator=g).device.type == device
    out = generate(model, s, (1, 8, 8), labels, steps=2, batch_size=2, progress=False)
    assert out.device.type == device and out.shape == (3, 1, 8, 8)
    assert generate(model, s, (1, 8, 8), labels[:0], progress=False).device.type == device
    if device != "meta":  # one seed, the same starting noise on every device
        cpu = generate(model.cpu(), s, (1, 8, 8), labels, steps=2, batch_size=2, progress=False)
        torch.testing.assert_close(out.cpu(), cpu, atol=1e-4, rtol=0)


def test_a_model_without_parameters_samples_on_the_given_device() -> None:
    s = NoiseSchedule("cosine", 50)
    c = torch.zeros(1, 1, 2, 2)
    oracle = _Oracle(s, c.to("meta"))
    out = ddim_sample(oracle, s, (1, 2, 2), n=2, steps=2, device="meta", generator=torch.Generator().manual_seed(0))
    assert out.device.type == "meta"

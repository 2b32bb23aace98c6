"""The two loops are one run: with a fixed secret key, the PrivacyEngine's loop and the Trainer's loop release the
same parameters, bit for bit, for every method × strategy × noise plan, with and without the backstop.

Both loops draw from a :class:`featuredp.run.PrivateRun` built from the same key: the same Poisson batches, the
same noise, the same public (or record-level) batches. A difference would mean one loop releases something the
other does not, and one of the two printed ε's would not describe what ran.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine
from featuredp.engine import Trainer
from featuredp.features import Columns

N, D, BATCH, STEPS, SEED = 240, 6, 24, 4, 1234
NAMES = [f"c{i}" for i in range(D)]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    return x, (x[:, 0] - x[:, 3] > 0).long()


def _model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 2))


CASES = [(method, mode, noise, backstop)
         for method in ("dpsgd", "fdp_dpsgd", "fdp") for mode in ("ghost", "vmap")
         for noise in ("independent", "bandmf", "blt") for backstop in (False, True)
         if not (backstop and noise != "independent")]  # the backstop is for independent noise  # fmt: skip


@pytest.mark.parametrize(("method", "mode", "noise", "backstop"), CASES)
def test_the_engines_loop_and_the_trainers_loop_release_the_same_parameters(method, mode, noise, backstop):
    x, y = _data()
    model = _model()
    extra: dict = {"record_epsilon": 50.0} if backstop else {}
    fdp = method != "dpsgd"
    psi = {"feature_map": Columns(private=["c1", "c2"])} if fdp else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trained = copy.deepcopy(model)
        trainer = Trainer(trained, method, noise_multiplier=1.0, max_grad_norm=1.0, sampling_rate=BATCH / N,
                          steps=STEPS, delta=1e-5, strategy=mode, seed=SEED, lr=0.1, momentum=0.0, progress=False,
                          noise=noise, **psi, **extra)  # fmt: skip
        trainer.fit(_named(x, y) if fdp else {"x": x, "y": y})
        mine = copy.deepcopy(model)
        engine = PrivacyEngine(seed=SEED)
        out = engine.make_private(
            criterion=nn.CrossEntropyLoss(), module=mine, optimizer=torch.optim.SGD(mine.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH), noise_multiplier=1.0, max_grad_norm=1.0,
            grad_sample_mode="ghost" if mode == "ghost" else "vmap", method=method, steps=STEPS, noise=noise,
            **({"feature_names": NAMES} | psi if fdp else {}), **extra)  # fmt: skip
        m, o, loader = out[0], out[1], out[-1]
        c = out[2] if len(out) == 4 else nn.CrossEntropyLoss()  # vmap: no criterion returned, the loop's own
        done = 0
        while done < STEPS:
            for xb, yb in loader:
                o.zero_grad()
                c(m(xb), yb).backward()
                o.step()
                done += 1
                if done == STEPS:
                    break
    assert engine.steps == trainer.run.state.private_steps == STEPS
    for a, b in zip(trained.parameters(), mine.parameters(), strict=True):
        assert torch.equal(a, b), (method, mode, noise, backstop, float((a - b).abs().max()))
    assert engine.get_epsilon(1e-5) == trainer.result.epsilon


def _named(x: torch.Tensor, y: torch.Tensor):
    """The records with their column names (as ``feature_names=`` names them for the engine)."""
    from featuredp.own_loop_checks import named_columns as named

    data = named(NAMES)
    data.X, data.y = x.numpy(), y.numpy()
    return data

"""One rank of the two-process replay matrix, launched by ``torchrun`` from test_replay_two_processes.py.

``python -m torch.distributed.run --nproc-per-node 2 ... tests/testing/replay_worker.py OUT_DIR`` runs the replay
for every private method × strategy × precision × noise mode in a data-parallel run, then once with a broken
engine whose every rank adds noise of std σC/W (the power check), and rank 0 writes the reports as JSON.
Not a test module itself.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _zoo
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # _fdp_synth

from _zoo import mlp

from _fdp_synth import make_tabular
from featuredp.clipping import STRATEGIES
from featuredp.engine import Trainer
from featuredp.features import Columns
from featuredp.methods import PRIVATE_METHODS
from featuredp.testing import replay_step

torch.set_num_threads(1)
warnings.simplefilter("ignore")


def run(method: str, strategy: str, precision: str, secure: bool) -> dict:
    data = make_tabular(64, seed=1)
    data.X[5] = [30.0, -2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    torch.manual_seed(0)
    extra = {} if method == "dpsgd" else {"feature_map": Columns(["sex", "race"])}
    t = Trainer(mlp(), method, steps=5, batch_size=16, noise_multiplier=1.0, max_grad_norm=0.1, delta=1e-4,
                strategy=strategy, precision=precision, secure_rng=secure, progress=False, **extra)  # fmt: skip
    # rows on both ranks' shards (0..31 and 32..63), the added record on rank 0's
    return replay_step(t, data, record=5, batch=[*range(10, 22), *range(40, 52)]).to_dict()


def main() -> None:
    out = Path(sys.argv[1])
    # "auto" is refused in data-parallel runs (each process would time the two on its own): its two are here
    reports = [run(m, s, p, sec) for m in PRIVATE_METHODS for s in STRATEGIES if s != "auto"
               for p in ("fp32", "bf16") for sec in (False, True)]  # fmt: skip
    # the broken variant: every rank adds noise of std σC/W (as if it were the main rank)
    import featuredp.distributed as fdist
    from featuredp.noise import TorchNoise

    world = torch.distributed.get_world_size()
    add = TorchNoise.add
    TorchNoise.add = lambda self, sums, std: add(self, sums, std / world)  # type: ignore[method-assign]
    fdist.DistContext.is_main = property(lambda self: True)  # type: ignore[method-assign,assignment]
    broken = run("dpsgd", "ghost", "fp32", False)
    if torch.distributed.get_rank() == 0:
        (out / "replay.json").write_text(json.dumps({"matrix": reports, "noise_per_rank": broken}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # a clean exit: gloo's threads can abort a process torn down mid-way


if __name__ == "__main__":
    main()

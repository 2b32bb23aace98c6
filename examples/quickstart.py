"""Quickstart: declare the private columns of UCI Adult, train FDP-SGD and DP-SGD at the same ε, compare.

    python examples/quickstart.py            # ~1 minute on 2 cores
"""

from __future__ import annotations

import torch

from featuredp.data import load_dataset
from featuredp.engine import Trainer, evaluate, init_seed
from featuredp.features import Columns
from featuredp.models import build_model, spec_for


def main(epochs: float = 2.0) -> None:
    """Train both models for ``epochs`` (FDP also pre-trains on the public view for as long) and print."""
    torch.set_num_threads(1)
    train, test = load_dataset("adult")                 # bundled, no download
    spec = spec_for(train, "mlp", hidden=[64])

    # Feature DP: only sex and race are private; the other columns and the income label are public.
    fdp = Trainer(build_model(spec, seed=init_seed(0)), "fdp", feature_map=Columns(private=["sex", "race"]),
                  epochs=epochs, pretrain_epochs=epochs, batch_size=512, public_batch_size=256, target_epsilon=1.0,
                  delta=1e-5, lr=0.05, strategy="ghost", progress=False)
    r_fdp = fdp.fit(train)

    # DP-SGD protects whole records (hence also sex and race) at the same epsilon.
    dp = Trainer(build_model(spec, seed=init_seed(0)), "dpsgd", epochs=epochs, batch_size=512, target_epsilon=1.0,
                 delta=1e-5, lr=0.5, strategy="ghost", progress=False)
    r_dp = dp.fit(train)

    for name, trainer, res in (("FDP-SGD", fdp, r_fdp), ("DP-SGD", dp, r_dp)):
        acc = evaluate(trainer.model, test)["accuracy"]
        print(f"{name:8s} test accuracy {acc:.4f}  epsilon {res.epsilon:.3f} (delta {res.delta:g})")
        print(f"         {res.guarantee}")


if __name__ == "__main__":
    main()

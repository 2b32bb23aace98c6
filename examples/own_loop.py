"""Your own loop: the same model trained with Opacus and with featuredp's PrivacyEngine, then with feature DP.

Between the two libraries only the import and nothing else differs (the ``make_private`` line is the same):
Opacus's tutorial loop, ghost clipping, the same σ, sampling rate 1/len(loader) and steps. The third arm adds
``feature_map=Columns(private=["sex", "race"])``: FDP (Algorithm 1) in the same loop.

    python examples/own_loop.py            # 3 seeds, 3 epochs on Adult (about a minute on 2 cores)
    python examples/own_loop.py --quick    # one short epoch

Prints a table: arm, ε at δ = 1e-5, test accuracy (mean over seeds), samples per second (median over the
interleaved runs).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIGMA, CLIP, BATCH, LR, DELTA = 1.0, 1.0, 512, 0.5, 1e-5


def train(arm: str, train_set: Any, test_set: Any, *, epochs: float, seed: int) -> dict[str, float]:
    """One run of the tutorial loop; ``arm`` is ``"opacus"``, ``"featuredp"`` or ``"featuredp+fdp"``."""
    if arm == "opacus":
        from opacus import PrivacyEngine
    else:
        from featuredp import PrivacyEngine
    from featuredp.features import Columns

    torch.manual_seed(seed)  # the model's initialisation only; the private randomness is each library's own
    x, y = torch.tensor(train_set.X), torch.tensor(train_set.y)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    data_loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    fdp = {"feature_map": Columns(private=["sex", "race"]), "dataset": train_set} if arm.endswith("fdp") else {}
    privacy_engine = PrivacyEngine()
    model, optimizer, criterion, data_loader = privacy_engine.make_private(
        module=model, optimizer=optimizer, data_loader=data_loader, criterion=nn.CrossEntropyLoss(),
        noise_multiplier=SIGMA, max_grad_norm=CLIP, grad_sample_mode="ghost", **fdp)
    seen, start = 0, time.perf_counter()
    batches = max(1, round(epochs * len(data_loader)))
    done = 0
    while done < batches:
        for xb, yb in data_loader:
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
            seen, done = seen + len(xb), done + 1
            if done == batches:
                break
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        net = model._module if hasattr(model, "_module") else model
        accuracy = (net(torch.tensor(test_set.X)).argmax(1) == torch.tensor(test_set.y)).float().mean().item()
    return {"epsilon": privacy_engine.get_epsilon(DELTA), "accuracy": accuracy, "samples_per_s": seen / elapsed,
            "steps": batches}


def main(epochs: float = 3.0, seeds: int = 3) -> list[dict[str, Any]]:
    """Run every arm ``seeds`` times, interleaved, and print the table."""
    from featuredp.data import load_dataset

    warnings.simplefilter("ignore")  # Opacus's and torch's notices; featuredp's privacy warnings are tested elsewhere
    train_set, test_set = load_dataset("adult")
    arms = ["opacus", "featuredp", "featuredp+fdp"]
    try:
        import opacus  # noqa: F401
    except ImportError:
        arms.remove("opacus")
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    for seed in range(seeds):
        for arm in arms:  # interleaved: each round runs every arm once, so drift hits them alike
            runs[arm].append(train(arm, train_set, test_set, epochs=epochs, seed=seed))
    rows = []
    print(f"Adult ({len(train_set.y)} records), MLP 64, σ = {SIGMA}, C = {CLIP}, expected batch {BATCH} (rate "
          f"1/{-(-len(train_set.y) // BATCH)}), {runs[arms[-1]][0]['steps']} steps ({epochs:g} epochs), "
          f"{seeds} seed(s)")
    print(f"{'arm':<16}{'epsilon':>9}{'accuracy':>10}{'± sd':>8}{'samples/s':>11}")
    for arm in arms:
        r = runs[arm]
        acc = [x["accuracy"] for x in r]
        row = {"arm": arm, "epsilon": r[0]["epsilon"], "accuracy": statistics.fmean(acc),
               "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0,
               "samples_per_s": statistics.median(x["samples_per_s"] for x in r)}
        rows.append(row)
        print(f"{arm:<16}{row['epsilon']:>9.3f}{row['accuracy']:>10.4f}{row['accuracy_sd']:>8.4f}"
              f"{row['samples_per_s']:>11.0f}")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short epoch, one seed")
    args = parser.parse_args()
    main(epochs=0.2, seeds=1) if args.quick else main()

"""The own loop's checkpoints: saved atomically and privately, and never rewinding the privacy spent.

:class:`EngineCheckpoints` is the part of :class:`featuredp.privacy_engine.PrivacyEngine` that writes and reads its
checkpoints: the model, the user's optimizer and the run's secret state in one owner-readable file, and the
spent-steps record kept current at every draw, so that loading this or an older checkpoint, in any process, keeps
charging every private step that ran (docs/own-loop.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from featuredp.clipping.fsdp import is_sharded
from featuredp.distributed import load_rank_checkpoint
from featuredp.dp_wrappers import DPOptimizer, unwrap
from featuredp.private_loader import Draws
from featuredp.sharded_checkpoint import load_shards, save_checkpoint_files

__all__ = ["EngineCheckpoints"]


def _optimizers(state: Any, user: torch.optim.Optimizer | None) -> dict[str, torch.optim.Optimizer]:
    """What a sharded checkpoint saves with DCP besides the weights: the run's optimizers and the user's."""
    return {**state.optimizers(), **({"user_optimizer": user} if user is not None else {})}


class EngineCheckpoints:
    """``save_checkpoint``, ``note_spent`` and ``load_checkpoint`` for an engine that holds its run and state, the
    private loader's draws and the spent-steps record it keeps current (``_spent``)."""

    _draws: Draws
    _spent: tuple[Path, str | Path | None] | None

    def _require_run(self) -> Any:
        raise NotImplementedError

    def _require_state(self) -> Any:
        raise NotImplementedError

    def save_checkpoint(self, *, path: str | Path, module: nn.Module, optimizer: Any = None,
                        checkpoint_dict: dict[str, Any] | None = None, weights: bool = True,
                        spent_record: str | Path | None = None, **_: Any) -> None:  # fmt: skip
        """Write the model, the optimizer and the run's state (streams, step counter) atomically, owner-readable
        only (0600): the file holds the run's secret sampler and noise state. ``weights=False`` leaves the model's
        weights out (a caller that saves them itself).

        The spent-steps record beside ``path`` (or ``spent_record``: one file for all of a run's checkpoints) holds
        the private steps the run has charged, and from now on is brought up to date at every draw: a later
        :meth:`load_checkpoint` of this or an older checkpoint, in any process, charges every step that ran."""
        state, run = self._require_state(), self._require_run()
        inner = optimizer.original_optimizer if isinstance(optimizer, DPOptimizer) else optimizer
        model = unwrap(module)
        # Under torchrun each rank writes its own file (its keys are its own), without waiting for the others (a
        # loop that saves on rank 0 alone must not hang); a sharded model's weights and optimizers' moments go to a
        # DCP folder the files name (featuredp.sharded_checkpoint), which every rank writes together.
        sharded = is_sharded(model)
        save_checkpoint_files(run.dist, path, {
            "featuredp_privacy_engine": 1,
            "state": state.state_dict(model if weights and not sharded else None, optimizers=not sharded),
            "optimizer": None if inner is None or sharded else inner.state_dict(),
            "extra": checkpoint_dict or {},
        }, model if sharded else None, _optimizers(state, inner), weights=weights, barrier=False)  # fmt: skip
        self._spent = (Path(path), spent_record)
        self._require_run().note_spent(path, state, record=spent_record)

    def note_spent(self, record: str | Path) -> None:
        """Keep the spent-steps record ``record`` current: written now, and brought up to date at every draw from
        now on (a crash included), so that a later :meth:`load_checkpoint` with ``spent_record=record`` charges every
        step the run has run."""
        self._spent = (Path(record), record)
        self._require_run().note_spent(record, self._require_state(), record=record)

    def load_checkpoint(self, *, path: str | Path, module: nn.Module, optimizer: Any = None,
                        spent_record: str | Path | None = None, **_: Any) -> dict[str, Any]:  # fmt: skip
        """Continue the run saved by :meth:`save_checkpoint` (same plan; the noise and the coins are re-keyed from
        OS entropy). The steps already charged are never taken back: loading a checkpoint older than what ran keeps
        charging every step that ran, in this process or recorded in the spent-steps record (beside ``path``, or
        ``spent_record``): ε, the ledger and the budget stop count them. A correlated-noise run, whose accounting is
        for its planned participations, refuses it. Returns the ``checkpoint_dict`` saved with it."""
        state, run = self._require_state(), self._require_run()
        ck = load_rank_checkpoint(run.dist, path)
        if ck is None:
            raise FileNotFoundError(f"checkpoint not found: {path}")
        if not isinstance(ck, dict) or "featuredp_privacy_engine" not in ck:
            raise ValueError(f"{path} is not a checkpoint written by PrivacyEngine.save_checkpoint")
        charged = state.private_steps
        saved = int(ck["state"].get("private_steps", 0))
        if saved < charged and state.plan.noise.correlated:
            raise ValueError(f"{path} holds step {saved} of a correlated-noise run that has charged {charged}: "
                             "its accounting covers each planned participation once, so it cannot rewind")
        if unwrap(module) is not run.model:
            raise ValueError("load_checkpoint(module=...) must be the model make_private made private")
        run.resume(path, ck["state"], state, record=spent_record)
        state.private_steps = max(charged, state.private_steps)  # ε never goes down: a rewind is charged
        inner = optimizer.original_optimizer if isinstance(optimizer, DPOptimizer) else optimizer
        if "shards" in ck:
            load_shards(path, ck["shards"], run.model, _optimizers(state, inner))
        elif inner is not None and ck.get("optimizer") is not None:
            inner.load_state_dict(ck["optimizer"])
        self._draws.current = None  # a batch drawn before the load is not this state's
        self._spent = (Path(path), spent_record)
        return dict(ck.get("extra") or {})

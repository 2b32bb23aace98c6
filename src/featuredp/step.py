"""The arithmetic of one private step, shared by the two loops that train: :class:`featuredp.engine.Trainer`'s
own loop and the loop a user owns through :class:`featuredp.privacy_engine.PrivacyEngine`.

Both hand :class:`StepCore` a batch that was already sampled (the private batch from the run's secret Poisson or
cyclic sampler, the public batch from its own independent sampler) and get back gradients: the clipped sum of the
method's per-example loss plus N(0, σ²C²) noise from the run's noise source, divided by the *expected* batch size
m; Algorithm 1's public term; the record-level backstop's noised public step. Who samples the batch and who
applies the update differs between the loops; what is released does not, because it is computed here, once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from featuredp.batches import forward
from featuredp.clipping import GradientStrategy, VmapGradients, trainable_parameters
from featuredp.clipping.base import AutocastLoss, LossFn
from featuredp.clipping.fsdp import forward_parameters, is_sharded, reduce_to_shard, sharded_parameters
from featuredp.distributed import DistContext, all_reduce_sum
from featuredp.features import Batch
from featuredp.losses import LossSplit
from featuredp.methods import Method
from featuredp.noise.sharded import flat_layout
from featuredp.plan import PrivacyPlan

__all__ = ["StepCore", "clipped_loss", "noised_coordinates", "plain_cross_entropy", "project"]


class StepCore:
    """Computes a step's gradients for one model with one gradient strategy (ghost, vmap, ...).

    ``precision="bf16"`` runs the losses under bfloat16 autocast (the strategies keep norms in float32). ``dist``:
    a data-parallel run, in which rank 0 alone adds the noise before the all-reduce. A model sharded with FSDP2
    (:mod:`featuredp.clipping.fsdp`): the strategy returns each parameter's sum over the ranks as this rank's
    shard, and each rank noises its own shards (:class:`~featuredp.noise.sharded.ShardedNoise`, one key), placed in
    one flat vector by the parameters' full shapes: the noise of one process, never drawn at the full shape.
    """

    def __init__(self, model: nn.Module, strategy: GradientStrategy, *, precision: str, device: torch.device,
                 dist: DistContext | None) -> None:  # fmt: skip
        self.model = model
        self.strategy = strategy
        self.precision = precision
        self.device = device
        self.dist = dist
        self.sharded = is_sharded(model)
        # Where each parameter sits in the step's flat noise vector: the same on every rank and in one process.
        self._layout = flat_layout(trainable_parameters(model)) if self.sharded else None
        self._nonfinite = [0, 0]  # records zeroed for a non-finite gradient, private steps with any (stderr only)

    def amp(self, loss_fn: LossFn) -> LossFn:
        """``loss_fn`` under bfloat16 autocast when ``precision="bf16"``."""
        if self.precision == "bf16":
            return AutocastLoss(loss_fn, self.device.type)
        return loss_fn

    def clipped_sum(self, loss_fn: LossFn, batch: Batch, draws: Batch, max_grad_norm: float,
                    groups: torch.Tensor | None = None, captured: Any = None) -> dict[str, torch.Tensor]:  # fmt: skip
        """Σ_{i∈B} clip_C ∇ℓ_i for the per-example loss ``loss_fn`` on ``batch`` (the strategy's checks included).
        ``groups``: each example's user (contiguous, 0 .. U − 1): Σ_u clip_C Σ_{i∈u} ∇ℓ_i, a user's records clipped
        as one contribution (the per-record strategy, :meth:`VmapGradients.clipped_sum_by_group`). ``captured``: the
        batch's forward already run under ghost's hooks (:meth:`GhostGradients.capture`, the own loop's)."""
        if groups is not None:
            if not isinstance(self.strategy, VmapGradients):
                raise ValueError(f"user-level clipping needs strategy='vmap', got {self.strategy.name!r}")
            sums, norms = self.strategy.clipped_sum_by_group(self.model, self.amp(loss_fn), batch, draws,
                                                             max_grad_norm, groups)  # fmt: skip
            self.tell_nonfinite(int((~torch.isfinite(norms)).sum()))
            return sums
        if captured is not None:
            sums, norms = self.strategy.clipped_sum(self.model, self.amp(loss_fn), batch, draws, max_grad_norm,
                                                    captured=captured)  # type: ignore[call-arg]  # fmt: skip
        else:
            sums, norms = self.strategy.clipped_sum(self.model, self.amp(loss_fn), batch, draws, max_grad_norm)
        self.tell_nonfinite(int((~torch.isfinite(norms)).sum()))
        return sums

    def noisy_mean(self, plan: PrivacyPlan, noise: Any, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """(``sums`` + N(0, σ²C²)) / m, the noise drawn once (by rank 0 in a data-parallel run)."""
        if plan.noise_multiplier is None or plan.max_grad_norm is None:
            raise ValueError(f"method {plan.method!r} has no noise multiplier in its plan")
        std = 0.0 if plan.noise_multiplier == 0 else plan.noise_multiplier * plan.max_grad_norm
        if self.sharded:  # each rank its shards, from the one key: no all-reduce of noise
            noisy = noise.add(sums, std, layout=self._layout)
        elif self.dist is None:
            noisy = noise.add(sums, std)  # new tensors: safe to scale in place
        else:
            # Noise of total std σC exactly once: rank 0 adds it to its own clipped sum before the
            # all-reduce, so every rank ends with the same noisy total (and no rank adds its own).
            noisy = all_reduce_sum(noise.add(sums, std) if self.dist.is_main else sums)
        # Divide by the EXPECTED batch size m = p·n (global); the realised batch size is private.
        return {k: v.div_(plan.expected_batch_size) for k, v in noisy.items()}

    def private_gradient(self, state: Any, split: LossSplit | None, batch: Batch, record: Method, *,
                         groups: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        """(Σ_{i∈B} clip_C ∇ℓ_x(θ; x_i) + N(0, σ²C²)) / m for the sampled private batch B (ℓ_x: the method's
        clipped loss; the loss draws from the run's private draws generator)."""
        plan = state.plan
        loss_fn: LossFn
        if split is not None:
            draws = split.draws(batch, state.private_draws)
            loss_fn = clipped_loss(split, record, plan.public_weight)
        else:
            draws, loss_fn = {}, plain_cross_entropy
        if plan.noise_multiplier is None or plan.max_grad_norm is None:
            raise ValueError(f"method {plan.method!r} has no noise multiplier in its plan")
        return self.noisy_mean(plan, state.noise, self.clipped_sum(loss_fn, batch, draws, plan.max_grad_norm,
                                                                   groups=groups))  # fmt: skip

    def record_gradient(self, state: Any, split: LossSplit, batch: Batch, expected: float, *,
                        groups: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        """The backstop's public step on a batch sampled from its secret Poisson stream: (Σ clip_C ∇ℓ_pub +
        N(0, σ_pub²C²)) / ``expected`` (the batch's expected size; the realised one is secret)."""
        plan = state.plan
        if plan.record_noise_multiplier is None or plan.max_grad_norm is None:
            raise ValueError("the record-level backstop needs σ_pub and C in the plan")
        draws = split.draws(batch, state.public_draws)
        sums = self.clipped_sum(split.public_loss, batch, draws, plan.max_grad_norm, groups=groups)
        noisy = state.noise.add(sums, plan.record_noise_multiplier * plan.max_grad_norm)
        return {k: v.div_(expected) for k, v in noisy.items()}

    def public_gradient(self, state: Any, split: LossSplit, batch: Batch, total: int
                        ) -> tuple[dict[str, torch.Tensor], float]:  # fmt: skip
        """∇ of the mean ℓ_pub over a public batch (it reads Ψ(S) only), with its own draws; and that mean."""
        losses = self.amp(split.public_loss)(self.model, batch, split.draws(batch, state.public_draws))
        return self.mean_gradient(losses, total)

    def mean_gradient(self, losses: torch.Tensor, total: int) -> tuple[dict[str, torch.Tensor], float]:
        """∇ of the mean loss over the batch, and that mean. In a data-parallel run each rank holds a share
        of the batch (``total`` records in all): the shares' sums are added up over the ranks."""
        params = trainable_parameters(self.model)
        if self.sharded:
            return self._sharded_mean_gradient(losses, total, params)
        if self.dist is None:
            loss = losses.mean()
            return dict(zip(params, torch.autograd.grad(loss, list(params.values())))), float(loss.detach())
        loss = losses.sum() / total
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
        reduced = all_reduce_sum({**grads, "\0loss": loss.detach().reshape(1)})  # one collective for both
        shown = float(reduced.pop("\0loss"))
        return reduced, shown

    def _sharded_mean_gradient(self, losses: torch.Tensor, total: int, params: dict[str, torch.Tensor]
                               ) -> tuple[dict[str, torch.Tensor], float]:  # fmt: skip
        """:meth:`mean_gradient` of a sharded model: the gradient against the unsharded parameters the forward used,
        summed over the ranks into each parameter's shard (one full-shape gradient alive at a time)."""
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        loss = losses.sum() / total if world > 1 else losses.mean()
        params = sharded_parameters(self.model, params)  # read after the forward: the root's may be unsharded
        used = forward_parameters(self.model, params)
        grads = torch.autograd.grad(loss, list(used.values()), allow_unused=True)
        out = {}
        for (name, p), g in zip(params.items(), grads):
            out[name] = reduce_to_shard(torch.zeros_like(used[name]) if g is None else g, p)
        shown = loss.detach().reshape(1).clone()
        if world > 1:
            torch.distributed.all_reduce(shown)
        return out, float(shown)

    @staticmethod
    def combine(plan: PrivacyPlan, private: dict[str, torch.Tensor],
                public: Callable[[], dict[str, torch.Tensor]] | None) -> dict[str, torch.Tensor]:  # fmt: skip
        """Algorithm 1's g = w·g_pub + α·g_priv (``public``: None when no public batch is read, w = 0)."""
        if public is None:
            # w = 0: no public batch is drawn or computed, so with α = 1 the run is fdp_dpsgd's, bit for bit.
            return {k: plan.alpha * v for k, v in private.items()}
        gp, w = public(), plan.public_weight
        return {k: (gp[k] if w == 1 else w * gp[k]) + plan.alpha * v for k, v in private.items()}

    def tell_nonfinite(self, records: int | None) -> None:
        """Tell the analyst (stderr only) about records whose gradient was not finite and contributed zero.

        The first such step is told at once, the total at the end (``records=None``). Which or how many records
        were zeroed is private: it goes nowhere else (not run.json, the history or the bar).
        """
        seen = self._nonfinite
        if records is None:
            if seen[0]:
                print(f"featuredp: {seen[0]} record(s) in {seen[1]} private step(s) had a non-finite gradient and "
                      "contributed zero (this count is private: it is shown here only)", file=sys.stderr)  # fmt: skip
                seen[0] = seen[1] = 0
            return
        if records:
            if not seen[0]:
                print(f"featuredp: {records} record(s) of a private batch had a non-finite gradient (NaN or inf in "
                      "the data or an overflow) and contributed zero; check the data for NaN/inf", file=sys.stderr)
            seen[0] += records
            seen[1] += 1


def clipped_loss(split: LossSplit, record: Method, weight: float) -> LossFn:
    """The per-example loss whose gradient is clipped: ℓ, or for Algorithm 1 ℓ − w·ℓ_pub.

    Whatever w, the strategy clips each example's whole gradient to C, so the sensitivity of the sum,
    and with it the accounting, does not depend on w; ℓ_pub here reads the private batch's own records
    and lies inside the clipped quantity.
    """
    if record.clipped_loss != "private_loss":
        return split.loss
    if weight == 1:
        return split.private_loss  # the published algorithm, with its numerics unchanged
    if weight == 0:
        return split.loss  # ℓ itself, not ℓ − 0·ℓ_pub: no public forward, and fdp_dpsgd's numerics
    return _WeightedPrivateLoss(split, weight)


class _WeightedPrivateLoss:
    """ℓ − w·ℓ_pub per example, with the same model and draws for both terms (as ``LossSplit.private_loss``)."""

    def __init__(self, split: LossSplit, weight: float) -> None:
        self.split = split
        self.weight = weight

    def __call__(self, model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
        return self.split.loss(model, batch, draws) - self.weight * self.split.public_loss(model, batch, draws)

    def __repr__(self) -> str:
        return f"ℓ − {self.weight:g}·ℓ_pub of {type(self.split).__name__}"


def noised_coordinates(model: nn.Module) -> int:
    """The coordinates the private sum has, each noised once per private step: the trainable parameters'."""
    return sum(int(p.numel()) for p in trainable_parameters(model).values())


def plain_cross_entropy(model: nn.Module, batch: Batch, draws: Batch) -> torch.Tensor:
    """Per-example cross-entropy of ``model`` on ``batch`` (no feature map: DP-SGD on whole records)."""
    return nn.functional.cross_entropy(forward(model, batch), batch["y"], reduction="none")


@torch.no_grad()
def project(params: dict[str, torch.Tensor], radius: float) -> None:
    """Project the parameters onto the ball of ``radius`` (the convex analyses' bounded domain)."""
    norm = torch.stack([p.pow(2).sum() for p in params.values()]).sum().sqrt()
    if norm > radius:
        for p in params.values():
            p.mul_(radius / norm)

"""Cloak: inference-time feature suppression with learned noise (Mireshghallah et al., WWW 2021).

**No formal guarantee.** Cloak is an empirical defence: it gives no differential-privacy (or any
other) bound, and nothing here claims one. It protects the *input a user sends to an untrusted
model server at inference time*, not the training data.

For a fixed, trained classifier f (frozen: its parameters never change), Cloak learns a mean μ
and a standard deviation σ per input feature and sends ``x + r``, ``r = μ + σ ⊙ e``,
``e ~ N(0, I)`` drawn fresh for every query, instead of ``x``. The loss (the paper's, with σ
measured in units of each feature's ``scale``, ν = σ / scale; ``scale = 1`` gives it verbatim)::

    L(μ, ρ) = −log mean_j(ν_j²) + λ · E_{x, e}[CE(f(x + μ + σ ⊙ e), y)],   ν_j = max_noise · sigmoid(ρ_j)

The first term pushes every σ up; the cross-entropy pushes σ down only where f needs the
feature. Features with large ν are *suppressed*: after training, those with ν_j >= ``threshold``
are masked (the paper's mask): their value is replaced by the constant ``center_j + μ_j`` (the
population mean shifted by μ, no noise), so the query carries nothing about them; μ is then
fine-tuned on the masked representation (σ fixed). The kept features are sent as ``x + μ + σ ⊙ e``.

* **Suppression ratio**: the fraction of input features whose relative noise ν_j = σ_j / scale_j
  is at least ``threshold`` (these are the masked ones when the mask is on).
* Randomness: the noise added to a user's input (:meth:`Cloak.cloak`) comes from OS entropy on
  every call; a ``seed`` makes it replayable (research only: it warns and is never written).
  Fitting (batch order, training noise) may use a published ``public_seed``: what it shapes, μ
  and σ, is published with the cloak anyway.

>>> c = Cloak(3, max_noise=2.0, threshold=1.0, init_noise=0.5)   # before fitting: ν = 0.5 everywhere
>>> c.suppression_ratio(), c.suppression_ratio(threshold=0.4), tuple(c.noise_std.shape)
(0.0, 1.0, (3,))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from featuredp._validate import check_int, check_nonnegative, check_positive
from featuredp.batches import forward
from featuredp.errors import DataValidationError
from featuredp.run_state import torch_generator
from featuredp.sampling import make_streams, random_seed_from, warn_private_seed

__all__ = ["GUARANTEE", "Cloak"]

#: what every report of a cloak says about its privacy (there is no bound to print)
GUARANTEE = "none (empirical suppression only)"

#: a feature's scale is floored at this fraction of the largest scale (constant columns have std 0)
_MIN_SCALE = 1e-3


def _as_tensor(name: str, values: Any, n: int | None = None) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(values, dtype=np.float32) if not isinstance(values, torch.Tensor) else values)
    t = t.detach().float()
    if n is not None and t.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite, got non-finite entries")
    return t


class Cloak(nn.Module):
    """Learned per-feature noise N(μ, σ²) added to a classifier's input at inference (no formal guarantee).

    Args:
        n_features: the number of input features d (images: flatten, e.g. 784 for 28×28).
        scale: per-feature unit of the noise (default 1: the paper's loss; :meth:`from_data` uses the
            training std, so that ν = σ / scale compares features of different ranges).
        center: per-feature population mean (default 0): a masked feature is sent as center + μ.
        max_noise: the largest relative noise ν (σ = scale · max_noise · sigmoid(ρ), bounded as in the paper).
        threshold: ν at or above which a feature counts as suppressed (and is masked by :meth:`fit`).
        init_noise: the relative noise every feature starts from.
    """

    scale: torch.Tensor
    center: torch.Tensor
    keep: torch.Tensor

    def __init__(
        self,
        n_features: int,
        *,
        scale: Any = None,
        center: Any = None,
        max_noise: float = 4.0,
        threshold: float = 2.0,
        init_noise: float = 0.5,
    ) -> None:
        super().__init__()
        d = check_int("n_features", n_features, minimum=1)
        self.max_noise = check_positive("max_noise", max_noise)
        self.threshold = check_positive("threshold", threshold)
        if self.threshold >= self.max_noise:
            raise ValueError(f"threshold must be < max_noise = {self.max_noise:g} (else nothing can be suppressed), "
                             f"got {threshold!r}")  # fmt: skip
        init = check_positive("init_noise", init_noise)
        if init >= self.max_noise:
            raise ValueError(f"init_noise must be < max_noise = {self.max_noise:g}, got {init_noise!r}")
        sc = torch.ones(d) if scale is None else _as_tensor("scale", scale, d)
        if (sc <= 0).any():
            raise ValueError("scale must be > 0 for every feature (floor constant columns, e.g. Cloak.from_data)")
        self.register_buffer("scale", sc)
        self.register_buffer("center", torch.zeros(d) if center is None else _as_tensor("center", center, d))
        self.register_buffer("keep", torch.ones(d, dtype=torch.bool))
        self.masked = False
        self.mu = nn.Parameter(torch.zeros(d))
        self.rho = nn.Parameter(torch.full((d,), math.log(init / (self.max_noise - init))))  # sigmoid⁻¹(init/max)
        self.history_: list[dict[str, float]] = []

    @classmethod
    def from_data(cls, X: Any, **kwargs: Any) -> Cloak:
        """A cloak whose ``scale`` is the per-feature std of ``X`` (n, d) and ``center`` its mean.

        Constant features get a tiny scale (``1e-3`` × the largest), so any noise on them counts as
        suppression (they carry no information anyway).
        """
        arr = np.asarray(X.detach().cpu() if isinstance(X, torch.Tensor) else X, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[0] < 2:
            raise DataValidationError(f"X must have shape (n >= 2, d), got {arr.shape}")
        std = arr.std(axis=0)
        floor = _MIN_SCALE * max(float(std.max()), 1e-12)
        return cls(arr.shape[1], scale=np.maximum(std, floor), center=arr.mean(axis=0), **kwargs)

    # -- the learned distribution -------------------------------------------------------------------------

    @property
    def n_features(self) -> int:
        """d."""
        return int(self.mu.shape[0])

    @property
    def relative_noise(self) -> torch.Tensor:
        """ν = σ / scale per feature, in (0, max_noise) (differentiable)."""
        return self.max_noise * torch.sigmoid(self.rho)

    @property
    def noise_std(self) -> torch.Tensor:
        """σ per feature, in the features' own units (differentiable)."""
        return self.relative_noise * self.scale

    def suppressed(self, threshold: float | None = None) -> torch.Tensor:
        """Boolean (d,): relative noise ν >= ``threshold`` (default: the cloak's)."""
        t = self.threshold if threshold is None else check_positive("threshold", threshold)
        return (self.relative_noise >= t).detach()

    def suppression_ratio(self, threshold: float | None = None) -> float:
        """The fraction of input features whose relative noise ν = σ / scale is >= ``threshold``."""
        return float(self.suppressed(threshold).float().mean())

    def privacy_loss(self) -> torch.Tensor:
        """The paper's privacy term −log mean(ν²) (lower = more noise)."""
        return -torch.log(self.relative_noise.pow(2).mean())

    # -- the representation -------------------------------------------------------------------------------

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise DataValidationError(f"x must have shape (n, {self.n_features}), got {tuple(x.shape)}")
        return x

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The cloaked representation (differentiable in μ, ρ); ``generator`` draws the noise e.

        Without a generator the noise comes from OS entropy (as in :meth:`cloak`).
        """
        x = self._check_input(x)
        if generator is None:
            generator = torch_generator(random_seed_from(make_streams(None).noise), x.device)
        e = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        noisy = x + self.mu + self.noise_std * e
        if not self.masked:
            return noisy
        keep = self.keep.to(x.dtype)
        return keep * noisy + (1 - keep) * (self.center + self.mu)

    def noise_generator(self, seed: int | None = None) -> torch.Generator:
        """A generator for the noise of queries: OS entropy, or the user's (secret) ``seed``, which warns."""
        if seed is not None:
            warn_private_seed("seed", seed, stacklevel=4)
        return torch_generator(random_seed_from(make_streams(seed).noise), self.mu.device)

    @torch.no_grad()
    def cloak(self, x: Any, *, seed: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """What a user sends: ``x`` (n, d) cloaked with fresh noise (OS entropy) on every call.

        ``seed`` (research only) makes the noise replayable, which undoes the cloak for anyone who
        learns it: it warns (``PrivacyRiskWarning``) and is never written out. ``generator`` draws the
        noise instead (e.g. one :meth:`noise_generator` for many calls, so that no two calls share noise).
        """
        if seed is not None and generator is not None:
            raise ValueError(f"give seed or generator, not both (seed={seed!r})")
        t = torch.as_tensor(np.asarray(x, dtype=np.float32)) if not isinstance(x, torch.Tensor) else x.float()
        t = t.to(self.mu.device)
        return self.forward(t, generator=generator if generator is not None else self.noise_generator(seed))

    # -- fitting ------------------------------------------------------------------------------------------

    def fit(
        self,
        model: nn.Module,
        X: Any,
        y: Any,
        *,
        lam: float = 1.0,
        epochs: float = 5.0,
        batch_size: int = 256,
        lr: float = 0.05,
        mask: bool = True,
        mask_epochs: float = 1.0,
        public_seed: int | None = None,
    ) -> Cloak:
        """Learn μ and σ for the frozen classifier ``model`` on (``X``, ``y``); then mask (see the module doc).

        ``lam`` is λ (larger: less noise, less accuracy loss). ``model`` is put in eval mode and its
        parameters are never updated (their ``requires_grad`` flags and the training mode are
        restored afterwards). ``public_seed`` seeds the batch order and the training noise (None: OS
        entropy). The per-epoch means of both loss terms go to ``history_``.
        """
        lam = check_nonnegative("lam", lam)
        epochs = check_positive("epochs", epochs)
        mask_epochs = check_nonnegative("mask_epochs", mask_epochs)
        batch_size = check_int("batch_size", batch_size, minimum=1)
        lr = check_positive("lr", lr)
        dev = self.mu.device
        Xt = torch.as_tensor(np.asarray(X, dtype=np.float32)) if not isinstance(X, torch.Tensor) else X.float()
        yt = torch.as_tensor(np.asarray(y)).long() if not isinstance(y, torch.Tensor) else y.long()
        Xt, yt = self._check_input(Xt.to(dev)), yt.to(dev)
        if yt.shape != (Xt.shape[0],) or Xt.shape[0] == 0:
            raise DataValidationError(f"y must have shape ({Xt.shape[0]},) with at least one row, "
                                      f"got {tuple(yt.shape)}")  # fmt: skip
        g = torch_generator(random_seed_from(make_streams(None, public_seed=public_seed).public_draws), dev)
        flags = [p.requires_grad for p in model.parameters()]
        was_training = model.training
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.masked = False
        self.keep.fill_(True)
        self.history_ = []
        try:
            self._train(model, Xt, yt, lam, epochs, batch_size, lr, g, params=[self.mu, self.rho], phase="noise")
            if mask:
                self.keep.copy_(~self.suppressed())
                self.masked = True
                if mask_epochs > 0:  # μ adapts to the masked representation; σ stays as learned
                    self._train(model, Xt, yt, 1.0, mask_epochs, batch_size, lr, g, params=[self.mu], phase="mask")
        finally:
            for p, flag in zip(model.parameters(), flags):
                p.requires_grad_(flag)
            model.train(was_training)
        return self

    def _train(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        lam: float,
        epochs: float,
        batch_size: int,
        lr: float,
        g: torch.Generator,
        *,
        params: Sequence[nn.Parameter],
        phase: str,
    ) -> None:
        n = X.shape[0]
        bs = min(batch_size, n)
        steps = max(1, round(epochs * n / bs))
        per_epoch = max(1, n // bs)
        opt = torch.optim.Adam(list(params), lr=lr)
        perm = torch.randperm(n, generator=g, device=X.device)
        pos, sums = 0, [0.0, 0.0, 0]
        for step in range(steps):
            if pos + bs > n:
                perm, pos = torch.randperm(n, generator=g, device=X.device), 0
            idx = perm[pos : pos + bs]
            pos += bs
            ce = nn.functional.cross_entropy(forward(model, {"x": self(X[idx], generator=g)}), y[idx])
            priv = self.privacy_loss()
            # The mask phase trains μ on the cross-entropy alone: σ is fixed, so the privacy term is a constant.
            loss = lam * ce + (priv if phase == "noise" else 0.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sums[0] += float(ce.detach())
            sums[1] += float(priv.detach())
            sums[2] += 1
            if (step + 1) % per_epoch == 0 or step + 1 == steps:
                self.history_.append({"phase_noise": float(phase == "noise"), "step": float(step + 1),
                                      "cross_entropy": sums[0] / sums[2], "privacy_loss": sums[1] / sums[2],
                                      "suppression_ratio": self.suppression_ratio()})  # fmt: skip
                sums = [0.0, 0.0, 0]

    # -- evaluation and description -----------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, X: Any, y: Any, *, seed: int | None = None, queries: int = 1
    ) -> dict[str, float]:
        """Clean and cloaked accuracy of ``model`` on (``X``, ``y``), accuracy loss and suppression ratio.

        ``accuracy_loss`` = clean accuracy − cloaked accuracy (fresh noise; ``queries`` > 1 averages the
        cloaked accuracy over that many independent cloakings).
        """
        queries = check_int("queries", queries, minimum=1)
        Xt = torch.as_tensor(np.asarray(X, dtype=np.float32)) if not isinstance(X, torch.Tensor) else X.float()
        yt = torch.as_tensor(np.asarray(y)).long() if not isinstance(y, torch.Tensor) else y.long()
        Xt, yt = Xt.to(self.mu.device), yt.to(self.mu.device)
        was = model.training
        model.eval()
        try:
            clean = float((forward(model, {"x": Xt}).argmax(-1) == yt).float().mean())
            g = self.noise_generator(seed)  # one stream for all queries: never the same noise twice
            accs = [float((forward(model, {"x": self(Xt, generator=g)}).argmax(-1) == yt).float().mean())
                    for _ in range(queries)]  # fmt: skip
        finally:
            model.train(was)
        cloaked = float(np.mean(accs))
        return {"clean_accuracy": clean, "cloaked_accuracy": cloaked, "accuracy_loss": clean - cloaked,
                "suppression_ratio": self.suppression_ratio()}  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters (what is published with the cloak) and its (absent) guarantee."""
        return {
            "n_features": self.n_features,
            "max_noise": self.max_noise,
            "threshold": self.threshold,
            "masked": self.masked,
            "suppression_ratio": self.suppression_ratio(),
            "mu": self.mu.detach().cpu().tolist(),
            "noise_std": self.noise_std.detach().cpu().tolist(),
            "relative_noise": self.relative_noise.detach().cpu().tolist(),
            "keep": self.keep.cpu().tolist(),
            "guarantee": GUARANTEE,
        }

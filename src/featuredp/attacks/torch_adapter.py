"""Turn a torch classifier and data into the score arrays the numpy attack core consumes.

This is the only module of :mod:`featuredp.attacks` that imports torch (with
:mod:`featuredp.attacks.tabular`, which drives the engine). Everything returns numpy.

* :func:`logits`, :func:`per_example_loss`, :func:`logit_scaled_confidence` — per-example
  outputs for membership inference (LiRA uses φ = log p_y − log Σ_{k≠y} p_k, computed from
  logits so that it stays exact when p_y rounds to 1).
* :func:`candidate_scores` — for attribute inference: the loss and top-class confidence of
  each target with every candidate value of the private one-hot block(s) plugged in.
* :func:`model_inversion` — Fredrikson et al. 2015 (MI-FACE, their Algorithm 1):
  gradient descent on the input to maximise the confidence of a target class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from featuredp._validate import check_int, check_nonnegative, check_positive
from featuredp.batches import forward


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return forward(model, {"x": x})


@torch.no_grad()
def logits(model: nn.Module, X: np.ndarray, *, batch_size: int = 8192) -> np.ndarray:
    """(n, K) logits of ``model`` on float features ``X`` (eval mode; the mode is restored)."""
    X = np.asarray(X, dtype=np.float32)
    if X.ndim != 2:
        raise ValueError(f"X must have shape (n, d), got {X.shape}")
    was = model.training
    model.eval()
    try:
        out = [_forward(model, torch.from_numpy(X[s : s + batch_size])) for s in range(0, X.shape[0], batch_size)]
    finally:
        model.train(was)
    return torch.cat(out).double().numpy() if out else np.zeros((0, 0))


def _check_labels(y: object, n: int, k: int) -> np.ndarray:
    y = np.asarray(y).astype(np.int64).ravel()
    if y.size != n:
        raise ValueError(f"y must have {n} entries (one per row of X), got {y.size}")
    if y.size and (y.min() < 0 or y.max() >= k):
        raise ValueError(f"y must be in [0, {k}), got range [{y.min()}, {y.max()}]")
    return y


def losses_from_logits(z: np.ndarray, y: object) -> np.ndarray:
    """Per-example cross-entropy from (n, K) logits."""
    # −log p_y = log(1 + Σ_{k≠y} e^{z_k − z_y}) = softplus(−φ): exact even when the loss is ~1e-13
    return np.logaddexp(0.0, -logit_scaled_confidence(z, y))


def per_example_loss(model: nn.Module, X: np.ndarray, y: object) -> np.ndarray:
    """(n,) cross-entropy of each record."""
    return losses_from_logits(logits(model, X), y)


def logit_scaled_confidence(z: np.ndarray, y: object) -> np.ndarray:
    """φ = z_y − log Σ_{k≠y} e^{z_k} = log(p_y / (1 − p_y)), exactly, from (n, K) logits."""
    yy = _check_labels(y, z.shape[0], z.shape[1])
    idx = np.arange(z.shape[0])
    zy = z[idx, yy]
    others = z.copy()
    others[idx, yy] = -np.inf
    m = others.max(axis=1)
    lse_others = m + np.log(np.exp(others - m[:, None]).sum(axis=1))
    return zy - lse_others


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of logits."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def candidate_scores(
    model: nn.Module,
    X: np.ndarray,
    y: object,
    candidates: Sequence[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """Loss and top-class confidence of every target under every candidate private value.

    ``candidates`` lists (columns, values) pairs: candidate c sets ``X[:, columns] = values``
    (e.g. the one-hot block of ``sex`` to (1, 0)); all other columns stay as they are.
    Returns ``(losses, confidences)``, each of shape (n, len(candidates)).
    """
    X = np.asarray(X, dtype=np.float32)
    n = X.shape[0]
    if len(candidates) < 2:
        raise ValueError(f"candidates must list >= 2 values, got {len(candidates)}")
    losses = np.empty((n, len(candidates)))
    conf = np.empty((n, len(candidates)))
    for c, (cols, vals) in enumerate(candidates):
        Xc = X.copy()
        Xc[:, np.asarray(cols)] = np.asarray(vals, dtype=np.float32)
        z = logits(model, Xc)
        losses[:, c] = losses_from_logits(z, y)
        conf[:, c] = softmax(z).max(axis=1)
    return losses, conf


def model_inversion(
    model: nn.Module,
    target_class: int,
    d: int,
    *,
    steps: int = 500,
    lr: float = 0.1,
    patience: int = 50,
    tol: float = 1e-3,
    aux: Callable[[torch.Tensor], torch.Tensor] | None = None,
    process: Callable[[torch.Tensor], torch.Tensor] | None = None,
    x0: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """Fredrikson et al.'s MI-FACE: minimise c(x) = 1 − f_label(x) + AUX(x) by gradient descent.

    Starts at ``x0`` (default zeros), applies ``process`` after each step (e.g. clip to the
    feature box), stops after ``steps``, when c has not improved on the last ``patience``
    values (β in MI-FACE), or when c <= ``tol`` (γ). Returns the best x and its cost.
    """
    k = check_int("target_class", target_class, minimum=0)
    d = check_int("d", d, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    lr = check_positive("lr", lr)
    patience = check_int("patience", patience, minimum=1)
    tol = check_nonnegative("tol", tol)
    was = model.training
    model.eval()
    x = torch.zeros(1, d) if x0 is None else torch.as_tensor(np.asarray(x0, dtype=np.float32).reshape(1, d))
    x = x.clone().requires_grad_(True)
    history: list[float] = []
    best_x, best_c = x.detach().clone(), float("inf")
    try:
        for _ in range(steps):
            out = _forward(model, x)
            if not 0 <= k < out.shape[1]:
                raise ValueError(f"target_class must be in [0, {out.shape[1]}), got {target_class!r}")
            cost = 1.0 - torch.softmax(out, dim=1)[0, k]
            if aux is not None:
                cost = cost + aux(x[0])
            c = float(cost.detach())
            if c < best_c:
                best_c, best_x = c, x.detach().clone()
            if c <= tol or (len(history) >= patience and c >= max(history[-patience:])):
                break
            history.append(c)
            (g,) = torch.autograd.grad(cost, x)
            with torch.no_grad():
                x -= lr * g
                if process is not None:
                    x.copy_(process(x))
    finally:
        model.train(was)
    return best_x[0].numpy(), best_c

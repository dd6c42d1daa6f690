"""Muon, the optimizer of notebook 10's recipe, for the blocks' weight matrices; AdamW for the rest.

Muon (Jordan et al. 2024) keeps a momentum ``M`` of each matrix's gradient ``G`` and steps along
the orthogonalised Nesterov look-ahead ``G' = (1 - mu) G + mu M``: ``O ~ U V^T`` for ``G' = U S
V^T``, by five Newton-Schulz iterations ``X <- a X + (b A + c A^2) X``, ``A = X X^T``, from ``G' /
||G'||_F``. The step of ``W (m, n)`` is ``W <- W (1 - lr wd) - scale lr 0.2 sqrt(max(m, n)) O``: the
factor (Liu et al. 2025) gives it the root-mean-square size of an AdamW step.

At ``scale`` 1 this is ``torch.optim.Muon(adjust_lr_fn="match_rms_adamw")`` (tests/lessons check
its steps against it), except that the iterations run in float32 (torch's run in bfloat16, far
slower on a CPU without bfloat16 units) and the matrices of one shape are orthogonalised together.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["NS_COEFFICIENTS", "Muon", "MuonWithAdamW", "adamw", "orthogonalize"]

#: Jordan's quintic: a steep slope at zero, so that five iterations bring every singular value that
#: is not tiny to between about 0.7 and 1.2.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(update: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """``(..., m, n) -> (..., m, n)``: each matrix's singular values brought to about 0.7-1.2
    (those above about 1/600 of its Frobenius norm; its singular vectors kept) by ``steps``
    Newton-Schulz iterations, in float32."""
    if update.dim() < 2:
        raise ValueError(f"update must be a matrix or a batch of matrices, got shape "
                         f"{tuple(update.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = update.float()
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT                                        # (..., r, s) with r <= s: A is r x r
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)   # every singular value <= 1
    for _ in range(steps):
        gram = x @ x.mT                                 # A = X X^T
        x = a * x + (b * gram + c * gram @ gram) @ x    # X <- a X + (b A + c A^2) X
    return (x.mT if tall else x).to(update.dtype)


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters: Nesterov momentum (``torch.optim.Muon``'s form), orthogonalised,
    scaled to an AdamW-sized step, with decoupled weight decay."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, ns_steps: int = 5, scale: float = 1.0):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "ns_steps": ns_steps, "scale": scale})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon steps matrices only, got a parameter of shape "
                                     f"{tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            by_shape: dict[torch.Size, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - mu)                         # running mean of gradients
                by_shape.setdefault(p.shape, []).append((p, p.grad.lerp(buf, mu)))  # Nesterov
            for (m, n), items in by_shape.items():
                ortho = orthogonalize(torch.stack([u for _, u in items]), group["ns_steps"])
                step_size = lr * 0.2 * math.sqrt(max(m, n)) * group["scale"]
                for (p, _), o in zip(items, ortho, strict=True):
                    p.mul_(1 - lr * group["weight_decay"])
                    p.add_(o, alpha=-step_size)
        return loss


def adamw(params, *, lr: float, betas: tuple, weight_decay: float) -> torch.optim.AdamW:
    """Fused AdamW over ``params`` with weight decay on the matrices only (not on biases and
    LayerNorm gains)."""
    params = list(params)
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2],
                               "weight_decay": weight_decay},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=lr, betas=betas, fused=True)


class MuonWithAdamW:
    """One optimizer for a GPT: :class:`Muon` for the blocks' weight matrices, fused AdamW for the
    rest (weight decay on matrices only). ``param_groups`` lists both optimizers' groups, so a
    learning-rate schedule that sets ``group["lr"]`` sets both (Muon scales its own)."""

    def __init__(self, model: nn.Module, *, lr: float, betas: tuple, weight_decay: float,
                 muon_scale: float = 1.0):
        hidden, rest = [], []
        for name, p in model.named_parameters():
            (hidden if p.dim() == 2 and name.startswith("blocks.") else rest).append(p)
        self.muon = Muon(hidden, lr=lr, weight_decay=weight_decay, scale=muon_scale)
        self.adamw = adamw(rest, lr=lr, betas=betas, weight_decay=weight_decay)

    @property
    def param_groups(self) -> list:
        return self.muon.param_groups + self.adamw.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        loss = None if closure is None else closure()
        self.muon.step()
        self.adamw.step()
        return loss

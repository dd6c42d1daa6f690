"""Notebook 07's models of one seed trained side by side, as one model of stacked weights.

Every model of :func:`.positional_encoding.train_all` with the same seed draws the same batches
(its batch stream is seeded with the seed alone), so the seven models of a seed (five schemes,
RoPE's two other bases) can take each step together: their weights are stacked on a leading
model axis, one forward pass computes every model's loss, and the gradient of their sum reaches
each model's weights only from its own loss. Where one scheme adds something the others do not
(a position table, a rotation, a bias), the others add exact zeros or rotate by angle 0
(``cos = 1, sin = 0``), which leave a float unchanged. Each model is clipped on its own gradient
norm and Adam, elementwise, updates every model as its own optimizer would. The same arithmetic
as :func:`.positional_encoding.train_scheme`, one pass per step instead of seven (the re-training
test took 120 s instead of 204 s on a loaded 2-core machine); only the order of floating-point sums
inside a matrix product could differ, as it does between CPUs (here the weights are equal to the
last bit; ``tests/lessons/test_positional_encoding.py`` checks the two agree).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..attention import masked_softmax
from ..masks import causal_mask
from ..positional import alibi_bias, frequencies, sinusoidal_encoding
from ..training import single_thread
from .positional_encoding import (
    BATCH,
    LR,
    STEPS,
    TRAIN_MAX_LEN,
    TRAIN_MIN_LEN,
    PositionTaskModel,
    offset_copy_batch,
)

__all__ = ["stacked_logits", "train_together"]


def _constants(models: list[PositionTaskModel], n: int) -> dict[str, torch.Tensor]:
    """What the models add that does not train, for ``n`` tokens: ``"table"`` ``(M, n, d)`` (the
    sinusoidal encoding for the sinusoidal model, zeros for the others; the learned model's rows
    are added by :func:`stacked_logits`), ``"cos"``, ``"sin"`` ``(M, 1, 1, n, d_head / 2)``
    (RoPE's angles as :func:`attn_helpers.positional.apply_rope` computes them, angle 0 for the
    others) and ``"bias"`` ``(M, 1, h, n, n)`` (ALiBi's for the ALiBi model, zeros for others)."""
    first = models[0]
    d, h = first.d_model, first.num_heads
    positions = torch.arange(n, dtype=torch.float64)[:, None]
    angles = torch.stack([positions * frequencies(d // h, m.base) if m.scheme == "rope"
                          else torch.zeros(n, d // h // 2, dtype=torch.float64) for m in models])
    return {"table": torch.stack([sinusoidal_encoding(n, d) if m.scheme == "sinusoidal"
                                  else torch.zeros(n, d) for m in models]),
            "cos": torch.cos(angles).float()[:, None, None],
            "sin": torch.sin(angles).float()[:, None, None],
            "bias": torch.stack([alibi_bias(n, h) if m.scheme == "alibi" else torch.zeros(h, n, n)
                                 for m in models])[:, None]}


def stacked_logits(models: list[PositionTaskModel], weights: dict[str, torch.Tensor],
                   tokens: torch.Tensor, constants: dict | None = None) -> torch.Tensor:
    """``(M, b, n, K, V)``: :meth:`PositionTaskModel.forward` of every model on ``tokens``, from
    ``weights`` (``"embed"`` ``(M, V, d)``, ``"qkv"`` ``(M, 3d, d)``, ``"head"`` ``(M, K V, d)``,
    ``"positions"`` the learned model's table) and ``constants`` (:func:`_constants`)."""
    (b, n), M = tokens.shape, len(models)
    first = models[0]
    d, h = first.d_model, first.num_heads
    c = _constants(models, n) if constants is None else constants
    x = weights["embed"][:, tokens] + c["table"][:, None]                      # (M, b, n, d)
    for i, model in enumerate(models):
        if model.scheme == "learned":         # x + P[:n]: one more sum, as the model does it
            x = torch.cat([x[:i], (x[i] + weights["positions"][:n])[None], x[i + 1:]])
    q, k, v = torch.bmm(x.reshape(M, b * n, d), weights["qkv"].transpose(1, 2)).view(
        M, b, n, 3, h, d // h).permute(3, 0, 1, 4, 2, 5)                      # (M, b, h, n, d_h)

    def rotate(t):                      # apply_rope's arithmetic; angle 0 leaves t as it is
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack([even * c["cos"] - odd * c["sin"], even * c["sin"] + odd * c["cos"]],
                           dim=-1).flatten(-2)

    scores = rotate(q) @ rotate(k).transpose(-2, -1) / math.sqrt(d // h)     # (M, b, h, n, n)
    weights_ = masked_softmax(scores + c["bias"], causal_mask(n))
    mixed = (weights_ @ v).transpose(2, 3).reshape(M, b * n, d)
    out = torch.bmm(x.reshape(M, b * n, d) + mixed, weights["head"].transpose(1, 2))
    return out.view(M, b, n, len(first.offsets), first.vocab)


def train_together(models: list[PositionTaskModel], *, seed: int, steps: int = STEPS) -> None:
    """Train ``models`` (freshly built, every one seeded with ``seed``) in place, on one thread,
    as :func:`.positional_encoding.train_scheme` trains each alone: Adam at ``LR``, gradient norm
    clipped to 1 per model, batches of ``BATCH`` sequences of ``TRAIN_MIN_LEN..TRAIN_MAX_LEN``
    tokens drawn from a generator seeded with ``seed``."""
    learned = [m for m in models if m.scheme == "learned"]
    weights = {"embed": torch.stack([m.embed.weight.detach() for m in models]),
               "qkv": torch.stack([m.qkv.weight.detach() for m in models]),
               "head": torch.stack([m.head.weight.detach() for m in models]),
               **({"positions": learned[0].positions.weight.detach()} if learned else {})}
    weights = {name: w.clone().requires_grad_(True) for name, w in weights.items()}
    owner = models.index(learned[0]) if learned else None
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(weights.values(), lr=LR)
    constants = {}
    with single_thread():
        for step in range(1, steps + 1):
            n = int(torch.randint(TRAIN_MIN_LEN, TRAIN_MAX_LEN + 1, (), generator=generator))
            tokens, targets = offset_copy_batch(BATCH, n, generator)
            if n not in constants:
                constants[n] = _constants(models, n)
            logits = stacked_logits(models, weights, tokens, constants[n])
            losses = F.cross_entropy(logits.flatten(0, -2), targets.flatten().repeat(len(models)),
                                     ignore_index=-1, reduction="none").view(len(models), -1)
            losses = losses.sum(1) / (targets >= 0).sum()                       # (M,): each mean
            if not torch.isfinite(losses).all():
                raise FloatingPointError(f"a loss became non-finite at step {step}: {losses}")
            optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            with torch.no_grad():                # clip_grad_norm_(model.parameters(), 1), per model
                norms = torch.stack([weights[k].grad.flatten(1).norm(dim=1)
                                     for k in ("embed", "qkv", "head")], 1)     # (M, 3)
                total = norms.norm(dim=1)
                if owner is not None:
                    total[owner] = torch.stack([norms[owner].norm(),
                                                weights["positions"].grad.norm()]).norm()
                scale = (1.0 / (total + 1e-6)).clamp(max=1.0)
                for k in ("embed", "qkv", "head"):
                    weights[k].grad.mul_(scale.view(-1, *[1] * (weights[k].dim() - 1)))
                if owner is not None:
                    weights["positions"].grad.mul_(scale[owner])
            optimizer.step()
    with torch.no_grad():
        for i, model in enumerate(models):
            model.embed.weight.copy_(weights["embed"][i])
            model.qkv.weight.copy_(weights["qkv"][i])
            model.head.weight.copy_(weights["head"][i])
        for model in learned:
            model.positions.weight.copy_(weights["positions"])
    for model in models:
        model.eval()

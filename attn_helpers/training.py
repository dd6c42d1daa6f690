"""A small, seeded training loop with a progress bar, and the checkpoints studies write
(``studies/``) and notebooks load with :func:`load_checkpoint`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

__all__ = ["single_thread", "torch_threads", "TrainResult", "train", "CHECKPOINT_DIR",
           "checkpoint_path", "save_checkpoint", "load_checkpoint", "token_accuracy"]

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"


@contextmanager
def single_thread() -> Iterator[None]:
    """Run the block on one torch thread: the summation order, hence the trained weights, then
    do not depend on ``OMP_NUM_THREADS``, and a busy core never stalls the run."""
    with torch_threads(1):
        yield


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch threads, then restore the previous count."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass
class TrainResult:
    """The loss of every step and the ``(step, evaluate(model))`` pairs logged."""

    losses: list[float] = field(default_factory=list)
    evaluations: list[tuple[int, dict]] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        """Mean loss over the last 10% of the steps (less noisy than the last step)."""
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)


def train(model: nn.Module, make_batch: Callable[[int, torch.Generator], tuple],
          loss_fn: Callable[..., torch.Tensor], *, steps: int, lr: float = 3e-3, seed: int = 0,
          clip_grad: float | None = 1.0, evaluate: Callable[[nn.Module], dict] | None = None,
          eval_every: int = 0, progress: bool = True, description: str = "training",
          single_threaded: bool = False) -> TrainResult:
    """Adam for ``steps`` steps, deterministic for a ``seed``: ``make_batch(step, generator)``
    draws from ``generator``, ``loss_fn(model, *batch)`` is a scalar, ``evaluate(model) -> dict``
    runs every ``eval_every`` steps and at the end (eval mode, no gradients)."""
    if single_threaded:
        with single_thread():
            return train(model, make_batch, loss_fn, steps=steps, lr=lr, seed=seed,
                         clip_grad=clip_grad, evaluate=evaluate, eval_every=eval_every,
                         progress=progress, description=description)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    result = TrainResult()
    bar = tqdm(range(1, steps + 1), desc=description, disable=not progress, leave=False)
    for step in bar:
        model.train()
        loss = loss_fn(model, *make_batch(step, generator))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_grad is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        optimizer.step()
        result.losses.append(loss.item())
        if step % max(1, steps // 50) == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
        if evaluate is not None and ((eval_every and step % eval_every == 0) or step == steps):
            model.eval()
            with torch.no_grad():
                result.evaluations.append((step, evaluate(model)))
    model.eval()
    return result


def checkpoint_path(name: str) -> Path:
    """Where the checkpoint ``name`` lives: ``attn_helpers/checkpoints/<name>.pt``."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"name must be letters, digits, '-' or '_', got {name!r}")
    return CHECKPOINT_DIR / f"{name}.pt"


def save_checkpoint(model: nn.Module, name_or_path: str | Path, metadata: dict | None = None) -> Path:
    """Save ``model``'s weights in float32 and JSON-like ``metadata`` (loadable with
    ``weights_only=True``)."""
    path = Path(name_or_path) if isinstance(name_or_path, Path) else checkpoint_path(name_or_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32) if v.is_floating_point() else v.detach()
             for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "metadata": dict(metadata or {})}, path)
    return path


def load_checkpoint(model: nn.Module, name_or_path: str | Path) -> dict:
    """Load weights saved by :func:`save_checkpoint` into ``model`` (strictly); return metadata."""
    path = Path(name_or_path) if isinstance(name_or_path, Path) else checkpoint_path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; a study in studies/ writes it "
                                "(python3 course.py studies --check lists them)")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return payload["metadata"]


def token_accuracy(predictions: torch.Tensor, targets: torch.Tensor,
                   mask: torch.Tensor | None = None) -> float:
    """Share of positions (where the bool ``mask`` is True) with ``predictions == targets``."""
    if predictions.shape != targets.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)} and targets "
                         f"{tuple(targets.shape)} must have the same shape")
    correct = predictions == targets
    if mask is not None:
        if mask.shape != targets.shape or mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool with shape {tuple(targets.shape)}, got "
                             f"{mask.dtype} {tuple(mask.shape)}")
        total = int(mask.sum())
        return float("nan") if total == 0 else int((correct & mask).sum()) / total
    return correct.float().mean().item() if correct.numel() else math.nan

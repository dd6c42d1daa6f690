"""The cases of notebook 04's module exercise (see :func:`.multi_head.check_multi_head_module`):
inputs with every mask shape, PyTorch's ``nn.MultiheadAttention`` with random weights built
without moving the global seed, the copy of its fused weights into the learner's module, and the
guard that asks for all heads in one attention call, not a loop over heads."""

from __future__ import annotations

import torch
import torch.utils._python_dispatch
from torch import nn

from ..masks import causal_mask
from .core import Refused, seeded

__all__: list[str] = []
#: Private helpers the checking runs while the learner's code does (see borrowing._checker_helper).
CALLED_WHILE_CHECKING = ("_torch_module", "_copy_weights", "_weights")


def _module_cases() -> list[dict]:
    """``x``, a bool ``mask`` (True = may attend; ``(n, n)``, ``(b, n, n)`` or None), the number
    of heads and the seed of the ``nn.MultiheadAttention`` whose weights are copied in. Every
    query keeps at least its own key (PyTorch gives NaN for a row with none)."""
    g = seeded(41)
    cases = []
    for b, n, d_model, h, mask, dtype in [
            (2, 5, 12, 3, None, torch.float32), (1, 6, 16, 4, "causal", torch.float32),
            (2, 4, 8, 1, None, torch.float32), (3, 1, 12, 3, None, torch.float32),
            (2, 7, 16, 2, "random", torch.float64), (2, 6, 8, 2, "causal", torch.float32),
            (3, 5, 12, 3, "batch", torch.float32), (2, 6, 16, 4, "batch", torch.float32)]:
        if mask == "causal":
            mask = causal_mask(n)
        elif mask == "random":
            mask = (torch.rand(n, n, generator=g) < 0.5) | torch.eye(n, dtype=torch.bool)
        elif mask == "batch":                        # (b, n, n): causal, sequences padded
            lengths = torch.randint(1, n + 1, (b,), generator=g)
            real = torch.arange(n)[None, :] < lengths[:, None]
            mask = (causal_mask(n) & real[:, None, :]) | torch.eye(n, dtype=torch.bool)
        cases.append({"x": torch.randn(b, n, d_model, generator=g, dtype=dtype), "mask": mask,
                      "num_heads": h, "seed": len(cases)})
    return cases


def _torch_module(d_model: int, num_heads: int, seed: int, dtype) -> nn.MultiheadAttention:
    """PyTorch's module with random weights and non-zero biases, built without moving the global
    seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = nn.MultiheadAttention(d_model, num_heads, batch_first=True).to(dtype).eval()
        with torch.no_grad():
            m.in_proj_bias.normal_(0, 0.3)
            m.out_proj.bias.normal_(0, 0.3)
    return m


def _weights(m: nn.MultiheadAttention) -> dict:
    """``{name: (weight (d_out, d_in), bias)}``: the fused ``in_proj`` (rows: W_Q, W_K, W_V
    stacked) and ``out_proj``, as ``nn.Linear`` stores them."""
    return {"in_proj": (m.in_proj_weight.detach(), m.in_proj_bias.detach()),
            "out_proj": (m.out_proj.weight.detach(), m.out_proj.bias.detach())}


def _copy_weights(module: nn.Module, m: nn.MultiheadAttention) -> None:
    """Copy ``m``'s weights into the learner's ``in_proj`` and ``out_proj``."""
    d = m.embed_dim
    for name, (weight, bias) in _weights(m).items():
        layer = getattr(module, name, None)
        if (not isinstance(layer, nn.Linear) or tuple(layer.weight.shape) != tuple(weight.shape)
                or layer.bias is None):
            d_out = "3 * d_model" if name == "in_proj" else "d_model"
            raise TypeError(f"the module needs its own {name} = nn.Linear(d_model, {d_out}) with a "
                            f"bias (d_model = {d}); got {layer!r}")
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)


class _AllHeadsAtOnce(torch.utils._python_dispatch.TorchDispatchMode):
    """A ``guard`` for the module exercise: all heads attend in one call, not head by head.

    It records the most attention scores one softmax (``_softmax``, ``_log_softmax``,
    ``_safe_softmax``, or an ``exp`` of a hand-written one) or one fused attention kernel covered.
    A loop over heads never covers more than ``b * n * n`` at once; all heads at once cover
    ``b * h * n * n``. With two or more heads, an answer whose largest covers fewer than
    ``h * n * n`` is refused (lenient: a loop over the batch, with every head at once, passes; so
    does an answer that none of these ops sees)."""

    SOFTMAX = frozenset({"_softmax", "_log_softmax", "_safe_softmax", "exp", "exp_"})

    def __init__(self, inputs: dict):
        super().__init__()
        self.b, self.n = inputs["x"].shape[:2]
        self.h = inputs["num_heads"]
        self.largest = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "overloadpacket", func).__name__
        size = None
        if name in self.SOFTMAX and isinstance(args[0], torch.Tensor):
            size = args[0].numel()
        elif "scaled_dot_product" in name and len(args) > 1 and isinstance(args[1], torch.Tensor):
            q, k = args[0], args[1]                   # scores: q's rows times the keys
            size = q.numel() // max(q.shape[-1], 1) * k.shape[-2]
        if size is not None:
            self.largest = size if self.largest is None else max(self.largest, size)
        return func(*args, **(kwargs or {}))

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        b, h, n = self.b, self.h, self.n
        if exc_type is None and h > 1 and self.largest is not None and self.largest < h * n * n:
            raise Refused(
                f"it attended head by head: its softmax covered at most {self.largest} scores at "
                f"once, one head's worth, not the {b * h * n * n} of all {h} heads (b * h * n * n). "
                "This exercise asks for all heads in one attention call, without a loop over "
                "heads: turn each of Q, K, V into one (b, h, n, d_head) tensor (section 1's loop "
                "says what each head computes).")
        return False

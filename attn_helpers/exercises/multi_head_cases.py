"""The cases and guards of notebook 04's exercises. The module exercise (see
:func:`.multi_head.check_multi_head_module`): inputs with every mask shape, PyTorch's
``nn.MultiheadAttention`` with random weights built without moving the global seed, the copy of
its fused weights into the learner's module, and the guard that asks for all heads in one
attention call, not a loop over heads. Grouped-query attention (see
:func:`.multi_head.check_grouped_query_attention`): prefill and decoding cases, and the guard that
refuses keys or values copied to every query head."""

from __future__ import annotations

import contextlib

import torch
import torch.utils._python_dispatch
from torch import nn

from ..masks import causal_mask
from .core import Refused, refusing_ops, seeded

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


# --- grouped-query attention -------------------------------------------------------------------


def _gqa_cases() -> list[dict]:
    """``q (b, h, n_q, d_head)``, ``k`` and ``v (b, g, n_k, d_head)``: first prefill cases
    (``n_q = n_k``; ``g = h`` and ``g = 1`` among them), then decoding cases, a few new queries
    against a longer cache (``n_q < d_head``, ``n_q < n_k``, ``h/g >= 3``), on which
    :class:`_NoCopiedKV` watches for copies of K and V."""
    g = seeded(42)
    rb, rg, group, rn, rd = (int(i) for i in torch.randint(1, 5, (5,), generator=g))  # random shape
    shapes = [(b, h, kv, n, n, d, dtype) for b, h, kv, n, d, dtype in [
        (2, 4, 2, 5, 3, torch.float32), (1, 6, 3, 4, 2, torch.float32),
        (2, 8, 2, 4, 4, torch.float32), (2, 4, 1, 3, 4, torch.float32),
        (1, 3, 3, 4, 2, torch.float32), (2, 8, 2, 1, 4, torch.float32),
        (1, 6, 2, 5, 8, torch.float64), (rb, rg * group, rg, rn, rd, torch.float32)]]
    shapes += [(2, 8, 2, 1, 32, 8, torch.float32), (1, 6, 2, 2, 16, 4, torch.float32),  # decoding
               (2, 4, 1, 1, 24, 4, torch.float32), (1, 12, 3, 3, 20, 8, torch.float64)]
    return [{"q": torch.randn(b, h, n_q, d, generator=g, dtype=dtype),
             "k": torch.randn(b, kv, n_k, d, generator=g, dtype=dtype),
             "v": torch.randn(b, kv, n_k, d, generator=g, dtype=dtype)}
            for b, h, kv, n_q, n_k, d, dtype in shapes]


_NO_FUSED_GQA = refusing_ops(
    ["scaled_dot_product_attention", "_scaled_dot_product_*"],
    "grouped_query_attention reached PyTorch's fused attention, which groups the heads for you "
    "(enable_gqa). Group the heads yourself, without copying K or V, then call the course's "
    "attention from notebook 02, ah.scaled_dot_product_attention")

_PRODUCTS = frozenset({"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "mm"})
_ALLOWED = ("Views, which copy nothing, are fine (unsqueeze, expand, view, k[:, j]); copies are "
            "refused (repeat_interleave, repeat, expand followed by reshape or contiguous, cat or "
            "stack, indexing with a head repeated)")


class _NoCopiedKV:
    """The ``guard`` of the grouped-query exercise. PyTorch's fused attention is refused by any
    route, and so is any tensor whose storage holds ``b * h * n_k * d_head`` numbers or more, as
    many as K (or V) copied to every query head, on the cases where nothing an answer needs comes
    near that size (``h >= 3 g``, ``n_q < d_head`` and ``n_q < n_k``: the queries, the scores
    ``(b, h, n_q, n_k)`` and the output are smaller, and so are K and V side by side).

    Storage, not shape: a view (``expand``, ``unsqueeze``) shares the storage it looks at and is
    never refused. The allocations are watched below PyTorch's Python API (a dispatch mode), so a
    copy inside a library call counts too: ``@`` on a size-1 head axis that broadcasts against
    the h/g heads of a group copies it (``matmul`` expands and reshapes its batch axes before
    ``bmm``); a function mode names the call that made it."""

    class _Calls(torch.overrides.TorchFunctionMode):
        name = None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.name = getattr(func, "__name__", str(func))
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.name = None

    class _Allocations(torch.utils._python_dispatch.TorchDispatchMode):
        def __init__(self, watch: _NoCopiedKV):
            super().__init__()
            self.watch = watch

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    self.watch.refuse_if_copied(t)
            return out

    def __init__(self, inputs: dict):
        (b, h, n_q, d), (g, n_k) = inputs["q"].shape, inputs["k"].shape[1:3]
        self.b, self.h, self.g, self.n_k, self.d = b, h, g, n_k, d
        self.limit = b * h * n_k * d
        self.active = h >= 3 * g and n_q < min(n_k, d)
        self.calls, self.stack = self._Calls(), contextlib.ExitStack()

    def refuse_if_copied(self, t: torch.Tensor) -> None:
        try:
            held = t.untyped_storage().nbytes() // t.element_size()
        except (RuntimeError, NotImplementedError):   # no storage to read (a meta or sparse tensor)
            return
        if held < self.limit:
            return
        b, h, g, n_k, d = self.b, self.h, self.g, self.n_k, self.d
        name = self.calls.name or "an operation"
        what = ("matmul (an @, yours or the one inside ah.scaled_dot_product_attention)"
                if name in _PRODUCTS else {"__getitem__": "indexing ([...])"}.get(name, name))
        copied = (f"{what} built a tensor of shape {tuple(t.shape)}, {held:,} numbers: as many as "
                  f"K (or V) copied to all h = {h} query heads (b * h * n_k * d_head = "
                  f"{b} * {h} * {n_k} * {d}).")
        if name in _PRODUCTS:
            raise Refused(
                f"{copied} A head axis of size 1 that broadcasts through a matrix product is "
                "copied: PyTorch's matmul expands the batch axes and reshapes them into one "
                f"before it multiplies, so K or V was copied h/g = {h // g} times: no batch axis may "
                "broadcast here. Grouped-query attention exists so "
                f"that a decoding step reads g = {g} heads of keys and values, not h = {h}.")
        raise Refused(
            f"{copied} That copy is what grouped-query attention exists to avoid: a decoding step "
            f"would read h = {h} heads of keys and values, not g = {g}. {_ALLOWED}. Let each "
            "key/value head serve its group without copying it.")

    def __enter__(self):
        self.stack.enter_context(_NO_FUSED_GQA({}))
        if self.active:
            self.stack.enter_context(self.calls)
            self.stack.enter_context(self._Allocations(self))
        return self

    def __exit__(self, exc_type, exc, tb):
        return self.stack.__exit__(exc_type, exc, tb)

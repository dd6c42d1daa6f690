"""What the learner's ``causal_backward`` (notebook 08, exercise 2, in :mod:`.complexity_backward`)
may not do while it runs: autograd (by any route) and PyTorch's attention; a tensor as large as the
``(..., n, n)`` scores, or larger than one tile of ``B`` queries by ``B`` keys needs
(:class:`_TileWatch`); and work on the tiles wholly above the diagonal, seen two ways. The scores
of such a tile, where the operands are still slices of ``q`` and ``k``, are refused at once
(:meth:`_TileWatch._scores_of`). A copy (``q * scale``, ``k.clone()``) hides that lineage, so the
multiply-adds of every product are counted too (:class:`_WorkCount`): on a case where
:func:`counted`, an answer whose count reaches two thirds of the way from what the tiles on and
below the diagonal need to what all the tiles need is refused, once its gradients are right
(:class:`BackwardWatch`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils._python_dispatch

from .core import Refused, describe, refusing_ops

__all__ = ["INSTEAD", "BackwardWatch", "counted", "tile_work"]

_POINT = ("The point of tiling is never to hold the n x n matrix: FlashAttention keeps one "
          "B x B tile of scores at a time.")
INSTEAD = ("Recompute each tile's P from the saved lse and write its gradients yourself, one "
           "B x B tile at a time")


_PRODUCTS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
             torch.bmm, torch.Tensor.bmm, torch.einsum, torch.mm, torch.Tensor.mm)


class _TileWatch(torch.overrides.TorchFunctionMode):
    """Watches every torch operation the learner's function runs (when ``B < n``): a result as
    large as the ``(..., n, n)`` scores is refused, and so is one larger than what one tile of
    ``B`` queries by ``B`` keys (or the inputs and outputs) needs, e.g. section 5's strip of all
    the queries against one key tile."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, B: int):
        super().__init__()
        self.q, self.k, self.n, self.B = q, k, q.shape[-2], B
        rows, d = q[..., 0].numel(), max(q.shape[-1], v.shape[-1], 1)   # batch * n; widest input
        self.full = rows * self.n
        self.tile = rows // self.n * max((self.n + B) * d, B * B * d)  # an input, padded to tiles

    def _rows(self, t, source: torch.Tensor) -> tuple[int, int] | None:
        """The positions ``(first, last)`` that ``t`` holds if it is a slice of ``source`` along
        the tokens (a view, transposed or not), else None."""
        if not isinstance(t, torch.Tensor) or t._base is not source or source.dim() < 2:
            return None
        step = source.stride(-2)
        axes = [a for a in range(t.dim()) if t.stride(a) == step and t.shape[a] > 0]
        if not axes or source.stride(-1) == step:
            return None
        first = t.storage_offset() % (self.n * step) // step
        return first, first + t.shape[axes[-1]] - 1

    def _scores_of(self, func, args) -> None:
        """Refuses the scores of a tile wholly above the diagonal (every key after every query)."""
        if func not in _PRODUCTS:
            return
        tensors = [a for a in (args[1:] if func is torch.einsum else args)
                   for a in (a if isinstance(a, list | tuple) else (a,))]
        queries = next((r for t in tensors if (r := self._rows(t, self.q))), None)
        keys = next((r for t in tensors if (r := self._rows(t, self.k))), None)
        if queries and keys and keys[0] > queries[1]:
            raise Refused(f"causal_backward computed the scores of queries {queries[0]}..{queries[1]} "
                          f"against keys {keys[0]}..{keys[1]}, a tile wholly above the diagonal: "
                          "every key comes after every query, so the tile contributes nothing. "
                          "Skip it: that is half of the causal backward's saving.")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.B < self.n:
            self._scores_of(func, args)
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if not isinstance(t, torch.Tensor) or self.B >= self.n:
                continue
            if t.numel() >= self.full:
                raise Refused(f"causal_backward built a tensor of shape {tuple(t.shape)}, as large "
                              f"as the (..., n, n) scores (n = {self.n}). {_POINT}")
            if t.numel() > self.tile:
                raise Refused(f"causal_backward built a tensor of shape {tuple(t.shape)}, larger "
                              f"than one tile of B queries by B keys needs (B = {self.B}, n = "
                              f"{self.n}): tile the queries too, not only the keys.")
        return out


# --- the work done: multiply-adds of every product, however it is reached -----------------------


_aten = torch.ops.aten
_FACTORS_FIRST = frozenset({_aten.mm, _aten.bmm, _aten.mv, _aten.dot, _aten.vdot})
_FACTORS_AFTER_INPUT = frozenset({_aten.addmm, _aten.addmm_, _aten.baddbmm, _aten.baddbmm_,
                                  _aten.addbmm, _aten.addbmm_, _aten.addmv, _aten.addmv_,
                                  _aten._addmm_activation})


class _WorkCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the multiply-adds of the products the learner's function runs, below the Python
    names (``@``, ``matmul``, ``einsum``, ``F.linear``, ``tensordot``, ``torch.ops.aten.mm`` all
    end in ``mm``/``bmm``/``mv``/``dot``), and of a broadcast multiplication larger than each
    factor (the outer products of ``(Q[..., :, None, :] * K[..., None, :, :]).sum(-1)``)."""

    def __init__(self):
        super().__init__()
        self.macs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = getattr(func, "overloadpacket", None)
        factors = (args[:2] if packet in _FACTORS_FIRST else
                   args[1:3] if packet in _FACTORS_AFTER_INPUT else ())
        if len(factors) == 2 and all(isinstance(f, torch.Tensor) for f in factors):
            a, b = factors                                        # (..., m, k) by (..., k, n)
            self.macs += a.numel() * (b.shape[-1] if b.dim() >= 2 else 1)
        elif packet is _aten.mul and isinstance(out, torch.Tensor) and out.numel() > max(
                (a.numel() for a in args if isinstance(a, torch.Tensor)), default=0):
            self.macs += out.numel()
        return out


def tile_work(n: int, B: int, d_k: int, d_v: int, batch: int = 1, *, causal: bool = True) -> int:
    """The multiply-adds of FlashAttention-2's backward over the tiles that a causal backward
    needs (those with a key at or before a query: on and below the diagonal), or over every tile
    (``causal=False``). Five products a tile of ``b_q`` queries by ``b_k`` keys: ``S`` and ``dQ``
    and ``dK`` (``b_q b_k d_k`` each), ``dP`` and ``dV`` (``b_q b_k d_v`` each)."""
    tiles = [(s, min(B, n - s)) for s in range(0, n, B)]
    pairs = sum(b_i * b_j for i, b_i in tiles for j, b_j in tiles if not causal or j <= i + b_i - 1)
    return batch * pairs * (3 * d_k + 2 * d_v)


def counted(n: int, B: int) -> bool:
    """Whether a case's work is compared: at least 4 tiles a side, where those above the diagonal
    are at least 3/8 of all; ``n`` a multiple of ``B`` (a last tile padded to ``B`` costs almost
    what the tiles above the diagonal do); ``B >= 2`` (with ``B = 1`` a tile's products are a few
    multiply-adds, no more than work per row, such as ``D`` recomputed in every tile)."""
    return B >= 2 and n % B == 0 and n // B >= 4


class BackwardWatch:
    """One check's guard (:meth:`guard`, entered around each of its ``total`` cases): the refusals
    above, and the work counted on the cases where :func:`counted`. :attr:`excess` holds the
    refusal of the first case whose work reached two thirds of the way from the causal tiles' to
    all the tiles' (on the counted case, right answers written other ways stay more than a tile
    below it, and without the skip more than two tiles above: tested). The checker reports it
    only once the gradients are right: a wrong answer that computed every tile meets the known
    mistake's message first, and that one says to skip them too."""

    def __init__(self, total: int):
        self.total, self.case, self.excess = total, 0, None
        self.no_autograd = refusing_ops(
            ["scaled_dot_product_attention", "_scaled_dot_product_*", "_efficient_attention*",
             "_flash_attention*", "_softmax_backward_data"],
            "causal_backward used autograd or PyTorch's attention (torch.ops.aten, a grad_fn, "
            f"backward, torch.autograd.grad, torch.func), which does this exercise for you. {INSTEAD}",
            autograd=True)

    @contextlib.contextmanager
    def guard(self, inputs: dict) -> Iterator[None]:
        self.case += 1
        q, v, B = inputs["q"], inputs["v"], inputs["B"]
        n, d_k, d_v, batch = q.shape[-2], q.shape[-1], v.shape[-1], q[..., 0, 0].numel()
        count = _WorkCount()
        with self.no_autograd(inputs), _TileWatch(q, inputs["k"], v, B), count:
            yield
        if self.excess is None and B < n and counted(n, B):
            tile, needed = tile_work(B, B, d_k, d_v, batch), tile_work(n, B, d_k, d_v, batch)
            every = tile_work(n, B, d_k, d_v, batch, causal=False)
            if 3 * count.macs >= needed + 2 * every:        # two thirds of the way
                self.excess = (
                    f"Not yet: on case {self.case} of {self.total} ({describe(inputs)}), "
                    "causal_backward's gradients are right, but its matrix products did the work "
                    f"of {count.macs / tile:.3g} tiles of B queries by B keys (n = {n}, B = {B}), "
                    "where the tiles on and below the diagonal, all that a causal backward needs, "
                    f"are {needed // tile} of the {every // tile}: it computed the tiles wholly "
                    "above the diagonal too. Every key of such a tile comes after every query, so "
                    "the tile contributes nothing: skip it, don't mask it. That is half of the "
                    "causal backward's saving.")

"""Low-level guards for :func:`.core.check_function`: refuse a set of aten ops (and, if asked,
autograd itself) however a learner's function reaches them, below the names that
:func:`.core.blocking` swaps."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.utils._python_dispatch

from .core import Refused

__all__ = ["refusing_ops"]


class _Refusing:
    """What a refusing mode holds: the ops (or names) it refuses and the reason it gives."""

    def __init__(self, packets: frozenset, why: str):
        super().__init__()
        self.packets = packets
        self.why = why


class _RefuseOps(_Refusing, torch.utils._python_dispatch.TorchDispatchMode):
    """Refuses the given aten ops below autograd, however they are reached: ``torch.ops.aten.*``,
    a ``grad_fn`` called by hand, ``backward``/``autograd.grad``, forward-mode (``_make_dual``,
    which ``torch.func.jvp`` uses)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = getattr(func, "overloadpacket", func)
        if packet in self.packets:
            raise Refused(f"{self.why} (it reached torch.ops.aten.{packet.__name__}).")
        return func(*args, **(kwargs or {}))


class _RefuseOpCalls(_Refusing, torch.overrides.TorchFunctionMode):
    """Refuses a call of ``torch.ops.aten.<op>`` (or one of its overloads) by name: a composite op
    such as ``_scaled_dot_product_attention_math`` is decomposed before :class:`_RefuseOps` sees
    it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        packet = getattr(func, "overloadpacket", func)
        if isinstance(packet, torch._ops.OpOverloadPacket) and packet in self.packets:
            raise Refused(f"{self.why} (it called torch.ops.aten.{packet.__name__}).")
        return func(*args, **(kwargs or {}))


class _NoGraph(torch.overrides.TorchFunctionMode):
    """Refuses every tensor that requires grad made while the learner's function runs. Autograd
    only differentiates through such tensors, so this closes the routes the named refusals miss:
    a ``grad_fn`` called by hand (``(q @ k.mT).grad_fn(g)``), ``torch.autograd.graph``, the
    engine's ``Variable._execution_engine.run_backward``, an ``nn.Parameter``. The inputs are
    handed to the learner detached (:func:`_detached`), so none of them requires grad."""

    def __init__(self, why: str):
        super().__init__()
        self.why = why

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise Refused(f"{self.why} (it made a tensor that requires grad, which autograd "
                              "differentiates through).")
        return out


def _detached(inputs: dict) -> None:
    """Replaces, in place, each input tensor (or tensor in a tuple or list) that requires grad by
    its detached view: the learner's function gets the same values and storage, without a graph
    to differentiate through, and :class:`_NoGraph` refuses none of them or their results."""
    def detach(v):
        if isinstance(v, torch.Tensor):
            return v.detach() if v.requires_grad else v
        if isinstance(v, tuple | list):
            return type(v)(detach(x) for x in v)
        return v
    for name, value in inputs.items():
        inputs[name] = detach(value)


class _RefuseFunctions(torch.overrides.TorchFunctionMode):
    def __init__(self, names: frozenset, why: str):
        super().__init__()
        self.names = names
        self.why = why

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.names:
            raise Refused(f"{self.why} (it called {name}).")
        return func(*args, **(kwargs or {}))


def refusing_ops(ops: Iterable[str], why: str, *, autograd: bool = False
                 ) -> Callable[[dict], contextlib.AbstractContextManager]:
    """A ``guard`` for :func:`check_function` that refuses a set of aten ops (names such as
    ``"_softmax_backward_data"``, ``"scaled_dot_product_attention"``; a name ending in ``*``
    matches every op with that prefix) whatever route reaches them, with the message ``why``.
    ``autograd=True`` also refuses autograd itself: ``backward``, ``torch.autograd.grad``,
    ``torch.func``, forward mode (``torch.func.jvp``, dual numbers), and every route through a
    graph (a ``grad_fn`` called by hand, the engine's ``run_backward``): any tensor that requires
    grad made while the guarded code runs (:class:`_NoGraph`; input tensors that require grad are
    handed over detached, in ``inputs`` itself, so a right answer is never refused for them)."""
    wanted = list(ops) + (["_make_dual", "_unpack_dual"] if autograd else [])
    packets = set()
    for name in wanted:
        if name.endswith("*"):  # every registered aten op (dir() lists only those loaded so far)
            registered = {n.split("::", 1)[1].split(".", 1)[0]
                          for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
            packets |= {getattr(torch.ops.aten, n) for n in registered if n.startswith(name[:-1])}
        elif hasattr(torch.ops.aten, name):
            packets.add(getattr(torch.ops.aten, name))
    packets = frozenset(packets)

    @contextlib.contextmanager
    def guard(inputs: dict) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if autograd:
                _detached(inputs)
                stack.enter_context(_RefuseFunctions(frozenset({"backward", "grad"}), why))
                stack.enter_context(_no_autograd_engine(why))
            stack.enter_context(_RefuseOpCalls(packets, why))
            stack.enter_context(_RefuseOps(packets, why))
            if autograd:
                stack.enter_context(_NoGraph(why))
            yield

    return guard


@contextlib.contextmanager
def _no_autograd_engine(why: str) -> Iterator[None]:
    """``torch.autograd.grad``/``backward`` and ``torch.func``'s transforms refused by name while
    the block runs (:class:`_NoGraph` catches a ``grad_fn`` called by hand, the engine)."""
    import torch.func  # noqa: PLC0415, F401

    def refuse(label):
        def refused(*args, **kwargs):
            raise Refused(f"{why} (it called {label}).")
        return refused

    import torch.autograd.forward_ad  # noqa: PLC0415

    targets = [(torch.autograd, "grad"), (torch.autograd, "backward"), (torch.Tensor, "backward"),
               (torch.autograd.forward_ad, "make_dual"),
               *((torch.func, n) for n in ("grad", "vjp", "jvp", "jacrev", "jacfwd", "hessian",
                                           "linearize", "grad_and_value")),
               *((torch.autograd.functional, n) for n in ("jacobian", "vjp", "jvp", "vhp", "hvp",
                                                          "hessian"))]
    saved = []
    try:
        for owner, name in targets:
            if hasattr(owner, name):
                saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, refuse(f"{getattr(owner, '__name__', 'Tensor')}.{name}"))
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)

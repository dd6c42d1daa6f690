"""Fuzz the whole public API with junk (issue 17): a clear error or a correct-looking result.

Every public callable (``attn_helpers.__all__`` and the ``__all__`` of each core module, found by
introspection, plus the public methods of the public classes) gets one valid call from ``TABLE``;
then each of its arguments (from ``inspect.signature``, defaults included) is replaced by junk:
None, a string, 0, a negative int, a huge int (10**9), an empty tensor, a scalar tensor, an
integer tensor, 1-D and 5-D tensors, NaN and inf tensors, a ragged nested list. Every such call
must (no time is asserted: a hang alarm only, see ``HANG_S``)

* raise ``ValueError`` or ``TypeError`` whose message names the argument, or
* return a result with no NaN/inf when every input tensor was finite; a string or a ragged list
  is never a valid argument, and neither is None unless the default or the annotation says so,
  so accepting one silently is a defect too.

``test_sweep`` tries every (argument, kind of junk) once with a canonical value; ``test_fuzz`` lets
hypothesis draw varied junk (shapes, values, which argument) per callable: ``max_examples`` 50
when ``CI=true`` (profile "ci"), 10 otherwise (profile "dev"). Calls run under a memory cap
(``RLIMIT_AS``), so a size that is not refused up front fails with the allocator's error instead
of taking the machine's memory, and under an alarm, so a hang fails instead of blocking the run.
Known defects in modules outside this file's owner (``KNOWN_DEFECTS``) are ``xfail`` with the
module named; a defect not listed there still fails.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import random
import re
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import matplotlib as mpl
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import attn_helpers

settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=10, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = "ci" if os.environ.get("CI", "").lower() in ("true", "1") else "dev"

CORE = ["attention", "masks", "entropy", "positional", "multihead", "efficient", "kv_cache", "ring"]
# The alarm that turns a hang into a failure. Not a speed limit (no unit test asserts a time,
# issue 20): every call here answers in well under a second, 30 s is a hang on any machine.
HANG_S = 30.0
MEMORY_CAP = 3 * 2**30  # bytes of address space a call may add (the course's own bound is 4 GiB
# of tensors; every call here is small or refused before it allocates)


def public_objects() -> dict[str, Any]:
    """Every name in ``attn_helpers.__all__`` and the core modules' ``__all__`` -> its object."""
    modules = [attn_helpers] + [importlib.import_module(f"attn_helpers.{m}") for m in CORE]
    found: dict[str, Any] = {}
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if name in found and found[name] is not obj:
                raise AssertionError(f"two public objects are called {name}")
            found[name] = obj
    return found


PUBLIC = public_objects()


def public_methods(cls: type) -> list[str]:
    """Methods a class defines itself (not nn.Module's hooks), public by name."""
    names = []
    for name, member in vars(cls).items():
        if name.startswith("_") or name in {"extra_repr"} or isinstance(member, property):
            continue
        if callable(member) or isinstance(member, (classmethod, staticmethod)):
            names.append(name)
    return names


def targets() -> list[str]:
    """Every public callable: ``name`` for functions and classes, ``Class.method`` for methods.
    NamedTuple/dataclass records (no validation to fuzz) keep only their constructor."""
    out = []
    for name, obj in sorted(PUBLIC.items()):
        if not callable(obj):
            continue
        out.append(name)
        if inspect.isclass(obj) and not issubclass(obj, tuple):
            out += [f"{name}.{m}" for m in public_methods(obj)]
    return out


# --- one valid call per public callable --------------------------------------------------------

g = torch.Generator().manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


@dataclass
class Case:
    """One valid call: ``target(*args, **kwargs)``; for a method, ``make()`` builds the object
    (a fresh one per call)."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    make: Callable[[], Any] | None = None
    finite_result: bool = True  # False: the valid result itself holds -inf (documented per case)
    skip: str | None = None
    text: tuple[str, ...] = ()  # parameters that take free text, so a string is not junk there


def call(*args, **kwargs) -> Case:
    return Case(args, kwargs)


def method(make, *args, **kwargs) -> Case:
    return Case(args, kwargs, make=make)


Q, K, V = randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 6)  # (b, n_q, d_k), (b, n_k, d_k), (b, n_k, d_v)
QS, KS, VS = randn(2, 6, 4), randn(2, 6, 4), randn(2, 6, 6)  # self-attention: n_q = n_k = 6
MASK = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)  # (3, 5)
SCORES = randn(2, 3, 5)
WEIGHTS = torch.softmax(SCORES, -1)  # (2, 3, 5)
LENGTHS = [2, 4, 0]


def mha():
    return PUBLIC["MultiHeadAttention"](8, 4, num_kv_heads=2, kdim=6, vdim=5)


def filled_cache():
    cache = PUBLIC["KVCache"](8)
    cache.append(randn(2, 3, 4), randn(2, 3, 6))
    return cache


TOKENS = torch.tensor([[1, 5, 2, 9, 3], [4, 4, 0, 10, 7]])  # (b, n) ids below vocab_size 11


def lm():
    return PUBLIC["TinyCausalLM"](11, 8, 2, 1, 16, max_len=12)


def state(n_k: int = 5):
    return PUBLIC["block_state"](randn(2, 3, n_k), randn(2, n_k, 6))


RECORD = ("a NamedTuple record: it stores what it is given, and the functions that take one "
          "(fuzzed here) check it")

TABLE: dict[str, Case] = {
    # attention
    "dot_product_scores": call(Q, K),
    "scaled_dot_product_scores": call(Q, K, scale=0.5),
    "additive_scores": call(Q, randn(2, 5, 6), randn(7, 4), randn(7, 6), randn(7)),
    "AdditiveScore": call(4, 6, 7),
    "AdditiveScore.forward": method(lambda: PUBLIC["AdditiveScore"](4, 6, 7), Q, randn(2, 5, 6)),
    "masked_softmax": call(SCORES, MASK),
    "scaled_dot_product_attention": call(Q, K, V, MASK, scale=0.5),
    # masks
    "causal_mask": call(5, device="cpu"),
    "padding_mask": call(LENGTHS, 5),
    "sliding_window_mask": call(6, 2, False, device="cpu"),
    "key_padding_to_attention_mask": call(torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)),
    # entropy
    "attention_entropy": call(WEIGHTS),
    "max_entropy": call(5),
    "normalized_entropy": call(torch.softmax(SCORES.masked_fill(~MASK, -math.inf), -1).nan_to_num(),
                               MASK),
    "effective_keys": call(WEIGHTS),
    "max_weight": call(WEIGHTS),
    # positional
    "frequencies": call(8, 100.0, dtype=torch.float64),
    "sinusoidal_encoding": call(6, 8, base=100.0, dtype=torch.float32),
    "pair_rotation": call(2.0, 8, 1, base=100.0),
    "LearnedPositionalEmbedding": call(10, 8, init_std=0.02),
    "LearnedPositionalEmbedding.encoding": method(
        lambda: PUBLIC["LearnedPositionalEmbedding"](10, 8), 4),
    "LearnedPositionalEmbedding.forward": method(
        lambda: PUBLIC["LearnedPositionalEmbedding"](10, 8), randn(2, 6, 8)),
    "apply_rope": call(randn(2, 6, 8), torch.arange(6), base=100.0),
    "alibi_slopes": call(6),
    "alibi_bias": call(5, 6, dtype=torch.float32),
    # multihead
    "MultiHeadAttention": call(8, 4, num_kv_heads=2, bias=True, kdim=6, vdim=5),
    "MultiHeadAttention.forward": method(mha, randn(2, 3, 8), randn(2, 5, 6), randn(2, 5, 5), MASK,
                                         head_mask=torch.ones(4)),
    "MultiHeadAttention.from_torch": method(
        lambda: PUBLIC["MultiHeadAttention"], nn.MultiheadAttention(8, 2, batch_first=True)),
    "split_heads": call(randn(2, 3, 8), 4),
    "merge_heads": call(randn(2, 4, 3, 2)),
    "parameter_count": call(8, 4, num_kv_heads=2, bias=True, kdim=6, vdim=5),
    "to_torch_attn_mask": call(MASK),
    "to_torch_key_padding_mask": call(torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)),
    # efficient
    "OnlineSoftmaxState": Case(skip=RECORD),
    "init_state": Case(((2,), 3, 6), {"dtype": torch.float32, "device": "cpu"},
                       finite_result=False),  # the running max of no key yet is -inf
    "block_state": call(SCORES, randn(2, 5, 6)),
    "online_softmax_step": call(state(4), SCORES, randn(2, 5, 6)),
    "merge_states": call(state(4), state(5)),
    # P = exp(S - lse) trusts lse to come from the forward at the same scale: a junk scale (10**9)
    # with this lse overflows, as it should; finite junk tensors are still judged by the sweep.
    "backward_tile": Case((Q, K, V, randn(2, 3, 6), randn(2, 3, 1), randn(2, 3, 1)),
                          {"scale": 0.5, "mask": MASK}, finite_result=False),
    "finalize": call(state()),
    "tiled_attention": call(Q, K, V, block_size=2, causal=False, return_lse=False,
                            query_block_size=2, scale=0.5),
    "elu_feature_map": call(Q),
    "linear_attention": call(QS, KS, VS, causal=True, chunk_size=2),
    "LinearAttentionState": Case(skip=RECORD),
    "linear_attention_step": call(None, randn(2, 4), randn(2, 4), randn(2, 6)),
    "decoding_memory": call(100, d_k=8, d_v=8, num_heads=2, num_layers=2, bytes_per_value=2),
    "local_attention": call(QS, KS, VS, 2, True, block_size=3, scale=0.5),
    # kv_cache
    "KVCache": call(8),
    "KVCache.reset": method(filled_cache),
    "KVCache.append": method(filled_cache, randn(2, 1, 4), randn(2, 1, 6)),
    "KVCache.attend": method(filled_cache, randn(2, 1, 4), scale=0.5),
    "decode_with_cache": call(QS, KS, VS, scale=0.5),
    "kv_cache_bytes": call(100, num_layers=2, num_kv_heads=2, head_dim=8, bytes_per_value=2),
    "generate_with_cache": call(randn(5, 8), randn(8, 4), randn(8, 4), randn(8, 6)),
    "generate_without_cache": call(randn(5, 8), randn(8, 4), randn(8, 4), randn(8, 6)),
    # ring
    "ring_schedule": call(4),
    "split_blocks": call(10, 3),
    "simulate_ring": call(QS, KS, VS, 2, causal=True),
    "ring_attention": Case(skip="starts world_size processes (seconds per call); its arguments are "
                                "checked by the same code as simulate_ring's, fuzzed above"),
    # transformer, decoder_lm
    "FeedForward": call(8, 16, activation="gelu", bias=True),
    "FeedForward.forward": method(lambda: PUBLIC["FeedForward"](8, 16), randn(2, 3, 8)),
    "DecoderLayer": call(8, 2, 16, norm_first=True, activation="gelu", num_kv_heads=1, memory_dim=6,
                         cross_attention=True, layer_norm_eps=1e-5, bias=True),
    "DecoderLayer.forward": method(lambda: PUBLIC["DecoderLayer"](8, 2, 16, memory_dim=6),
                                   randn(2, 3, 8), randn(2, 5, 6), causal=True,
                                   memory_padding=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]],
                                                               dtype=torch.bool),
                                   need_weights=True),
    "DecoderLayer.from_torch": method(
        lambda: PUBLIC["DecoderLayer"],
        nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)),
    "TinyCausalLM": call(11, 8, 2, 2, 16, num_kv_heads=1, max_len=12, activation="gelu"),
    "TinyCausalLM.forward": method(lm, TOKENS, need_weights=True),
    "TinyCausalLM.new_caches": method(lm),
    "TinyCausalLM.generate": method(lm, TOKENS[:, :3], 3, use_cache=True),
    # the package
    "setup": call(seed=0),
    "check_claims": Case(({"a claim that holds": True},), {"recorded": "a 2-core CPU, 2026-11-22"},
                         text=("recorded",)),  # where and when, in words
    "sanity_checks": call({"a check that holds": True}),
}

# (target, argument): {kind of junk: what goes wrong}, for modules this file's owner does not
# maintain; xfail (not strict) until fixed there.
def _same(kinds: str, what: str) -> dict[str, str]:
    return {kind: what for kind in kinds.split(", ")}


NOT_TENSOR = "None, string, zero, negative, huge, nested list"
ANY_TENSOR = ("empty tensor, scalar tensor, integer tensor, 1-D tensor, 5-D tensor, NaN tensor, "
              "inf tensor")
KNOWN_DEFECTS: dict[tuple[str, str], dict[str, str]] = {
    # none left: add (target, argument): {kind: what goes wrong} for a defect found elsewhere
}


# --- junk --------------------------------------------------------------------------------------

KINDS = ["None", "string", "zero", "negative", "huge", "empty tensor", "scalar tensor",
         "integer tensor", "1-D tensor", "5-D tensor", "NaN tensor", "inf tensor", "nested list"]
NEVER_VALID = {"string", "nested list"}


def canonical(kind: str, valid: Any) -> list[Any]:
    """The junk values of ``kind`` that ``test_sweep`` tries; shaped like ``valid`` where a shape
    matters, so the junk reaches past the shape checks."""
    like = valid if isinstance(valid, torch.Tensor) and valid.numel() else torch.ones(2, 3)

    def emptied(dim: int) -> torch.Tensor:  # ``like`` with one dimension of size 0
        dims = list(like.shape)
        dims[dim] = 0
        return torch.empty(dims, dtype=like.dtype)

    return {
        "None": lambda: [None],
        "string": lambda: ["junk"],
        "zero": lambda: [0],
        "negative": lambda: [-3],
        "huge": lambda: [10**9],
        "empty tensor": lambda: [torch.empty(0)] + [emptied(d) for d in range(like.dim())],
        "scalar tensor": lambda: [torch.tensor(0.5)],
        "integer tensor": lambda: [torch.ones(like.shape, dtype=torch.long)],
        "1-D tensor": lambda: [torch.ones(3)],
        "5-D tensor": lambda: [torch.ones(2, 1, 3, 2, 4)],
        "NaN tensor": lambda: [torch.full(like.shape, math.nan)],
        "inf tensor": lambda: [torch.full(like.shape, math.inf)],
        "nested list": lambda: [[[1.0, 2.0], [3.0]]],
    }[kind]()


@st.composite
def junk(draw, valid: Any) -> tuple[str, Any]:
    """``(kind, value)``: junk of a drawn kind with drawn shapes and values."""
    kind = draw(st.sampled_from(KINDS))
    like = valid if isinstance(valid, torch.Tensor) and valid.numel() else torch.ones(2, 3)
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    small = st.integers(1, 3)
    if kind == "None":
        return kind, None
    if kind == "string":
        return kind, draw(st.text(alphabet="abcxyz _-!0", min_size=0, max_size=6)
                          .filter(lambda s: s not in {"cpu", "meta"}))
    if kind == "zero":
        return kind, 0
    if kind == "negative":
        return kind, draw(st.integers(-10**6, -1))
    if kind == "huge":
        return kind, draw(st.sampled_from([10**9, 2**31, 10**12]))
    if kind == "empty tensor":
        dims = list(like.shape) if draw(st.booleans()) else draw(st.lists(small, min_size=1,
                                                                         max_size=3))
        dims[draw(st.integers(0, len(dims) - 1))] = 0
        return kind, torch.empty(dims, dtype=like.dtype if like.is_floating_point() else None)
    if kind == "scalar tensor":
        return kind, torch.tensor(draw(st.floats(-1e3, 1e3, width=32)))
    if kind == "integer tensor":
        return kind, torch.randint(-3, 6, like.shape, generator=gen)
    if kind == "1-D tensor":
        return kind, torch.randn(draw(st.integers(1, 6)), generator=gen)
    if kind == "5-D tensor":
        return kind, torch.randn([draw(small) for _ in range(5)], generator=gen)
    if kind in ("NaN tensor", "inf tensor"):
        bad = math.nan if kind == "NaN tensor" else draw(st.sampled_from([math.inf, -math.inf]))
        base = like.clone() if like.is_floating_point() else torch.randn(like.shape, generator=gen)
        base.view(-1)[draw(st.integers(0, base.numel() - 1))] = bad
        return kind, base
    ragged = draw(st.lists(st.lists(st.floats(-5, 5), min_size=1, max_size=3), min_size=2,
                           max_size=3).filter(lambda rows: len({len(r) for r in rows}) > 1))
    return kind, ragged


# --- one call, judged --------------------------------------------------------------------------


class Hang(Exception):
    pass


def _on_alarm(signum, frame):
    raise Hang(f"no answer after {HANG_S} s")


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def run_capped(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    """``fn()`` under the alarm and the memory cap: ``(result, exception, seconds)``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + MEMORY_CAP
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    resource.setrlimit(resource.RLIMIT_AS, (min(cap, hard) if hard > 0 else cap, hard))
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    start = time.perf_counter()
    result, error = None, None
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - every exception is judged below
        error = e
    finally:
        elapsed = time.perf_counter() - start
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return result, error, elapsed


def tensors_in(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in a result: tensors, tuples/lists/dicts, NamedTuples, modules' parameters."""
    if depth > 4:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, nn.Module):
        return [p.detach() for p in value.parameters()]
    if is_dataclass(value):
        value = [getattr(value, f.name) for f in fields(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item, depth + 1)]
    return []


def finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return all(bool(torch.isfinite(t).all()) for t in tensors_in(value)
               if t.is_floating_point() or t.is_complex())


def bound_call(name: str, case: Case):
    """``(signature, BoundArguments, build)``: ``build(arguments)`` makes a fresh call."""
    owner, _, meth = name.partition(".")
    if meth:
        fn = getattr(case.make(), meth)
    else:
        fn = PUBLIC[owner]
    sig = inspect.signature(fn)
    bound = sig.bind(*case.args, **case.kwargs)

    def build(arguments: dict[str, Any]) -> Callable[[], Any]:
        target = getattr(case.make(), meth) if meth else PUBLIC[owner]
        ba = inspect.BoundArguments(sig, dict(arguments))
        return lambda: target(*ba.args, **ba.kwargs)

    return sig, bound, build


def parameters(name: str) -> list[str]:
    sig, _, _ = bound_call(name, TABLE[name])
    return [p.name for p in sig.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def judge(name: str, param: str, kind: str, value: Any) -> str | None:
    """Call ``name`` with ``param`` replaced by ``value``; ``None`` if the outcome is acceptable,
    else what went wrong."""
    case = TABLE[name]
    sig, bound, build = bound_call(name, case)
    arguments = dict(bound.arguments)
    arguments[param] = value
    inputs_finite = all(finite(v) for v in arguments.values() if isinstance(v, torch.Tensor))
    result, error, elapsed = run_capped(build(arguments))
    CALLS[0] += 1
    where = f"{name}({param}=<{kind}>)"
    if kind not in KNOWN_DEFECTS.get((name, param), {}):
        SLOWEST[:] = max(SLOWEST, [elapsed, where])
    if error is not None:
        if not isinstance(error, (ValueError, TypeError)):
            return f"{where} raised {type(error).__name__}: {str(error)[:200]}"
        if not re.search(rf"\b{re.escape(param)}\b", str(error)):
            return f"{where} raised {type(error).__name__} not naming {param!r}: {str(error)[:200]}"
        return None
    declared = sig.parameters[param]
    optional = declared.default is None or "None" in str(declared.annotation)
    if kind == "string" and param in case.text:
        return None
    if kind in NEVER_VALID or (kind == "None" and not optional):
        return f"{where} accepted junk silently, returned {type(result).__name__}"
    if inputs_finite and case.finite_result and not finite(result):
        return f"{where} returned NaN/inf from finite input"
    return None


CALLS = [0]  # junk calls judged, and the slowest one (outside KNOWN_DEFECTS), for the report
SLOWEST: list = [0.0, ""]


# --- the tests ---------------------------------------------------------------------------------


def test_every_public_callable_has_a_valid_call():
    missing = [name for name in targets() if name not in TABLE]
    assert not missing, f"add a valid call to TABLE in {__file__} for: {missing}"


def _cases(kind: str) -> list:
    params = []
    for name in targets():
        case = TABLE.get(name)
        if case is None or case.skip:
            reason = case.skip if case else "no valid call in TABLE (see the test above)"
            args = (name,) if kind == "callable" else (name, None)
            params.append(pytest.param(*args, marks=pytest.mark.skip(reason=reason), id=name))
            continue
        if kind == "callable":
            params.append(pytest.param(name, id=name))
            continue
        for param in parameters(name):
            known = KNOWN_DEFECTS.get((name, param))
            marks = [pytest.mark.xfail(raises=KnownDefect, strict=False, reason=_reason(name, known))
                     ] if known else []
            params.append(pytest.param(name, param, marks=marks, id=f"{name}-{param}"))
    return params


class KnownDefect(AssertionError):
    pass


def _reason(name: str, known: dict[str, str]) -> str:
    obj = PUBLIC[name.partition(".")[0]]
    by_what: dict[str, list[str]] = {}
    for kind, what in known.items():
        by_what.setdefault(what, []).append(kind)
    return f"known defect in {obj.__module__}: " + "; ".join(
        f"{', '.join(kinds)}: {what}" for what, kinds in by_what.items())


@pytest.mark.parametrize("name", _cases("callable"))
def test_valid_call_works(name):
    case = TABLE[name]
    _, bound, build = bound_call(name, case)
    result, error, _elapsed = run_capped(build(bound.arguments))
    assert error is None, f"the valid call in TABLE for {name} fails: {error!r}"
    assert not case.finite_result or finite(result)


@pytest.mark.parametrize("name, param", _cases("argument"))
def test_sweep(name, param):
    """Every kind of junk once, in every argument, with a canonical value."""
    valid = TABLE[name].kwargs.get(param)
    _, bound, _ = bound_call(name, TABLE[name])
    valid = bound.arguments.get(param, valid)
    known = KNOWN_DEFECTS.get((name, param), {})
    problems, known_seen = [], []
    for kind in KINDS:
        for value in canonical(kind, valid):
            problem = judge(name, param, kind, value)
            if problem:
                (known_seen if kind in known else problems).append(problem)
                break
    assert not problems, "\n".join(problems)
    if known_seen:
        raise KnownDefect("\n".join(known_seen))


@pytest.mark.parametrize("name", _cases("callable"))
@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_fuzz(name, data):
    """Hypothesis: which argument, which junk, which shapes and values; per callable."""
    params = parameters(name)
    if not params:
        return
    param = data.draw(st.sampled_from(params), label="argument")
    _, bound, _ = bound_call(name, TABLE[name])
    kind, value = data.draw(junk(bound.arguments.get(param)), label="junk")
    if kind in KNOWN_DEFECTS.get((name, param), {}):
        return  # reported (xfail) by test_sweep
    problem = judge(name, param, kind, value)
    assert problem is None, problem


@pytest.fixture(autouse=True)
def _restore_global_state():
    """``setup`` (fuzzed here) seeds the global generators and sets print options and the plot
    style; give the next test the state it would have had."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state(),  # noqa: NPY002
             np.get_printoptions())
    with mpl.rc_context():
        yield
    random.setstate(saved[0])
    np.random.set_state(saved[1])  # noqa: NPY002
    torch.set_rng_state(saved[2])
    torch.set_printoptions(profile="default")
    np.set_printoptions(**saved[3])


@pytest.fixture(scope="module", autouse=True)
def _report_calls():
    yield
    if os.environ.get("FUZZ_REPORT"):
        print(f"\n[test_fuzz] profile {PROFILE}: {CALLS[0]} junk calls judged; slowest "
              f"{SLOWEST[0] * 1000:.1f} ms: {SLOWEST[1]}")


# --- the cases issue 17 found, one named test each ---------------------------------------------

HUGE = 10**9


def refused_fast(fn: Callable[[], Any], pattern: str) -> str:
    """``fn()`` must raise a ValueError matching ``pattern`` (before the hang alarm), under the memory
    cap (so nothing big was allocated first); returns the message."""
    result, error, _elapsed = run_capped(fn)
    assert isinstance(error, ValueError), f"expected a ValueError, got {error!r} / {result!r}"
    assert re.search(pattern, str(error)), str(error)
    return str(error)


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_masked_softmax_empty_tensor_clear_error(shape):
    scores = torch.empty(shape)
    refused_fast(lambda: PUBLIC["masked_softmax"](scores),
                 rf"scores.*last dimension.*{re.escape(str(shape))}")


def test_masked_softmax_empty_batch_is_fine():
    assert PUBLIC["masked_softmax"](torch.empty(0, 4)).shape == (0, 4)


def test_max_weight_empty_tensor_clear_error():
    refused_fast(lambda: PUBLIC["max_weight"](torch.empty(0)), r"weights.*last dimension.*\(0,\)")
    refused_fast(lambda: PUBLIC["attention_entropy"](torch.empty(2, 0)), r"weights.*\(2, 0\)")


def test_attention_with_no_keys_or_no_features_clear_error():
    sdpa = PUBLIC["scaled_dot_product_attention"]
    refused_fast(lambda: sdpa(torch.ones(3, 4), torch.ones(0, 4), torch.ones(0, 2)), r"\bk\b.*n_k")
    refused_fast(lambda: sdpa(torch.ones(3, 0), torch.ones(5, 0), torch.ones(5, 2)), r"d_k")


@pytest.mark.parametrize("call, pattern", [
    (lambda: PUBLIC["causal_mask"](HUGE), r"n = 1000000000: the \(n, n\) mask.*9e\+18 bytes"),
    (lambda: PUBLIC["sliding_window_mask"](HUGE, 3), r"n = 1000000000.*bytes"),
    (lambda: PUBLIC["padding_mask"]([1, 2], HUGE), r"max_len = 1000000000.*bytes"),
], ids=["causal_mask", "sliding_window_mask", "padding_mask"])
def test_mask_huge_n_refused_fast(call, pattern):
    refused_fast(call, pattern)


def test_causal_mask_huge_n_refused_fast():
    message = refused_fast(lambda: PUBLIC["causal_mask"](HUGE), r"\bn = 1000000000\b")
    assert "4.29e+09" in message  # and the bound it is over


@pytest.mark.parametrize("call, pattern", [
    (lambda: PUBLIC["alibi_slopes"](HUGE), r"num_heads = 1000000000.*bytes"),
    (lambda: PUBLIC["alibi_bias"](8, HUGE), r"num_heads = 1000000000.*bytes"),
    (lambda: PUBLIC["alibi_bias"](HUGE, 8), r"\bn = 1000000000.*bytes"),
    (lambda: PUBLIC["sinusoidal_encoding"](HUGE, 8), r"n_positions = 1000000000.*bytes"),
    (lambda: PUBLIC["sinusoidal_encoding"](8, HUGE), r"d_model = 1000000000.*bytes"),
    (lambda: PUBLIC["frequencies"](HUGE), r"d_model = 1000000000.*bytes"),
    (lambda: PUBLIC["LearnedPositionalEmbedding"](8, HUGE), r"d_model = 1000000000.*bytes"),
    (lambda: PUBLIC["LearnedPositionalEmbedding"](HUGE, 8), r"max_len = 1000000000.*bytes"),
    (lambda: PUBLIC["AdditiveScore"](4, 4, HUGE), r"d_attn = 1000000000.*bytes"),
], ids=["alibi_slopes", "alibi_bias heads", "alibi_bias n", "sinusoidal n", "sinusoidal d",
        "frequencies", "learned d_model", "learned max_len", "additive d_attn"])
def test_positional_huge_sizes_refused_fast(call, pattern):
    refused_fast(call, pattern)


@pytest.mark.parametrize("kwargs, name", [
    ({"d_model": HUGE, "num_heads": 8}, "d_model"),
    ({"d_model": 8, "num_heads": 2, "kdim": HUGE}, "kdim"),  # cross-attention's key size
    ({"d_model": 8, "num_heads": 2, "vdim": HUGE}, "vdim"),
], ids=["d_model", "kdim", "vdim"])
def test_multihead_huge_sizes_refused_fast(kwargs, name):
    refused_fast(lambda: PUBLIC["MultiHeadAttention"](**kwargs), rf"\b{name}\b")


def test_pair_rotation_huge_d_model_allocates_nothing():
    # one frequency, not the (d_model / 2,) table
    r = PUBLIC["pair_rotation"](1.0, HUGE, 0)
    assert torch.allclose(r, torch.tensor([[math.cos(1.0), math.sin(1.0)],
                                           [-math.sin(1.0), math.cos(1.0)]], dtype=torch.float64))


@pytest.mark.parametrize("fn", ["attention_entropy", "normalized_entropy", "effective_keys",
                                "max_weight"])
def test_entropy_rejects_negative_weights(fn):
    weights = torch.tensor([[0.5, 0.7, -0.2], [0.2, 0.3, 0.5]])  # rows sum to 1; one entry < 0
    refused_fast(lambda: PUBLIC[fn](weights), r"weights.*non-negative.*-0\.2")


@pytest.mark.parametrize("fn", ["attention_entropy", "normalized_entropy", "effective_keys",
                                "max_weight"])
def test_entropy_rejects_rows_not_summing_to_one(fn):
    weights = torch.tensor([[0.5, 0.7, 0.2], [0.2, 0.3, 0.5]])
    refused_fast(lambda: PUBLIC[fn](weights), r"weights.*sum to 1.*1\.4")


@pytest.mark.parametrize("fn", ["attention_entropy", "normalized_entropy", "max_weight"])
def test_entropy_rejects_nan_weights(fn):
    refused_fast(lambda: PUBLIC[fn](torch.tensor([0.5, math.nan])), r"weights.*NaN")


def test_entropy_accepts_softmax_rounding_and_zero_rows():
    # float32 softmax rows are one only to rounding; a fully masked row is all zero (entropy 0)
    weights = torch.softmax(torch.randn(4, 1000, generator=torch.Generator().manual_seed(1)), -1)
    assert torch.isfinite(PUBLIC["attention_entropy"](weights)).all()
    zero_row = torch.tensor([[0.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    assert PUBLIC["attention_entropy"](zero_row)[0] == 0
    assert PUBLIC["normalized_entropy"](zero_row)[0] == 0
    assert PUBLIC["max_weight"](zero_row).tolist() == [0.0, 0.5]
    # just outside the tolerance is refused
    with pytest.raises(ValueError, match="sum to 1"):
        PUBLIC["attention_entropy"](torch.tensor([0.5, 0.5 + 2e-3]))


def test_device_and_dtype_arguments_are_checked():
    refused_fast(lambda: PUBLIC["causal_mask"](3, device="junk"), r"device='junk'")
    with pytest.raises(TypeError, match="device"):
        PUBLIC["causal_mask"](3, device=0)
    with pytest.raises(TypeError, match="dtype.*floating"):
        PUBLIC["sinusoidal_encoding"](3, 4, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype"):
        PUBLIC["alibi_bias"](3, 4, dtype="float32")


def test_sliding_window_mask_causal_must_be_a_bool():
    # "False" is truthy: it used to give the causal mask silently
    with pytest.raises(TypeError, match="causal.*bool.*str"):
        PUBLIC["sliding_window_mask"](4, 2, "False")


def test_known_defects_name_a_module_this_file_does_not_fix():
    owned = {"attn_helpers.attention", "attn_helpers.masks", "attn_helpers.entropy",
             "attn_helpers.positional"}
    for name, _ in KNOWN_DEFECTS:
        assert name.partition(".")[0] in PUBLIC, f"stale entry {name} in KNOWN_DEFECTS"
        assert PUBLIC[name.partition(".")[0]].__module__ not in owned, name


def test_setup_seed_range_is_numpys_and_said_so():
    for seed in (-3, 2**32):                                  # numpy's 'Seed must be ...' before
        refused_fast(lambda seed=seed: PUBLIC["setup"](seed), rf"seed must be between 0 and "
                                                              rf"4294967295, got {seed}")
    with pytest.raises(TypeError, match="seed must be an int, got float"):
        PUBLIC["setup"](1.0)
    first = PUBLIC["setup"](2**32 - 1)
    assert torch.equal(torch.randn(3, generator=first),
                       torch.randn(3, generator=torch.Generator().manual_seed(2**32 - 1)))

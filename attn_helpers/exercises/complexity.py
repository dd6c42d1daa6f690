r"""Checkers for notebook 08 (complexity): merging two partial online-softmax states
(``complexity.merge_states``), FlashAttention-2's backward for causal attention in tiles
(``complexity.causal_backward``, in :mod:`.complexity_backward`), and one step of causal linear
attention as a recurrence (``complexity.linear_step``, in :mod:`.complexity_linear`).

A state is the online softmax's ``(m, l, acc)``: ``m`` ``(..., n_q, 1)`` the running maximum of
the scores (``-inf`` before any key), ``l`` ``(..., n_q, 1)`` the sum of ``exp(s - m)`` and ``acc``
``(..., n_q, d_v)`` the sum of ``exp(s - m) v``; ``acc / l`` is the attention output. Each checker
blocks the package functions that would do the exercise (``forbid=``), under any name the
notebook imported them by.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
import torch.nn.functional as F

import attn_helpers

from .. import efficient, ring
from ..efficient import block_state
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["check_merge_states", "check_causal_backward", "check_linear_step",
           "merge_states_reference", "causal_backward_reference", "linear_step_reference"]

F64 = torch.float64
STATE = ("m (the merged max)", "l (the merged sum)", "acc (the merged output sum)")
_EXACT = [  # exact attention, blocked by every checker of notebook 08
    (efficient, "tiled_attention"), (attn_helpers, "tiled_attention"),
    (F, "scaled_dot_product_attention"), (attn_helpers, "scaled_dot_product_attention")]


def _stages(candidate, reference, stages, *, what, output_names, atol, rtol, forbid,
            **more) -> CheckResult:
    """:func:`check_function` over groups ``(cases, mistakes, nan_hint)``; the first miss is
    reported (numbered among all cases), else one verdict. A later group is reached only by
    answers that pass the earlier ones, where the known mistakes fail: it needs only its hint.
    ``more``: further keywords of :func:`check_function` (``instead``, ``guard``)."""
    total, done = sum(len(cases) for cases, _, _ in stages), 0
    for cases, mistakes, nan_hint in stages:
        result = check_function(candidate, reference, cases, what=what, output_names=output_names,
                                mistakes=mistakes, nan_hint=nan_hint, atol=atol, rtol=rtol,
                                forbid=forbid, **more)
        if not result:
            return CheckResult(False, re.sub(r"on case (\d+) of \d+", lambda m, done=done: (
                f"on case {int(m[1]) + done} of {total}"), result.message, count=1))
        done += len(cases)
    return CheckResult(True, f"Passed: {what} matches the reference on all {total} cases, "
                             "edge cases included.")


# --- exercise 1: merge two partial states -------------------------------------------------------


def merge_states_reference(m1, l1, acc1, m2, l2, acc2):  # noqa: E741 - the paper's names
    """The state of the union of two disjoint sets of keys, from each set's state (written out, as
    the checker blocks ``efficient.merge_states``; tested equal to it)."""
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))   # both empty: 0, not NaN
    c1, c2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, c1 * l1 + c2 * l2, c1 * acc1 + c2 * acc2


def _merge_case(g, batch, n_q, keys, d_v, *, offset=0.0, empty2=False, size=1.0) -> dict:
    """Two states of ``keys`` keys each; ``offset`` shifts half the rows' second scores up, half
    down, so that either state may hold the larger max."""
    def rand(*shape):
        return torch.randn(*batch, *shape, generator=g, dtype=F64)

    s1, s2 = size * rand(n_q, keys[0]), size * rand(n_q, keys[1])
    shift = torch.tensor([offset if r % 2 else -offset for r in range(n_q)], dtype=F64)[:, None]
    m1, l1, acc1 = block_state(s1, rand(keys[0], d_v))
    m2, l2, acc2 = block_state(s2 + shift, rand(keys[1], d_v))
    if empty2:                                             # a split with no key for these rows
        m2, l2, acc2 = torch.full_like(m2, -math.inf), torch.zeros_like(l2), torch.zeros_like(acc2)
    return {"m1": m1, "l1": l1, "acc1": acc1, "m2": m2, "l2": l2, "acc2": acc2}


def _merge_cases() -> list[dict]:
    g = seeded(80)
    return [_merge_case(g, (), 4, (3, 5), 3, offset=2.0),
            _merge_case(g, (2, 3), 3, (4, 2), 5, offset=1.5),
            _merge_case(g, (), 1, (1, 1), 2, offset=3.0),
            _merge_case(g, (2,), 4, (3, 3), 2, empty2=True),
            _merge_case(g, (), 6, (5, 4), 4, offset=6.0, size=3.0)]


def _large_merge_cases() -> list[dict]:
    """Maxima near 1000: ``exp(m)`` overflows past 709."""
    case = _merge_case(seeded(81), (), 4, (3, 3), 3, offset=2.0)
    return [{**case, "m1": case["m1"] + 1000.0, "m2": case["m2"] + 1000.0}]


def _empty_merge_cases() -> list[dict]:
    """Rows 0 and 2 with no key in either state (m1 = m2 = -inf): the merged row is empty too."""
    case = _merge_case(seeded(82), (), 4, (3, 2), 3, offset=1.0)
    empty = torch.tensor([True, False, True, False])[:, None]
    for m, l, acc in (("m1", "l1", "acc1"), ("m2", "l2", "acc2")):  # noqa: E741
        case[m] = case[m].masked_fill(empty, -math.inf)
        case[l], case[acc] = case[l].masked_fill(empty, 0.0), case[acc].masked_fill(empty, 0.0)
    return [case]


def _merge_with(m1, l1, acc1, m2, l2, acc2, *, new_max=torch.maximum, rescale=(True, True),  # noqa: E741
                flip=False, swap=False, finish=False):
    """The merge with one thing changed, for the known mistakes."""
    m = new_max(m1, m2)
    c1, c2 = (torch.exp(m - m1), torch.exp(m - m2)) if flip else (torch.exp(m1 - m), torch.exp(m2 - m))
    c1, c2 = (c2, c1) if swap else (c1, c2)
    l = (c1 * l1 + c2 * l2) if rescale[0] else l1 + l2  # noqa: E741
    acc = (c1 * acc1 + c2 * acc2) if rescale[1] else acc1 + acc2
    return m, l, acc / l if finish else acc


def _merge_mistakes() -> list[Mistake]:
    return [
        Mistake(lambda *a: _merge_with(*a, rescale=(False, False)),
                "the sums were added without rescaling: l1 and acc1 are measured against m1, l2 and "
                "acc2 against m2; bring both to the new max m first, multiplying by exp(m1 - m) and "
                "exp(m2 - m)."),
        Mistake(lambda *a: _merge_with(*a, rescale=(True, False)),
                "l was rescaled but acc was not: acc's terms were measured against the old maxima "
                "too, so acc1 and acc2 need the same factors as l1 and l2."),
        Mistake(lambda *a: _merge_with(*a, flip=True),
                "the factors are upside down: exp(m - m1) is at least 1; the factor that re-expresses "
                "exp(s - m1) as exp(s - m) is exp(m1 - m), at most 1."),
        Mistake(lambda *a: _merge_with(*a, swap=True),
                "the factors were swapped: state 1 takes exp(m1 - m), state 2 exp(m2 - m)."),
        Mistake(lambda *a: _merge_with(*a, new_max=lambda x, y: x),
                "m was kept from state 1: the merged m is the larger of the two maxima, "
                "max(m1, m2), so that no factor exceeds 1 and nothing overflows later."),
        Mistake(lambda *a: _merge_with(*a, new_max=torch.minimum),
                "m is the smaller of the two maxima: the merged m is max(m1, m2)."),
        Mistake(lambda *a: _merge_with(*a, finish=True),
                "acc came back divided by l: that is the output, not the state; keep acc "
                "unnormalised so that further states can still be merged into it."),
    ]


@exercise("complexity.merge_states", "merge two partial online-softmax states (split-KV, ring)",
          hints=(
              "Each state summed exp(s - m_i) over its own keys, against its own max. Pick the "
              "merged max first, then re-express both sums against it before adding them.",
              "Both sums must be measured against the same max before they can be added, and the "
              "merged m is the larger of m1 and m2. Which one factor turns every term exp(s - m_i) "
              "of state i into exp(s - m), and why must l_i and acc_i both take it? Where both "
              "states are empty, m1 - m is -inf - (-inf), NaN: what must you subtract there "
              "instead so that the merged row stays empty (m = -inf, l = 0, acc = 0)?",
              "m = torch.maximum(m1, m2)                     # (..., n_q, 1): the merged max\n"
              "safe = ...                                    # m, but 0 where m = -inf (both empty)\n"
              "c1, c2 = ...                                  # each state's factor, against safe\n"
              "return m, ..., ...                            # l and acc, both rescaled and added"))
def check_merge_states(merge: Callable) -> CheckResult:
    """Exercise: ``merge(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``: ``m_i``, ``l_i``
    ``(..., n_q, 1)``, ``acc_i`` ``(..., n_q, d_v)``, the states of two disjoint sets of keys."""
    overflow = ("exp of a max near 1000 overflows: never exponentiate m1 or m2 alone, only "
                "the differences m1 - m and m2 - m, which are at most 0.")
    forbid = [(efficient, "merge_states"), (ring, "merge_states"), (efficient, "online_softmax_step"),
              (efficient, "block_state"), (attn_helpers, "online_softmax_step"), *_EXACT]
    both_empty = ("both states are empty in some rows (m1 = m2 = -inf), so m = -inf and m1 - m "
                  "= -inf - (-inf) is NaN: rescale against a max that is finite in every row (what "
                  "can stand in for m where it is -inf, without changing the other rows?); the "
                  "merged row is then empty too: m = -inf, l = 0, acc = 0.")
    return _stages(merge, merge_states_reference,
                   [(_merge_cases(), _merge_mistakes(), overflow), (_large_merge_cases(), [], overflow),
                    (_empty_merge_cases(), [], both_empty)],
                   what="merge_states", output_names=STATE, atol=1e-9, rtol=1e-7, forbid=forbid)


# Exercises 2 (the causal backward, in tiles) and 3 (one step of causal linear attention) have
# their own files; imported last, in this order, so the exercises register (and progress() lists
# them) in the notebook's order.
from .complexity_backward import causal_backward_reference, check_causal_backward  # noqa: E402
from .complexity_linear import check_linear_step, linear_step_reference  # noqa: E402

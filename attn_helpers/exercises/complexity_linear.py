r"""Exercise 3 of notebook 08: one step of causal linear attention as a recurrence
(``complexity.linear_step``): the state ``(S, z)`` in, token t's output and the new state out.
Registered when :mod:`.complexity` is imported (at its end)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import attn_helpers

from .. import efficient
from ..efficient import elu_feature_map
from .core import CheckResult, Mistake, check_function, seeded
from .workflow import exercise

__all__ = ["check_linear_step", "linear_step_reference"]

F64 = torch.float64


def linear_step_reference(S, z, q_t, k_t, v_t):
    """Add token t to ``(S, z)``, then read with ``phi(q_t)``: ``(o_t, S_t, z_t)`` (written out;
    tested equal to ``efficient.linear_attention_step``)."""
    phi_q, phi_k = F.elu(q_t) + 1, F.elu(k_t) + 1
    S_t, z_t = S + phi_k[..., :, None] * v_t[..., None, :], z + phi_k
    return (phi_q[..., None, :] @ S_t).squeeze(-2) / (phi_q * z_t).sum(-1, keepdim=True), S_t, z_t


def _linear_case(g, batch, d_k, d_v, before: int) -> dict:
    """The state after ``before`` earlier tokens, and token t."""
    def rand(*shape):
        return torch.randn(*batch, *shape, generator=g, dtype=F64)

    k, v = rand(before, d_k), rand(before, d_v)
    phi_k = elu_feature_map(k)
    S, z = phi_k.mT @ v, phi_k.sum(-2)
    return {"S": S, "z": z, "q_t": rand(d_k), "k_t": rand(d_k), "v_t": rand(d_v)}


def _linear_cases() -> list[dict]:
    g = seeded(86)
    return [_linear_case(g, (), 4, 4, 5), _linear_case(g, (2, 3), 3, 5, 4),
            _linear_case(g, (), 2, 3, 0), _linear_case(g, (2,), 6, 2, 9)]


def _step_with(S, z, q_t, k_t, v_t, *, phi=elu_feature_map, read_first=False, normalise=True,
               replace=False, transpose=False, raw_z=False, phi_v=False):
    """One step with one thing changed, for the known mistakes."""
    pq, pk = phi(q_t), phi(k_t)
    v_t = elu_feature_map(v_t) if phi_v else v_t
    outer = (v_t[..., :, None] * pk[..., None, :]) if transpose else pk[..., :, None] * v_t[..., None, :]
    S_new = outer if replace else S + outer
    z_new = (k_t if raw_z else pk) + (0 if replace else z)
    S_read, z_read = (S, z) if read_first else (S_new, z_new)
    num = (pq[..., None, :] @ S_read).squeeze(-2)
    o = num / (pq * z_read).sum(-1, keepdim=True) if normalise else num
    return o, S_new, z_new


def _linear_mistakes() -> list[Mistake]:
    return [
        Mistake(lambda *a: _step_with(*a, read_first=True),
                "o_t was read from the state before token t was added: token t must see itself "
                "(add first, then read)."),
        Mistake(lambda *a: _step_with(*a, normalise=False),
                "the normaliser is missing: divide phi(q_t)^T S_t by phi(q_t)^T z_t."),
        Mistake(lambda *a: _step_with(*a, replace=True),
                "the state was replaced by token t's terms, not added to: S_t = S_{t-1} + "
                "phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t)."),
        Mistake(lambda *a: _step_with(*a, transpose=True),
                "the outer product is transposed: S is (d_k, d_v), its new term phi(k_t) v_t^T."),
        Mistake(lambda *a: _step_with(*a, raw_z=True),
                "z collected k_t itself: the normaliser sums the features, z_t = z_{t-1} + phi(k_t)."),
        Mistake(lambda *a: _step_with(*a, phi=F.elu),
                "phi = elu without the + 1: the feature map is elu(x) + 1, positive, so the "
                "normaliser never reaches 0."),
        Mistake(lambda *a: _step_with(*a, phi=F.relu),
                "phi = relu: the feature map here is elu(x) + 1 (Katharopoulos et al.), which is "
                "positive everywhere; relu zeroes the negative half and changes every output."),
        Mistake(lambda *a: _step_with(*a, phi=lambda x: x),
                "no feature map: phi(x) = elu(x) + 1 is applied to q_t and k_t."),
        Mistake(lambda *a: _step_with(*a, phi_v=True),
                "phi was applied to the value too: only q_t and k_t go through the feature map."),
    ]


@exercise("complexity.linear_step", "one step of causal linear attention: state in, state out",
          hints=(
              "In section 6's formula, which factor of each term in the numerator and the "
              "denominator depends on j, and which does not? Take the one that does not out of "
              "the sums: what is left inside is the state. Add token t's terms first, then read "
              "the new state with phi(q_t). phi(x) = elu(x) + 1 (torch.nn.functional.elu).",
              "Once phi(q_t) is out, the sums over the past keys in the numerator and the "
              "denominator no longer depend on the query: they can be carried from step to step "
              "as a running state, S for the numerator and z for the denominator, and step t "
              "updates each with token t's key (and value) alone. Then phi(q_t) reads the new "
              "state; keep the denominator (..., 1) so that it divides the (..., d_v) numerator.",
              "pq, pk = torch.nn.functional.elu(q_t) + 1, torch.nn.functional.elu(k_t) + 1\n"
              "S_t = ...                            # (..., d_k, d_v): S plus token t's term\n"
              "z_t = ...                            # (..., d_k): z plus token t's term\n"
              "o_t = ...                            # (..., d_v): the new state read with phi(q_t)\n"
              "return o_t, S_t, z_t"))
def check_linear_step(step: Callable) -> CheckResult:
    """Exercise: ``step(S, z, q_t, k_t, v_t) -> (o_t, S_t, z_t)``: ``S`` ``(..., d_k, d_v)``,
    ``z``, ``q_t``, ``k_t`` ``(..., d_k)``, ``v_t`` ``(..., d_v)``; ``o_t`` ``(..., d_v)``."""
    from .complexity import _EXACT  # defined there; this module is imported at its end

    forbid = [(efficient, "linear_attention_step"), (efficient, "linear_attention"),
              (attn_helpers, "linear_attention"), *_EXACT]
    return check_function(step, linear_step_reference, _linear_cases(), what="linear_step",
                          output_names=("o_t", "S_t", "z_t"), mistakes=_linear_mistakes(),
                          nan_hint="a normaliser of 0: add token t before reading, and use "
                                   "phi = elu + 1, which keeps it positive.",
                          atol=1e-9, rtol=1e-7, forbid=forbid)

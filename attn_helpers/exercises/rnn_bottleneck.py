"""Checkers for notebook 01: a vanilla RNN encoder, and Bahdanau's additive score."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import CheckResult, Mistake, check_function, gradient_mismatch, seeded, size
from .workflow import exercise

_DTYPE = ("make every tensor you create with the inputs' dtype (torch.zeros(..., dtype=x.dtype)): "
          "these cases mix float32 and float64.")
_BATCH = ("x may have any number of leading batch dimensions, or none: take token j as x[..., j, :] "
          "(not x[:, j]) and size h with x.shape[:-2] (not x.shape[0]).")
_SWAPPED = "x_j (..., d_in) @ W_x (d_in, d) and h_{j-1} (..., d) @ W_h (d, d): are W_x and W_h swapped?"


def _rnn_cases() -> list[dict]:
    """d_in = d, one token, two batch dims (float64), none, then random shapes."""
    g = seeded(110)
    cases = []
    for spec in [((2,), 5, 3, 4, torch.float32), ((3,), 7, 4, 4, torch.float32),
                 ((1,), 1, 3, 5, torch.float32), ((2, 3), 4, 2, 3, torch.float64),
                 ((), 6, 3, 3, torch.float32), None]:
        batch, n, d_in, d, dtype = spec or ((size(g, 1, 4),), size(g, 2, 9), size(g, 1, 6),
                                            size(g, 2, 6), torch.float32)
        cases.append({"x": torch.randn(*batch, n, d_in, generator=g, dtype=dtype),
                      "W_x": torch.randn(d_in, d, generator=g, dtype=dtype) / d_in ** 0.5,
                      "W_h": torch.randn(d, d, generator=g, dtype=dtype) / d ** 0.5,
                      "b": 0.5 * torch.randn(d, generator=g, dtype=dtype)})
    return cases


def _rnn(*, act=torch.tanh, drop=(), outside=(), reverse=False, transpose=False, keep_first=False,
         last="last", dim=-2, start=0.0, skip_first=False, swap=False, alias=False, bias=1):
    """The recurrence, or a mistake: ``drop``/``outside`` terms ("x", "h", "b") cut or put after tanh;
    ``start``: h_{-1}; ``skip_first``: x_0 unread; ``swap``: ``(h_last, H)``; ``bias``: b's factor."""
    def rnn(x, W_x, W_h, b):  # noqa: N803
        W = W_h.mT if transpose else W_h                                # noqa: N806
        h = torch.full((*x.shape[:-2], W_h.shape[0]), start, dtype=x.dtype)   # h_{-1}: (..., d)
        states = [h] if keep_first else []
        tokens = range(1 if skip_first else 0, x.shape[-2])
        for j in reversed(tokens) if reverse else tokens:
            terms = {"x": x[..., j, :] @ W_x, "h": h @ W, "b": bias * b}   # the three terms: (..., d)
            inside = sum(v for k, v in terms.items() if k not in (*drop, *outside))
            h = act(inside) + sum(terms[k] for k in outside)            # (..., d)
            states.append(h)
        states = (states[:-1] if keep_first else states)[::-1 if reverse else 1]
        states = [h] * len(states) if alias else states   # h written in place: n times h_{n-1}
        H = torch.stack(states, dim=dim)  # (..., n, d)  # noqa: N806
        summary = {"last": h, "first": H[..., 0, :], "mean": H.mean(-2), "H[-1]": H[-1],
                   "H[:, -1]": H[:, -1]}[last]
        return (summary, H) if swap else (H, summary)
    return rnn


rnn_encoder_reference = _rnn()   # x (..., n, d_in), W_x, W_h, b -> H (..., n, d), h_last (..., d)

_RULE = "h_j = tanh(x_j W_x + h_{j-1} W_h + b)"
RNN_MISTAKES = [
    Mistake(_rnn(act=lambda z: z), "the tanh is missing: the states are linear in the inputs."),
    Mistake(_rnn(drop="h"), "the previous state is never used, so there is no recurrence."),
    Mistake(_rnn(outside="h"), f"h_{{j-1}} W_h is added after the tanh; it belongs inside: {_RULE}."),
    *(Mistake(_rnn(outside=terms), f"the tanh wraps only {inner}; it squashes the whole sum: {_RULE}.")
      for terms, inner in ((("h", "b"), "x_j W_x"), (("x", "b"), "h_{j-1} W_h"),
                           (("x",), "h_{j-1} W_h + b"))),
    Mistake(_rnn(drop="b"), "the bias b is missing inside the tanh."),
    Mistake(_rnn(bias=2), "b is added twice; this RNN has one bias (nn.RNN's b_ih + b_hh are two)."),
    Mistake(_rnn(outside="b"), f"the bias b is outside the tanh; it belongs inside: {_RULE}."),
    Mistake(_rnn(transpose=True), "W_h is transposed: the states are row vectors, multiplied from the "
            "right as in x_j W_x."),
    Mistake(_rnn(reverse=True), "you read backwards; this encoder reads j = 0 .. n-1."),
    Mistake(_rnn(keep_first=True), "the states are shifted by one: H holds h_0 .. h_{n-1} (the state "
            "AFTER each token), not h_{-1} .. h_{n-2}."),
    *(Mistake(_rnn(last=last), f"h_last is {what}; the context vector is h_{{n-1}}, H[..., -1, :].")
      for last, what in (("first", "the first state"), ("mean", "the mean of the states"),
                         ("H[-1]", "H[-1], the last entry of the first axis (the batch)"),
                         ("H[:, -1]", "H[:, -1], whose dim 1 is time only with one batch dim"))),
    *(Mistake(_rnn(dim=dim), f"H is stacked on dim {dim}; stack the states on dim -2, which counts from "
              "the end whatever the batch dimensions: (..., n, d).") for dim in (0, 1)),
    *(Mistake(_rnn(act=f), f"that is a {name}; the vanilla RNN squashes with tanh.")
      for f, name in ((torch.sigmoid, "sigmoid"), (torch.relu, "ReLU"))),
    Mistake(_rnn(alias=True), "every state in H equals the last one: h written in place (h[...] = ..., "
            "h.copy_(...)) is one tensor appended n times. Make a new one: h = torch.tanh(...)."),
    Mistake(_rnn(start=1.0), "h_{-1} is ones; the recurrence starts from h_{-1} = 0 (torch.zeros)."),
    Mistake(_rnn(skip_first=True), "H has n-1 states: token 0 is never read. Loop over j = 0 .. n-1."),
    Mistake(_rnn(swap=True), "the return order is swapped: return (H, h_last), every state first."),
]


@exercise("rnn_bottleneck.rnn_encoder", "a vanilla RNN encoder and its final state", hints=(
    "Start from a zero state and walk along the time axis (dim -2): each new state mixes the "
    "current token with the previous state. Keep every state; the last one is the summary.",
    "Loop j over range(n): token j is x[..., j, :] (..., d_in); one running state h (..., d) "
    "starts as zeros in x's dtype. Append each h to a list; torch.stack on dim -2 gives H.",
    "h = torch.zeros(*x.shape[:-2], W_h.shape[0], dtype=x.dtype)\n"
    "states = []\n"
    "for j in range(x.shape[-2]):\n"
    "    h = ...                                # the new state from x[..., j, :] and h\n"
    "    states.append(h)\n"
    "return torch.stack(states, dim=-2), h"))
def check_rnn_encoder(rnn_encoder: Callable) -> CheckResult:
    """``rnn_encoder(x, W_x, W_h, b) -> (H, h_last)``, shapes as in ``rnn_encoder_reference``."""
    result = check_function(
        rnn_encoder, rnn_encoder_reference, _rnn_cases(), what="rnn_encoder",
        output_names=("the states H", "the last state h_last"), mistakes=RNN_MISTAKES, same_dtype=True,
        error_hints=[("same dtype", _DTYPE), ("expected scalar type", _DTYPE),
                     ("must match the size of tensor", _BATCH), ("cannot be multiplied", _SWAPPED)])
    if not result:
        return result
    x, *weights = _rnn_cases()[3].values()       # one backward into x (no parameters), two batch dims
    mine, reference = torch.nn.Module(), torch.nn.Module()
    if gradient_mismatch(mine, reference, lambda m, x: torch.cat([t.flatten() for t in (
            rnn_encoder if m is mine else rnn_encoder_reference)(x, *weights)]), x):
        return CheckResult(False, "Not yet: rnn_encoder gives the right values, but after one backward "
                                  "the gradient into x differs. Was h_{j-1} detached (h.detach(), .data,"
                                  " torch.no_grad())? Then no gradient flows back through time.")
    return CheckResult(True, result.message.rstrip(".") + ", and its gradient into x does too.")


def _additive_cases() -> list[dict]:
    g = seeded(111)
    cases = []
    for spec in [(2, 5, 4, 4, 3, torch.float32), (3, 4, 6, 8, 5, torch.float32),  # then one token,
                 (1, 1, 3, 2, 4, torch.float32), (2, 6, 5, 3, 7, torch.float64), None]:  # random
        b, n, d_dec, d_h, d_a, dtype = spec or (*(size(g, 1, 8) for _ in range(5)), None)
        scale_q, scale_k = (1.0, 1.0) if spec is None else (d_dec ** 0.5, d_h ** 0.5)
        cases.append({"s": torch.randn(b, d_dec, generator=g, dtype=dtype),
                      "H": torch.randn(b, n, d_h, generator=g, dtype=dtype),
                      "U_q": torch.randn(d_dec, d_a, generator=g, dtype=dtype) / scale_q,
                      "U_k": torch.randn(d_h, d_a, generator=g, dtype=dtype) / scale_k,
                      "v_a": torch.randn(d_a, generator=g, dtype=dtype)})
    return cases


def additive_scores_reference(s, H, U_q, U_k, v_a):  # noqa: N803
    """``s (b, d_dec), H (b, n, d_h), U_q (d_dec, d_a), U_k (d_h, d_a), v_a (d_a,) -> e (b, n)``."""
    return torch.tanh((s @ U_q)[:, None, :] + H @ U_k) @ v_a


def _features(f: Callable, combine: Callable = torch.add) -> Callable:
    return lambda s, H, U_q, U_k, v_a: f(combine((s @ U_q)[:, None, :], H @ U_k), v_a)


_INNER = ("a matrix product's inner sizes must agree: s (b, d_dec) @ U_q (d_dec, d_a) and "
          "H (b, n, d_h) @ U_k (d_h, d_a) need no transpose (rows times matrices, as in x_j W_x).")
_V_LEFT = ("v_a on the left of features meets the positions (dim -2), not the d_a axis. Put v_a "
           "on the right, after the tanh's output: (b, n, d_a) @ (d_a,) -> (b, n).")
_SAME_FOR_EVERY_J = ("s_t's part, (s_t U_q) v_a^T, is then the same for every j, the softmax "
                     "cancels it, and the weights ignore s_t.")
_SHIFT = "equal up to a per-row constant (the same softmax)"
_NEW_AXIS = ("s @ U_q is (b, d_a) but H @ U_k is (b, n, d_a): without a new axis for the "
             "positions j at dim 1, (b, 1, d_a), broadcasting meets b with n.")
ADDITIVE_MISTAKES = [
    Mistake(lambda s, H, U_q, U_k, v_a: torch.tanh(s @ U_q + H @ U_k) @ v_a, _NEW_AXIS),
    Mistake(_features(lambda x, v: x @ v),
            "the tanh is missing: without it the query's part is the same for every j."),
    Mistake(_features(lambda x, v: x @ v, lambda q, k: torch.tanh(q) + torch.tanh(k)),
            "tanh is applied to each projection separately: " + _SAME_FOR_EVERY_J),
    Mistake(_features(lambda x, v: torch.tanh(x @ v)),
            "tanh comes before v_a: e_tj = tanh(s_t U_q + h_j U_k) v_a^T."),
    Mistake(_features(lambda x, v: torch.tanh(x) @ v, torch.mul),
            "you multiplied the two projections; the additive score adds them."),
    Mistake(_features(lambda x, v: x @ v, lambda q, k: torch.tanh(k) + q),
            "s_t U_q is added after the tanh: " + _SAME_FOR_EVERY_J + " Add it inside the tanh."),
    Mistake(lambda s, H, U_q, U_k, v_a: torch.tanh(H @ U_k) @ v_a,
            "the decoder state s_t is missing: add s_t U_q to every h_j U_k."),
    Mistake(lambda s, H, U_q, U_k, v_a: torch.tanh((s @ U_k)[:, None, :] + H @ U_q) @ v_a,
            "U_q and U_k are swapped: s_t goes through U_q, h_j through U_k."),
    *(Mistake(_features(lambda x, v, f=f: f(x) @ v), f"that is a {name}; the score uses tanh.")
      for f, name in ((torch.relu, "ReLU"), (torch.sigmoid, "sigmoid"))),
    Mistake(_features(lambda x, v: v @ torch.tanh(x)), _V_LEFT),
    Mistake(lambda s, H, U_q, U_k, v_a: (H @ s[:, :, None])[..., 0], "that is the dot-product score "
            "s_t h_j^T (Luong et al.'s \"dot\"). The additive score projects both, adds, squashes."),
    Mistake(lambda s, H, U_q, U_k, v_a: ((H @ U_k) @ (s @ U_q)[:, :, None])[..., 0], "that is a dot "
            "product of the projections; the additive score adds them, squashes, then applies v_a."),
    *(Mistake(_features(lambda x, v, f=f: f(torch.tanh(x) @ v)), f"{what}; return the raw scores e_tj.")
      for f, what in ((torch.exp, "you exponentiated the scores (the softmax does the exp)"),
                      (lambda e: e.log_softmax(-1), "those are log-weights (after a log_softmax)"),
                      (lambda e: e.softmax(-1), "those are weights (after a softmax)"),
                      (lambda e: e.softmax(0), "those are weights (a softmax over dim 0, the batch)"),
                      (lambda e: e - e.amax(-1, True), "each row minus its max: " + _SHIFT),
                      (lambda e: e - e.mean(-1, True), "each row minus its mean: " + _SHIFT),
                      (lambda e: e + 1, "every score plus 1: " + _SHIFT))),
    Mistake(_features(lambda x, v: torch.tanh(x) @ v.abs()), "v_a lost its signs (v_a.abs()?): use "
            "v_a as given, so a feature can lower a score as well as raise it."),
    *(Mistake(_features(lambda x, v, f=f: f(torch.tanh(x), -1)), "v_a is missing: each d_a-vector "
              f"tanh(s_t U_q + h_j U_k) becomes one number by a product with v_a, not a {name}.")
      for f, name in ((torch.sum, "sum"), (torch.mean, "mean"))),
    *(Mistake(_features(f), f"you divided by sqrt(d_a){where}. The additive score has no scale: v_a is "
              "learned and sets it (1/sqrt(d) belongs to the dot-product score, notebook 03).")
      for f, where in ((lambda x, v: torch.tanh(x) @ v / v.shape[0] ** 0.5, ""),
                       (lambda x, v: torch.tanh(x / v.shape[0] ** 0.5) @ v, " inside the tanh"))),
    Mistake(_features(lambda x, v: torch.tanh(x) @ v[:, None]), "e has a trailing axis of size 1, "
            "(b, n, 1): multiply by v_a (d_a,), not by a column (d_a, 1), to return (b, n)."),
]


@exercise("rnn_bottleneck.additive_scores", "the additive score e_tj", hints=(
    "Project the decoder state and every encoder state into d_a dimensions, add them, squash "
    "with tanh, and let v_a turn each d_a-vector into one number.",
    "s @ U_q is (b, d_a) and H @ U_k is (b, n, d_a): where must s @ U_q gain an axis? Add before the "
    "tanh: in tanh(s_t U_q) + tanh(h_j U_k) the query's part is the same for every j, and the softmax "
    "cancels it. After the tanh, which product with v_a (d_a,) contracts the last axis?",
    "query = ...                      # s @ U_q with a new axis for j: (b, 1, d_a)\n"
    "features = torch.tanh(query + H @ U_k)                    # (b, n, d_a)\n"
    "return ...                                                # (b, n)"))
def check_additive_scores(additive_scores: Callable) -> CheckResult:
    """``additive_scores(s, H, U_q, U_k, v_a) -> e (b, n)``: ``tanh(s_t U_q + h_j U_k) v_a^T``."""
    return check_function(
        additive_scores, additive_scores_reference, _additive_cases(), what="additive_scores",
        output_names=("the scores e",), mistakes=ADDITIVE_MISTAKES, same_dtype=True,
        error_hints=[("must match the size of tensor", _NEW_AXIS), ("same dtype", _DTYPE),
                     ("shapes cannot be multiplied", _INNER),
                     ("Expected size for first two dimensions of batch2", _V_LEFT)])

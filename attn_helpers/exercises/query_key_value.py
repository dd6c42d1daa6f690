"""Notebook 02's checkers: masked attention returning its weights, and W_Q, W_K under which every
token attends to the next one (a relation W_Q = W_K cannot express)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from ..attention import scaled_dot_product_attention
from ..lessons.query_key_value import weights
from .core import CheckResult, Mistake, Refused, check_function, gradient_mismatch, seeded, size
from .workflow import exercise

FULLY_MASKED = ("a row whose keys are all masked is all -inf, and softmax gives 0 / 0 = NaN there. "
                "Such a query reads nothing: after the softmax, turn exactly those NaN rows into "
                "zeros (NaN * 0 is still NaN).")
MASKED_AFTER = ("the masked keys were removed after the exponent. Here a masked key scores about 1000 "
                "more, so every allowed exp(s - max) underflows to 0 and the row is 0 / 0. Fill the "
                "masked scores with -inf before the softmax.")
LARGE_SCORES = ("every case with small scores passed; this one has scores in the 1000s. exp(1000) "
                "overflows to inf and inf / inf is NaN (a nan_to_num then hides it as 0). Subtract "
                "each row's maximum before exp, or use torch.softmax, and mask with -inf before it.")
WRONG_AXIS = ("d_k was taken from the wrong axis of q: q.shape[1] is d_k only for a 2-D q, and "
              "q.shape[-2] is n_q. d_k is the last axis: q.shape[-1].")
TRANSPOSE_ALL = ("if you wrote k.T: on a batched tensor .T reverses every axis, (2, 5, 16) -> "
                 "(16, 5, 2). Swap only the last two axes: (..., d_k, n_k).")
MASK_TRANSPOSED = ("your function runs once it is handed the mask transposed: it swaps the mask's axes. "
                   "The mask is (..., n_q, n_k), like the scores: row i lists the keys query i may see.")
BOOL_INDEX = ("boolean indexing, scores[m] = ..., needs a mask of exactly the scores' shape: it does "
              "not broadcast, and this mask lacks the batch axes. masked_fill broadcasts the mask.")
DETACHED = ("Not yet: attention gives the right values, but after one backward its gradient into {} "
            "differs. Detached (.detach(), .data, torch.no_grad())? Its projection would not train.")
EMPTY_ROW = ("a query with no allowed key must read nothing. A finite fill (-1e9, finfo.min, an added "
             "-1e4) leaves it weights on keys it may not see: fill with -inf, then zero the NaN rows.")
IN_PLACE = ("Not yet: the right values, but the backward fails: a tensor autograd saved was changed in "
            "place (w[w != w] = 0, masked_fill_). Make a new one: torch.where, nan_to_num, masked_fill.")


def _random_mask(g: torch.Generator, *shape: int) -> torch.Tensor:  # each row allows and forbids a key
    mask = torch.rand(*shape, generator=g) < 0.5
    first = torch.randint(0, shape[-1], shape[:-1], generator=g)
    mask.scatter_(-1, first[..., None], True)
    return mask.scatter_(-1, ((first + 1) % shape[-1])[..., None], False)


def _attention_cases() -> list[dict]:
    g = seeded(121)

    def case(batch, n_q, n_k, d_k, d_v, dtype=torch.float32, mask_batch=()):
        return {"q": torch.randn(*batch, n_q, d_k, generator=g, dtype=dtype),
                "k": torch.randn(*batch, n_k, d_k, generator=g, dtype=dtype),
                "v": torch.randn(*batch, n_k, d_v, generator=g, dtype=dtype),
                "mask": _random_mask(g, *mask_batch, n_q, n_k) if n_k > 1 else torch.ones(1, 1).bool()}

    cases = [case((), 3, 4, 8, 5), case((2,), 5, 5, 16, 4), case((2, 3), 4, 6, 4, 3, torch.float64),
             case((), 1, 1, 4, 2)]                                 # heads (2, 3); one token
    q, k, v = (torch.randn(2, 6, 8, generator=g) for _ in range(3))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    padding = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
    cases += [{"q": q, "k": k, "v": v, "mask": causal},            # padded queries see nothing:
              {"q": q, "k": k, "v": v, "mask": padding[:, None, :] & padding[:, :, None]}]
    batch, (n_q, n_k, d_k, d_v) = size(g, 1, 3), (size(g, 2, 8) for _ in range(4))  # random shapes
    cases.append(case((batch,), n_q, n_k, d_k, d_v, mask_batch=(batch,)))
    q, k = (30 * torch.randn(2, 4, 4, generator=g) for _ in range(2))  # scores in the 1000s
    cases.append({"q": q, "k": k, "v": torch.randn(2, 4, 3, generator=g), "mask": causal[:4, :4]})
    return cases


def _masked(s: torch.Tensor, m: torch.Tensor, fill: float = -torch.inf) -> torch.Tensor:
    return s.masked_fill(~m, fill)


def _normalised(e: torch.Tensor) -> torch.Tensor:
    return e / e.sum(-1, keepdim=True)


def _attention(weights=lambda s, m: _masked(s, m).softmax(-1).nan_to_num(0.0), scale=None):
    def attention(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale(q, k, v))
        weights_ = weights(scores, mask)
        return weights_ @ v, weights_
    return attention


def _indexed(s, m):  # boolean indexing: an IndexError unless the mask has the scores' shape
    s[~m] = -torch.inf
    return s.softmax(-1).nan_to_num(0.0)


def _weights_scaled(q, k, v, mask):  # 1/sqrt(d_k) applied to the weights after the softmax
    return _attention(lambda s, m: _masked(s, m).softmax(-1).nan_to_num(0.0) / q.shape[-1] ** 0.5,
                      scale=lambda q, k, v: 1.0)(q, k, v, mask)


_SCALES = [   # (a wrong scale of the scores, its hint)
    (lambda q, k, v: 1.0, "the scores were not scaled: their spread grows with d_k. By what must "
     "they be divided?"),
    (lambda q, k, v: 1 / q.shape[-1], "you divided by d_k; the scale is 1 / sqrt(d_k)."),
    (lambda q, k, v: q.shape[-1] ** 0.5, "you multiplied the scores by sqrt(d_k); divide them by it."),
    (lambda q, k, v: v.shape[-1] ** -0.5, "you scaled by sqrt(d_v), the size of the values; the "
     "scale is 1 / sqrt(d_k)."),
    *((lambda q, k, v, axis=axis: q.shape[axis] ** -0.5, WRONG_AXIS) for axis in (1, -2)),
    (lambda q, k, v: k.shape[-2] ** -0.5, "you scaled by sqrt(n_k), the number of keys; the scale "
     "is 1 / sqrt(d_k)."),
]
_ATTENTION_MISTAKES = [
    *(Mistake(_attention(scale=scale), hint) for scale, hint in _SCALES),
    *(Mistake(_attention(weights), "the softmax ran over the queries (dim=-2); each query's weights "
              "over the keys (dim=-1) must sum to one.")
      for weights in (lambda s, m: _masked(s, m).softmax(-2).nan_to_num(0.0),
                      lambda s, m: _masked(s, m).softmax(-2))),
    Mistake(_attention(lambda s, m: _masked(s, ~m).softmax(-1).nan_to_num(0.0)),
            "the mask is inverted: True means 'may attend'; fill the other keys."),
    Mistake(_attention(lambda s, m: s.softmax(-1)), "the mask was not applied: every query attends "
            "to every key. Fill the scores where the mask is False with -inf."),
    Mistake(_attention(lambda s, m: _masked(s, m, 0.0).softmax(-1)), "masked scores were set to 0, "
            "and exp(0) = 1 still gives them weight: set them to -inf."),
    Mistake(_weights_scaled, "your weights do not sum to one: 1/sqrt(d_k) divides the scores, "
            "before the softmax, not the weights after it."),
    Mistake(lambda q, k, v, mask: _attention()(q, k, k, mask), "the output mixes the keys; it must "
            "mix the values: output = weights @ v."),
    Mistake(_attention(lambda s, m: _masked(s, m, -1e9).softmax(-1)), EMPTY_ROW),
    Mistake(lambda *args: scaled_dot_product_attention(*args)[::-1], "you returned (weights, "
            "output); the order is (output, weights), as in ah.scaled_dot_product_attention."),
    *(Mistake(_attention(weights), "your weights are log-probabilities: log_softmax gives ln a, "
              "-inf on every masked key and negative elsewhere. Use torch.softmax.")
      for weights in (lambda s, m: _masked(s, m).log_softmax(-1),
                      lambda s, m: _masked(s, m).log_softmax(-1).nan_to_num(0.0),
                      lambda s, m: _masked(s, m).log_softmax(-1).nan_to_num(0.0, neginf=0.0))),
    Mistake(_attention(lambda s, m: _masked(s, m).softmax(-1)), FULLY_MASKED),
    Mistake(_attention(lambda s, m: _normalised(_masked(s, m).exp()).nan_to_num(0.0)), "scores in "
            "the 1000s overflowed: exp(1000) is inf, and inf / inf is NaN. Subtract each row's "
            "maximum before exp, or use torch.softmax."),
    *(Mistake(_attention(lambda s, m, e=e: _normalised(e(s) * m).nan_to_num(0.0)), MASKED_AFTER)
      for e in (lambda s: s.softmax(-1), lambda s: (s - s.amax(-1, keepdim=True)).exp())),
    Mistake(_attention(lambda s, m: s.softmax(-1) * m), "the masked keys were zeroed after the "
            "softmax and the row was not renormalised: the allowed keys' weights no longer sum to "
            "one. Which score makes a forbidden key's exp exactly 0?"),
    Mistake(_attention(_indexed), BOOL_INDEX),   # raises on case 2; its hint is an error hint
]


@exercise("query_key_value.attention", "scaled dot-product attention with a mask", hints=(
    "Four steps: scores q . k_j scaled by 1/sqrt(d_k); masked keys get -inf; a softmax over the "
    "keys; the weighted sum of the values. A query with no allowed key reads nothing (zeros).",
    "Which axes of k must swap for q @ k to give (..., n_q, n_k)? Which score gets weight exactly "
    "0 after the softmax? What does the softmax of an all -inf row give, and what must it read?",
    "scores = ...                                     # (..., n_q, n_k), scaled by 1/sqrt(d_k)\n"
    "scores = scores.masked_fill(..., float('-inf'))  # the keys the mask forbids\n"
    "weights = ...                                    # softmax over the keys, NaN (no key) -> 0\n"
    "return weights @ v, weights                      # (..., n_q, d_v), (..., n_q, n_k)"))
def check_attention(attention: Callable) -> CheckResult:
    """``attention(q, k, v, mask) -> (output, weights)``, as ``ah.scaled_dot_product_attention``."""
    cases = _attention_cases()
    result = check_function(
        attention, scaled_dot_product_attention, cases, what="attention", same_dtype=True,
        output_names=("the output", "the weights"), mistakes=_ATTENTION_MISTAKES, nan_hint=FULLY_MASKED,
        error_hints=[("must match the size of tensor", TRANSPOSE_ALL),
                     ("Expected size for first two dimensions", TRANSPOSE_ALL),
                     ("The shape of the mask", BOOL_INDEX)])
    if result:      # one backward into q, k and v, on case 3 (float64, heads, no empty row)
        modules = (_Attend(f, cases[2]) for f in (attention, scaled_dot_product_attention))
        try:
            wrong = gradient_mismatch(*modules, lambda module, q: module(q), cases[2]["q"])
        except RuntimeError as error:
            return CheckResult(False, IN_PLACE if "inplace" in str(error) else f"backward: {error}")
        if wrong:
            return CheckResult(False, DETACHED.format(", ".join("q" if n == "x" else n for n in wrong)))
        return CheckResult(True, result.message.rstrip(".") + ", and so do its gradients.")
    found = result.message.split("\nHint: ")[0]                    # the mismatch, without its hint
    if TRANSPOSE_ALL in result.message:   # a transposed mask raises the error a batched k.T raises
        q, k, v, mask = cases[0].values()
        with contextlib.suppress(Exception):
            if torch.allclose(attention(q, k, v, mask.mT)[0], _attention()(q, k, v, mask)[0]):
                return CheckResult(False, f"{found}\nHint: {MASK_TRANSPOSED}")
    named = "\nHint: " in result.message and FULLY_MASKED not in result.message
    if "\nHint: " not in result.message and f"on case 6 of {len(cases)} " in result.message:  # padding
        seen, padded = cases[5]["mask"].any(-1), cases[5].values()    # seen (2, 6): rows with a key
        with contextlib.suppress(Exception):
            if torch.allclose(attention(*padded)[0][seen], _attention()(*padded)[0][seen], atol=1e-5):
                return CheckResult(False, f"{found}\nHint: {EMPTY_ROW}")
    if f"on case {len(cases)} of {len(cases)} " not in result.message or named:  # not only the 1000s
        return result
    return CheckResult(False, f"{found}\nHint: {LARGE_SCORES}")


class _Attend(torch.nn.Module):  # attention on one case, k and v its parameters: a backward reaches all
    def __init__(self, attention: Callable, case: dict):
        super().__init__()
        self.attention, self.mask = attention, case["mask"]
        self.k, self.v = (torch.nn.Parameter(case[name].clone()) for name in "kv")

    def forward(self, q):
        return torch.cat([t.flatten() for t in self.attention(q, self.k, self.v, self.mask)])


NEXT_WEIGHT = 0.9   # each token must put at least this much of its attention on the next token
NOT_SQUARE = ("torch.linalg.inv needs a square matrix, and X is (n, d_model). You need only a "
              "right inverse M, with X M = I: hint 2 names a torch.linalg function for it.")
MIXED_DTYPES = ("two tensors of different dtypes met in one product: X is float64 in this case, and "
                "torch.eye(n) is float32 by default. Build it with dtype=X.dtype.")
SHAPES = ("a product in your function got shapes that do not fit. n and d_model change between cases: "
          "take n from X.shape[0]. A right inverse of X is (d_model, n); W_Q, W_K: (d_model, d_k).")
SYMMETRIC = ("your scores are symmetric ({}): s_ij = s_ji, so i likes j as much as j likes i. "
             "W_K = W_Q and W_K = -W_Q both do that. The next-token relation needs s_i,i+1 large "
             "and s_i+1,i small: use two different matrices, K a shifted copy of Q.")


def _relation_cases() -> list[dict]:
    g = seeded(123)
    return [{"X": torch.eye(4)}, {"X": torch.eye(5, 8)},                  # one-hot, d_model > n
            {"X": torch.randn(5, 5, generator=g)},                         # dense embeddings
            {"X": torch.randn(3, 6, generator=g, dtype=torch.float64)},
            {"X": torch.randn(size(g, 3, 8), 8, generator=g)},             # random length
            {"X": torch.randn(200, 256, generator=g, dtype=torch.float64)}]  # long: c grows with n


def _verdict(X: torch.Tensor, got) -> str | None:  # noqa: N803 - None if got = (W_Q, W_K) passes
    n, d_model = X.shape
    if not isinstance(got, tuple) or len(got) != 2:
        what = f"{len(got)} values" if isinstance(got, tuple) else type(got).__name__
        return f"it should return a pair (W_Q, W_K), but returned {what}."
    for name, W in zip(("W_Q", "W_K"), got, strict=True):                  # noqa: N806
        if not isinstance(W, torch.Tensor) or W.dim() != 2 or W.shape[0] != d_model:
            shape = tuple(W.shape) if isinstance(W, torch.Tensor) else type(W).__name__
            return f"{name} must be a (d_model, d_k) = ({d_model}, d_k) tensor, got {shape}."
    W_Q, W_K = (W.double() for W in got)                                    # noqa: N806
    if W_Q.shape[1] != W_K.shape[1]:
        return f"W_Q has {W_Q.shape[1]} columns and W_K {W_K.shape[1]}: they need the same size d_k."
    A = weights(X.double(), W_Q, W_K)                                       # noqa: N806
    if not torch.isfinite(A).all():
        return "the attention weights contain NaN or inf: are your projections finite?"
    i = torch.arange(n)
    on_next = A[i, (i + 1) % n]
    if bool((on_next >= NEXT_WEIGHT).all()):
        return None
    top = A.topk(2, dim=-1).values
    strongest = torch.where(top[:, 0] - top[:, 1] > 1e-9, A.argmax(-1), -1)  # -1: a tie
    more, weakest = (f", ... ({n} tokens)" if n > 6 else ""), int(on_next.argmin())
    tops = ", ".join(f"{a}->{'tie' if b < 0 else b}" for a, b in enumerate(strongest[:6].tolist()))
    where = (f"strongest key of each token: {tops}{more}; weight on the next token: "
             f"{', '.join(f'{w:.2f}' for w in on_next[:6].tolist())}{more}, smallest "
             f"{on_next[weakest]:.2f} (token {weakest})")
    raw = (X.double() @ W_Q) @ (X.double() @ W_K).T                          # (n, n): Q K^T
    sqrt_d_k = f"sqrt(d_k) = {math.sqrt(W_Q.shape[1]):.2f}"
    if torch.allclose(W_Q, W_K):
        why = SYMMETRIC.format("W_Q = W_K")
    elif bool((on_next[:-1] >= NEXT_WEIGHT).all()):
        why = "the last token must attend to the first (the relation wraps around)."
    elif bool((strongest == (i + 1) % n).all()):
        why = ("every token's strongest key is the next one, but not strongly enough. If its score "
               "leads the n - 1 others by a gap, its weight is 1 / (1 + (n - 1) e^-gap). For 0.9, "
               f"gap >= ln(9 (n - 1)) = {math.log(9 * (n - 1)):.2f} (n = {n}): scale both projections.")
        if n > 8:  # the long last case, reached only once every shorter case passed
            why += (" Every shorter case passed: the gap needed grows with n, and so does the "
                    f"{sqrt_d_k} dividing the scores. c must grow with n.")
        elif bool((torch.softmax(raw, dim=-1)[i, (i + 1) % n] >= NEXT_WEIGHT).all()):  # no 1/sqrt(d_k)
            why += (" Without the 1/sqrt(d_k) your Q K^T would pass; the scores are divided by "
                    f"{sqrt_d_k}, so c must give the gap after that division.")
    elif n > 1 and bool((strongest == (i - 1) % n).all()):
        why = "every token attends to the PREVIOUS token: the shift goes the wrong way."
    elif bool((strongest == i).all()):
        why = "every token attends to itself: the keys must be shifted by one position."
    elif torch.allclose(raw, raw.T, rtol=1e-6, atol=1e-6 * float(raw.abs().max())):
        why = SYMMETRIC.format("Q K^T equals its transpose")
    else:
        why = "the pattern is not the next-token relation."
    return f"{where}. {why[0].upper()}{why[1:]}"


@exercise("query_key_value.asymmetric_relation", "choose W_Q, W_K: attend to the next token", hints=(
    "The scores are S = X W_Q (X W_K)^T / sqrt(d_k). S must be large at (i, i+1), small "
    "elsewhere. That S is not symmetric, so W_Q and W_K must differ.",
    "Forget X: what (n, n) matrix Q K^T peaks at column i + 1 in every row i (the last row at column "
    "0)? Which simple Q and K give it? Then Q = X W_Q: which matrix M right of X undoes X, X M = I "
    "(torch.linalg.pinv)? Last: by how much must the next token's score lead the n - 1 others for 0.9?",
    "n = X.shape[0]\n"
    "P = ...             # (n, n) cyclic shift: P[i, i+1] = 1, P[n-1, 0] = 1, 0 elsewhere\n"
    "c = ...             # d_k = n: the next token's weight, as a function of c? >= 0.9\n"
    "W_Q = ...           # (d_model, n): c times a right inverse of X (torch.linalg.pinv),\n"
    "                    # so that Q = X W_Q = c I\n"
    "return W_Q, ...     # W_K with K = X W_K = c P^T, so Q K^T = c^2 P"))
def check_asymmetric_relation(next_token_projections: Callable) -> CheckResult:
    """``next_token_projections(X (n, d_model)) -> (W_Q, W_K)``: each token attends to the next."""
    def judged(X):  # noqa: N803 - None, 0 (the "reference") for a right pair, else Refused(why)
        got = next_token_projections(X.clone())
        if got is None or (problem := _verdict(X, got)) is None:
            return None if got is None else torch.zeros(())
        eye = torch.eye(*X.shape, dtype=X.dtype)      # one-hot embeddings
        with contextlib.suppress(Exception):          # only a hint: any failure means "no"
            if not torch.equal(X, eye) and _verdict(eye, next_token_projections(eye)) is None:
                problem += (" Your projections work for one-hot embeddings, not dense ones: which M, "
                            "with X M = I (a right inverse of X), undoes X?")
        raise Refused(problem)

    cases = _relation_cases()
    result = check_function(judged if callable(next_token_projections) else next_token_projections,
                            lambda X: torch.zeros(()), cases, what="next_token_projections",  # noqa: N803
                            error_hints=[("square matrices", NOT_SQUARE), ("same dtype", MIXED_DTYPES),
                                         ("cannot be multiplied", SHAPES)])
    return result if not result else CheckResult(
        True, f"Passed: on all {len(cases)} cases every token puts at least {NEXT_WEIGHT} of its "
              "attention on the next one.")

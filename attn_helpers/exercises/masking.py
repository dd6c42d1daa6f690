"""Notebook 05's checkers: packed documents, a prefix LM's mask, a rolling cache."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from ..masks import sliding_window_mask
from .core import CheckResult, Mistake, Refused, check_function, seeded, size
from .workflow import exercise


def _tensor(name: str, value, kind: str) -> torch.Tensor:
    """``value`` as float64 if it is a tensor of ``kind`` ("bool" mask or "integer" positions)."""
    if not isinstance(value, torch.Tensor):
        raise Refused(f"{name} must be a tensor, got {type(value).__name__}.")
    if kind == "bool" and value.dtype != torch.bool:
        additive = value.is_floating_point() and bool(((value == 0) | (value <= -1e4)).all())
        raise Refused(f"{name} must be a bool tensor (True = may attend), got dtype {value.dtype}. "
                      "F.scaled_dot_product_attention adds a float mask to the scores: "
                      + ("yours is additive; use mask == 0." if additive else "0 and 1 hide nothing."))
    if kind == "integer" and (value.is_floating_point() or value.dtype == torch.bool):
        raise Refused("the positions index a table of position vectors: they must be an integer "
                      f"tensor, got dtype {value.dtype}.")
    return value.double()


def _as_float64(pack_documents: Callable) -> Callable:
    """pack_documents' answer: a bool mask, then integer positions; both compared as float64."""
    def wrapped(lengths):
        out = pack_documents(lengths)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            return out
        return (_tensor("the first output, the mask", out[0], "bool"),
                _tensor("the positions", out[1], "integer"))
    return wrapped if callable(pack_documents) else pack_documents


def _pack(lengths: torch.Tensor, flaw: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed documents' ``(n, n)`` mask and ``(n,)`` positions as float64; ``flaw``: one mistake."""
    n = int(lengths.sum())
    i = torch.arange(n)
    ends = torch.cumsum(lengths, 0)                                      # one past each document
    doc = torch.searchsorted(ends, i, right=flaw != "boundary")          # (n,) document of token i
    starts = ends - lengths                                              # each document's first
    positions = {"not_restarted": i, "from_one": i - starts[doc] + 1, "minus_end": i - ends[doc],
                 "count_down": ends[doc] - 1 - i, "count_down_from_length": ends[doc] - i,
                 "modulo_first": i % lengths[0], "doc_index": doc,
                 "second_only": i - starts[doc.clamp(max=1)]}.get(flaw, i - starts[doc])
    same = doc[:, None] == doc[None, :]
    causal = i[None, :] <= i[:, None]
    mask = {"causal_only": causal, "strict": same & (i[None, :] < i[:, None]), "no_causal": same,
            "one_ahead": same & (i[None, :] <= i[:, None] + 1), "transposed": (same & causal).T,
            "inverted": ~(same & causal), "or": same | causal}.get(flaw, same & causal)
    return mask.double(), positions.double()


_COUNT_DOWN = "the positions count down to each document's end; they count up from 0 at its start."
_STRICT = ("no token sees itself: you wrote j < i. Query i's own key is part of its past, so the causal "
           "rule is j <= i.")
_AHEAD = ("each token sees the next one: you wrote j <= i + 1, section 3's off-by-one leak. The next "
          "token is the one predicted: the rule is j <= i.")
_PACK_MISTAKES = [   # (the flaw of _pack, its hint)
    ("causal_only", "the documents see each other: a token sees the earlier documents of the row. "
     "Each token must see its own document alone: AND 'same document'."),
    ("no_causal", "each token sees its own document's later tokens: the mask also needs j <= i."),
    ("strict", _STRICT),
    ("one_ahead", _AHEAD),
    ("boundary", "each document's first token was put in the previous document: a boundary is off "
     "by one. Token i belongs to the first document whose end (one past its last token) exceeds i."),
    ("or", "joined with OR (|): a key must be in the token's document AND not after it (&)."),
    ("transposed", "the mask is transposed: rows are queries i, columns keys j <= i."),
    ("inverted", "the mask is inverted: True means 'may attend'."),
    ("not_restarted", "the positions run on across the row: each document starts at position 0."),
    ("from_one", "off by one: each document's positions start at 1; the first token sits at 0."),
    ("minus_end", "the positions are negative: you subtracted each document's end, not its start."),
    ("count_down", _COUNT_DOWN),
    ("modulo_first", "positions repeat every lengths[0] tokens: subtract each token's document start."),
    ("count_down_from_length", _COUNT_DOWN),
    ("doc_index", "the positions are document numbers: count the earlier tokens of each document."),
    ("second_only", "only the second document restarts at 0: subtract each token's document start."),
]


@exercise("masking.pack_documents", "documents packed into one row: their mask and positions",
          hints=(
    "Pretraining packs whole documents into one row, with no padding. Each token must see only "
    "the earlier tokens of its own document, and count its position from its document's start.",
    "Find each token's document: document d runs from its start (the sum of the lengths before it) "
    "to its end. Two tokens may meet when they share a document AND the key is not after the "
    "query. A position is the token's index minus its document's start.",
    "n = int(lengths.sum())\n"
    "i = torch.arange(n)\n"
    "doc = ...                          # (n,): the document of each token\n"
    "starts = torch.cumsum(lengths, 0) - lengths   # (d,): each document's first token\n"
    "mask = ...                         # (n, n): same document AND j <= i\n"
    "positions = ...                    # (n,): 0 at each document's first token\n"
    "return mask, positions"))
def check_pack_documents(pack_documents: Callable) -> CheckResult:
    """``pack_documents(lengths (d,) int) -> (mask (n, n) bool, positions (n,) int)``."""
    cases = [{"lengths": torch.tensor(lengths)} for lengths in
             ([3, 5], [1, 4, 2], [6], [2, 1, 1, 3], [1], [4, 4, 1])]
    return check_function(
        _as_float64(pack_documents), _pack, cases, what="pack_documents",
        output_names=("the mask", "the positions"),
        mistakes=[Mistake(partial(_pack, flaw=flaw), hint) for flaw, hint in _PACK_MISTAKES],
        error_hints=[("must match the size of tensor", "two tensors did not broadcast. Each token's "
                      "document is a (n,) vector; comparing it with itself needs one copy as a "
                      "column (n, 1) and one as a row (1, n).")])


def _prefix_lm(attention_mask, prefix_len, flaw: str | None = None) -> torch.Tensor:
    """The ``(b, 1, n, n)`` prefix-LM mask as float64; ``flaw``: one known mistake."""
    n = attention_mask.shape[-1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]             # queries, keys
    p = (prefix_len[:1] if flaw == "first_row" else prefix_len)[:, None, None, None]   # (b, 1, 1, 1)
    causal = {"strict": j < i, "one_ahead": j <= i + 1}.get(flaw, j <= i)
    real_count = attention_mask.cumsum(-1)[:, None, None, :]               # real tokens up to key j
    in_prefix = {"query": i < p, "inclusive": j <= p, "real_count": real_count <= p}.get(flaw, j < p)
    real_key = attention_mask.bool()[:, None, None, :]                     # (b, 1, 1, n)
    rule = causal | in_prefix                                             # (b, 1, n, n)
    right = rule & real_key
    allowed = {"causal_only": causal & real_key, "and": causal & in_prefix & real_key,
               "no_padding": rule, "or_padding": rule | real_key, "transposed": right.transpose(-2, -1),
               "inverted": ~right}.get(flaw, right)
    return allowed.masked_fill((attention_mask == 0)[:, None, :, None], 0).double()  # pad rows: 0


_PREFIX_MISTAKES = [   # (the flaw of _prefix_lm, its hint)
    ("causal_only", "the prefix is read left to right: its tokens see only earlier ones. A prefix "
     "token sees the whole prefix: OR 'key j lies in the prefix' into the causal rule."),
    ("query", "the prefix's tokens see the whole row, the tokens to predict included: you tested the "
     "query, i < prefix_len. The prefix is a set of keys: test key j."),
    ("inclusive", "off by one: the prefix's tokens see the token after it: it is 0..prefix_len - 1."),
    ("and", "the rules were joined with AND: the tokens after the prefix see only the prefix. A key "
     "is visible when it is not after the query OR lies in the prefix."),
    ("first_row", "every row got the first row's prefix length: each row has its own. Give "
     "prefix_len a shape that broadcasts over (b, 1, n, n)."),
    ("strict", _STRICT),
    ("one_ahead", _AHEAD),
    ("no_padding", "real tokens see pads: the padding is missing, went on the query axis (b, 1, n, 1), "
     "or was lost to precedence (& binds tighter than |: bracket the OR). It must hide pad keys: "
     "the last axis, (b, 1, 1, n)."),
    ("or_padding", "the padding was joined with OR (|): every real key became visible. A key must be "
     "real AND pass the prefix-LM rule (&)."),
    ("real_count", "you counted the prefix in real tokens; prefix_len counts positions, pads included: "
     "a left-padded row's prefix holds its pads too."),
    ("transposed", "the mask is transposed: rows are queries i, columns keys j."),
    ("inverted", "the mask is inverted: True means 'may attend' (nn.MultiheadAttention reverses it)."),
]


def _on_real_queries(prefix_lm_mask: Callable) -> Callable:
    """A bool ``(b, 1, n, n)`` mask, compared on the rows of real queries (pad rows unchecked)."""
    def wrapped(attention_mask, prefix_len):
        mask = prefix_lm_mask(attention_mask, prefix_len)
        if mask is None:
            return None
        mask = _tensor("the mask", mask, "bool")
        b, n = attention_mask.shape
        why = {(b, n, n): "Scores with heads are (b, h, n, n): without the head axis, the mask's "
               "batch axis meets the heads.", (b, 1, 1, n): "That is the padding mask alone: each "
               "query needs its own row."}
        if mask.shape != (b, 1, n, n):
            raise Refused(f"the mask must be (b, 1, n, n) = {(b, 1, n, n)}, got {tuple(mask.shape)}. "
                          + why.get(tuple(mask.shape), "Its axes: batch, 1 (heads), queries, keys."))
        return mask.masked_fill((attention_mask == 0)[:, None, :, None], 0)
    return wrapped if callable(prefix_lm_mask) else prefix_lm_mask


@exercise("masking.prefix_lm_mask", "a prefix LM's mask over a padded batch", hints=(
    "A prefix LM reads its prompt, the prefix, in both directions, then predicts the rest left to "
    "right. Which keys may a prefix token see? A token after the prefix? And the pads?",
    "Query i sees key j when (j <= i OR j < the row's prefix_len) AND token j is real. Build each "
    "rule from the index grids i (queries, a column) and j (keys, a row). Each row has its own "
    "prefix length: which shape broadcasts it over (b, 1, n, n)?",
    "n = attention_mask.shape[-1]\n"
    "i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]   # (n, 1) queries, (1, n) keys\n"
    "in_prefix = ...                    # (b, 1, 1, n): key j lies in its row's prefix\n"
    "real_key = ...                     # (b, 1, 1, n): True at real tokens, on the key axis\n"
    "return ((j <= i) | in_prefix) & real_key      # (b, 1, n, n)"))
def check_prefix_lm_mask(prefix_lm_mask: Callable) -> CheckResult:
    """``prefix_lm_mask(attention_mask (b, n) int, 1 = real, prefix_len (b,) int) -> mask
    (b, 1, n, n) bool``: causal OR key in the row's prefix, AND a real key; pad rows not checked."""
    g = seeded(5)
    b, n = size(g, 2, 4), size(g, 3, 9)
    lengths = torch.randint(1, n + 1, (b,), generator=g).tolist()
    cases = [([[1] * 6], [2]), ([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1] * 6], [3, 4, 0]),
             ([[1, 1, 1, 0, 0], [1] * 5], [5, 1]), ([[1]], [1]),
             ([[0, 0, 1, 1, 1, 1, 1], [1] * 7], [4, 2]),
             ([[1] * m + [0] * (n - m) if r % 2 == 0 else [0] * (n - m) + [1] * m   # right, left
               for r, m in enumerate(lengths)], torch.randint(0, n + 1, (b,), generator=g).tolist())]
    return check_function(
        _on_real_queries(prefix_lm_mask), _prefix_lm,
        [{"attention_mask": torch.tensor(m), "prefix_len": torch.tensor(p)} for m, p in cases],
        what="prefix_lm_mask", output_names=("the mask",),
        mistakes=[Mistake(partial(_prefix_lm, flaw=flaw), hint) for flaw, hint in _PREFIX_MISTAKES],
        error_hints=[("must match the size of tensor", "two tensors did not broadcast: give the causal "
                      "rule (n, n), the padding (b, n) and prefix_len (b,) the axes they lack.")])


_UNSEEN = ("off by one: until the ring was full, the query did not see the key just written: after "
           "the write, how many slots hold keys at step t?")
_WRONG = [   # (hint, the flaw of _ring_step that makes the mistake)
    ("the query attended to all w slots before the ring was full; the unwritten ones hold garbage.",
     {"visible": lambda t, w: range(w)}),
    ("the ring never changed once full: a slice at slot t >= w is empty, so the write was lost. "
     "Token t goes to token t - w's slot.", {"lost_past_end": True}),
    ("off by one: the query attended before the new key was written, so token t missed itself: "
     "write first, then attend.", {"early": "missing"}),
    (_UNSEEN, {"visible": lambda t, w: range(min(t, w))}),
    (_UNSEEN, {"visible": lambda t, w: range(max(1, min(t, w)))}),
    ("off by one: the query saw w + 1 keys, the ring's old contents and the new key: overwrite "
     "token t - w's slot first, then attend.", {"early": "extra"}),
    ("off by one: once the ring was full, the query skipped the oldest slot and saw w - 1 keys; "
     "a full ring holds exactly the window's w keys.",
     {"visible": lambda t, w: [s for s in range(min(t + 1, w)) if t < w - 1 or s != (t + 1) % w]}),
    ("after the ring wrapped, the query saw only the slots up to the newest one; once the ring "
     "is full, every slot holds a key of the window.", {"visible": lambda t, w: range(t % w + 1)}),
    ("the new key and value went one slot too far: token t takes token t - w's slot.",
     {"slot": lambda t, w: (t + 1) % w}),
    ("off by one: token t went one slot too far, and the query read one slot more, so it read an "
     "unwritten slot. Token t takes token t - w's slot.",
     {"slot": lambda t, w: (t + 1) % w, "visible": lambda t, w: range(min(t + 2, w))}),
    ("the new key and value went one slot back: token 0 went to the last slot, and the query read "
     "garbage in slot 0. Token t takes token t - w's slot.", {"slot": lambda t, w: (t - 1) % w}),
    ("the ring used only w - 1 of its w slots (slot t % (w - 1)): the window lost a key. Token t "
     "takes token t - w's slot.", {"slot": lambda t, w: t % (w - 1)}),
    ("once the ring was full, you overwrote the newest key, not the one leaving the window: "
     "token t takes token t - w's slot.", {"slot": lambda t, w: min(t, w - 1)}),
    ("after the ring wrapped, token t overwrote a key still in the window, one slot past token t - w's.",
     {"slot": lambda t, w: t if t < w else (t + 1) % w}),
    ("the key was written but not the value: v_t goes into the same slot.", {"write_v": False}),
    ("the value cache got the key: write v_t, not k_t, into v_cache.", {"k_as_v": True}),
    ("the scores are not scaled: divide by sqrt(d_k), as notebook 02's attention does.", {"scale": 1.0}),
    ("is_causal=True hid every slot but the first: torch anchors its causal mask top-left. The ring "
     "holds no future key: attend to every filled slot, no mask.", {"top_left": True}),
]


def _ring_step(*, slot: Callable = lambda t, w: t % w, visible: Callable | None = None,
               early: str | None = None, lost_past_end: bool = False, write_v: bool = True,
               k_as_v: bool = False, scale: float | None = None, top_left: bool = False) -> Callable:
    """A rolling-cache step with one known mistake (all off: right); ``early``: attends first."""

    def step(k_cache, v_cache, t, q_t, k_t, v_t):
        w = k_cache.shape[-2]
        old = list(range(min(t, w)))
        keys = torch.cat([k_cache[..., old, :], k_t], dim=-2)       # before writing: the old
        values = torch.cat([v_cache[..., old, :], v_t], dim=-2)     # filled slots and the new
        if not (lost_past_end and t >= w):
            k_cache[..., slot(t, w), :] = k_t[..., 0, :]
            if write_v:
                v_cache[..., slot(t, w), :] = (k_t if k_as_v else v_t)[..., 0, :]
        if early == "missing":
            keys, values = keys[..., :-1, :], values[..., :-1, :]
        elif early is None:
            slots = list(visible(t, w) if visible is not None else range(min(t + 1, w)))
            keys, values = k_cache[..., slots, :], v_cache[..., slots, :]
            if top_left:
                return F.scaled_dot_product_attention(q_t, keys, values, is_causal=True)
        if keys.shape[-2] == 0:
            return torch.zeros_like(v_t)
        c = 1 / math.sqrt(q_t.shape[-1]) if scale is None else scale
        return torch.softmax(q_t @ keys.transpose(-2, -1) * c, dim=-1) @ values

    return step


def _ring_cases() -> list[dict]:
    """q, k, v and two caches of ``w`` garbage slots: n > 2w, w = 1, w >= n, and a random shape."""
    g = seeded(52)
    rb, rh, rk, rv = (size(g, 1, 4) for _ in range(4))
    rw = size(g, 2, 4)
    f32, f64 = torch.float32, torch.float64

    def randn(*size, dtype, scale=1.0):
        return scale * torch.randn(*size, generator=g, dtype=dtype)

    return [{"q": randn(b, h, n, d_k, dtype=dt), "k": randn(b, h, n, d_k, dtype=dt),
             "v": randn(b, h, n, d_v, dtype=dt), "k_cache": randn(b, h, w, d_k, dtype=dt, scale=100.0),
             "v_cache": randn(b, h, w, d_v, dtype=dt, scale=100.0)}
            for b, h, n, w, d_k, d_v, dt in [
                (1, 1, 8, 3, 4, 4, f64), (2, 3, 11, 4, 4, 3, f32), (2, 2, 5, 1, 3, 2, f64),
                (1, 2, 4, 6, 4, 5, f32), (rb, rh, 2 * rw + 3, rw, rk, rv, f32)]]


def _run_steps(step: Callable) -> Callable:
    """``step``'s outputs for t = 0..n-1 on copies of the caches, refused if it misuses them."""

    def run(q, k, v, k_cache, v_cache):
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
        n, w = q.shape[-2], k_cache.shape[-2]
        outputs = []
        for t in range(n):
            new, at = slice(t, t + 1), f"at step t={t} (w={w} slots)"
            before = k_cache.clone(), v_cache.clone()
            try:
                out = step(k_cache, v_cache, t, q[..., new, :], k[..., new, :], v[..., new, :])
            except (IndexError, ValueError, RuntimeError) as exc:
                raise type(exc)(f"{at}: {exc}") from exc
            if out is None:
                return None
            moved = max(int((cache != copy).flatten(end_dim=-3).any(0).any(-1).sum())
                        for cache, copy in zip((k_cache, v_cache), before, strict=True))
            if moved == 0 and t < w:                      # the ring is not full: a slot must change
                raise Refused(f"{at} neither cache changed.\nHint: the caches were written on a copy "
                              "(clone, torch.cat, a new name): write into k_cache and v_cache in place.")
            if moved > 1:
                raise Refused(f"{at} {moved} slots of a cache changed. A rolling buffer writes one slot "
                              "per step, where the key that just left the window was: no shifting.")
            if not isinstance(out, torch.Tensor) or out.shape != v[..., new, :].shape:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise Refused(f"{at} rolling_cache_step returned {got}. A step returns token t's "
                              f"output only: (b, h, 1, d_v) = {tuple(v[..., new, :].shape)}.")
            outputs.append(out)
        return torch.cat(outputs, dim=-2)

    return run


@exercise("masking.rolling_cache_step", "a rolling-buffer KV cache for a sliding window", hints=(
    "The cache has w slots and the window holds w keys. When token t arrives, which key leaves "
    "the window, and in which slot was it stored? Before the ring is full, which slots hold keys?",
    "Token t - w leaves as token t enters: number the slots so that a token's slot follows from "
    "its position alone. Until the ring is full, how many slots hold keys? The keys need not be "
    "in time order: attention's weighted sum is the same in any order.",
    "w = k_cache.shape[-2]                     # the ring's slots, one per key of the window\n"
    "s = ...                                   # token t's slot\n"
    "k_cache[:, :, s] = k_t[:, :, 0]           # in place, (b, h, d_k)\n"
    "v_cache[:, :, s] = v_t[:, :, 0]           # (b, h, d_v)\n"
    "filled = ...                              # how many slots hold keys\n"
    "out, _ = ah.scaled_dot_product_attention(q_t, k_cache[:, :, :filled], v_cache[:, :, :filled])\n"
    "return out                                # (b, h, 1, d_v)"))
def check_rolling_cache_step(rolling_cache_step: Callable) -> CheckResult:
    """``rolling_cache_step(k_cache (b, h, w, d_k), v_cache (b, h, w, d_v), t, q_t, k_t, v_t) ->
    (b, h, 1, d_v)``; over t = 0..n-1 it must equal sliding-window causal attention."""
    return check_function(
        _run_steps(rolling_cache_step) if callable(rolling_cache_step) else rolling_cache_step,
        lambda q, k, v, k_cache, v_cache: scaled_dot_product_attention(
            q, k, v, sliding_window_mask(q.shape[-2], k_cache.shape[-2]))[0],
        _ring_cases(), what="rolling_cache_step", output_names=("the outputs of steps 0..n-1",),
        mistakes=[Mistake(_run_steps(_ring_step(**flaw)), hint) for hint, flaw in _WRONG],
        nan_hint="unwritten slots must not enter the softmax: a garbage score far above the real ones "
                 "takes the max, the real weights round to 0, and zeroing, renormalising gives 0 / 0."
                 " Attend only to the filled slots (slice them): a NaN left in an unwritten slot of V "
                 "reaches the output even through a zero weight.",
        error_hints=[("out of bounds for dimension",
                      "the cache has w slots, so token t cannot go to slot t once t >= w: it goes to "
                      "token t - w's slot, where the key that just left the window was stored."),
                     ("must hold at least one key",
                      "off by one: at step t = 0 the query had no key, so token t missed itself: it "
                      "attended before the write, or the filled-slot count left the newest key out."),
                     ("expand", "k_t is (b, h, 1, d_k) and one slot of the cache, k_cache[:, :, s], "
                                "is (b, h, d_k): write k_t[:, :, 0] there (and v_t[:, :, 0]).")])

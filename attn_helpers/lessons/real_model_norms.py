"""Notebook 09 beyond raw weights: value-weighted norms (Kobayashi et al., 2020) and the "it"
study, measured for :func:`.real_model.analyse` and stated by :func:`.real_model.claims` (which
import this module when they run: it reads their building blocks)."""

from __future__ import annotations

import torch

from ..pretrained import Encoder
from .real_model import (
    PREVIOUS_TOKEN_MIN,
    Analysis,
    Attention,
    offset_scores,
    sink_shares,
    top_heads,
)
from .real_model_studies import (
    PASS_RIGHT_FLIPS,
    coreference,
    row_shares,
    run_value_norms,
    sign_test,
    value_vector_norms,
)

__all__ = ["beyond_weights", "cls_vector_ratio", "claims_beyond_weights"]

NORM_CLS_MAX = 0.2          # weighted by ||f(x_j)||, [CLS] gets less than a fifth in every layer
NOUNS_MIN = 0.5             # the head that reads the nouns from "it" puts > half its weight there
CLS_VECTOR_MAX = (0.5, 0.15)  # ||f(x_CLS)|| / median ||f(x_j)||: layer 1, layers 2-6 (mean of heads)
RISING_CLS_MIN = 0.6        # the heads whose previous-token score rises under norms: weight on [CLS]
RISING_VECTOR_MAX = 0.1     # ... and their ||f(x_CLS)|| / median ||f(x_j)||
FAMILYWISE = 0.05           # the "it" study's sign test, Bonferroni-corrected for the 72 heads


def beyond_weights(enc: Encoder, att: Attention, data: dict) -> dict:
    weights, norms = run_value_norms(enc, att.input_ids, att.mask)
    if not torch.allclose(weights, att.weights, atol=1e-6):
        raise AssertionError("run_value_norms ran other weights than run_attention")
    shares = row_shares(norms)
    return dict(norms=norms,
                cls_norm_share=sink_shares(shares, att.mask, att.input_ids, enc.cls_id),
                sep_norm_share=sink_shares(shares, att.mask, att.input_ids, enc.sep_id),
                previous_token_norm=offset_scores(shares, att.mask, -1),
                cls_vector_ratio=cls_vector_ratio(enc, att),
                coreference=coreference(enc, data["coreference"]))


def cls_vector_ratio(enc: Encoder, att: Attention) -> torch.Tensor:
    """``(L, h)``: ``||f_h(x_CLS)||`` over the median ``||f_h(x_j)||`` of the sentence's other
    real tokens (``[SEP]`` left out too), averaged over the sentences."""
    f = value_vector_norms(enc, att.input_ids, att.mask)        # (L, b, h, n)
    ids = att.input_ids
    ordinary = att.mask & (ids != enc.cls_id) & (ids != enc.sep_id)
    ratios = []
    for b in range(ids.shape[0]):
        cls = int((ids[b] == enc.cls_id).nonzero()[0, 0])
        ratios.append(f[:, b, :, cls] / f[:, b][..., ordinary[b]].median(dim=-1).values)
    return torch.stack(ratios).mean(dim=0)


def claims_beyond_weights(a: Analysis) -> dict[str, bool]:
    (cls_w, cls_n, sep_w, sep_n) = (x.mean(dim=1) for x in (  # (L,) each
        a.cls_share, a.cls_norm_share, a.sep_share, a.sep_norm_share))
    prev_l, prev_h, _ = top_heads(a.previous_token, 1)[0]
    co = a.coreference
    reader = divmod(int(co.on_nouns.argmax()), co.on_nouns.shape[1])
    ratio = a.cls_vector_ratio.mean(dim=1)                      # (L,) mean over heads
    rising = [(l, h) for l, h, _ in top_heads(a.previous_token_norm, 3)[1:]]
    p = sign_test(co.right, co.wrong)                            # (L, h), one-sided
    heads = co.right.numel()
    return {
        f"weighted by ||f(x_j)||, [CLS] gets less than {NORM_CLS_MAX} in every layer": bool(
            (cls_n < NORM_CLS_MAX).all()),
        "[CLS]'s share falls in every layer, by more than half in layers 2-5": bool(
            (cls_n < cls_w).all() and (cls_n[1:-1] < cls_w[1:-1] / 2).all()),
        f"||f(x_[CLS])|| is below {CLS_VECTOR_MAX[0]} of the median token's in layer 1, "
        f"below {CLS_VECTOR_MAX[1]} in layers 2-6 (mean of heads)": bool(
            ratio[0] < CLS_VECTOR_MAX[0] and (ratio[1:] < CLS_VECTOR_MAX[1]).all()),
        "[SEP]'s share RISES under norms in layers 2-5": bool((sep_n[1:-1] > sep_w[1:-1]).all()),
        f"the previous-token head stays one under norms (> {PREVIOUS_TOKEN_MIN})": bool(
            a.previous_token_norm[prev_l, prev_h] > PREVIOUS_TOKEN_MIN),
        f"no head flips the right way in {PASS_RIGHT_FLIPS} or more of the {co.pairs} pairs "
        "(the pass criterion)": bool((co.right < PASS_RIGHT_FLIPS).all()),
        f"no head's sign test across pairs is below {FAMILYWISE} after correcting for "
        f"{heads} heads": bool((p * heads >= FAMILYWISE).all()),
        f"one head puts > {NOUNS_MIN} of the weight of 'it' on the two nouns": bool(
            co.on_nouns.max() > NOUNS_MIN),
        "that head does not flip in more than half of the pairs": bool(
            co.pairs - co.right[reader] - co.wrong[reader] > co.pairs / 2),
        "on the first pair it weighs the first noun more, with either adjective": bool(
            (co.antecedent[0] > co.other[0])[reader] and (co.other[1] > co.antecedent[1])[reader]),
        f"the 2nd and 3rd previous-token heads under norms put > {RISING_CLS_MIN} of their weight "
        "on [CLS]": all(float(a.cls_share[lh]) > RISING_CLS_MIN for lh in rising),
        f"... and their ||f(x_[CLS])|| is below {RISING_VECTOR_MAX} of the median token's": all(
            float(a.cls_vector_ratio[lh]) < RISING_VECTOR_MAX for lh in rising),
    }

"""A checker's feedback never hands out the answer's key line (what a level-3 skeleton leaves as
``...``): a spy in place of ``check_function`` collects the hints each checker hands it, and those
texts (and the module's own strings) are searched for the reference solution's key expressions."""

from __future__ import annotations

import pytest
import torch
from _exercises import one_hot_only, stub

from attn_helpers.exercises import (
    cross_attention,
    masking,
    query_key_value,
    real_model,
    rnn_bottleneck,
    start_here,
)
from attn_helpers.exercises.core import CheckResult

#: Per exercise: the checker, and the key expressions of its reference solution (the level-3
#: skeleton's fills and their usual spellings) that no feedback text may contain.
KEY_EXPRESSIONS = {
    "start_here.softmax_with_temperature": (
        start_here.check_softmax_with_temperature,
        ("amax(dim=-1, keepdim=True)", "sum(dim=-1, keepdim=True)", "keepdim")),
    "start_here.entropy": (
        start_here.check_entropy,
        ("weights * torch.log(weights)", "torch.where(", "weights > 0", "terms.sum(dim=-1)")),
    "rnn_bottleneck.rnn_encoder": (
        rnn_bottleneck.check_rnn_encoder,
        ("torch.tanh(x[..., j, :]", "x[..., j, :] @ W_x", "h @ W_h")),
    "rnn_bottleneck.additive_scores": (
        rnn_bottleneck.check_additive_scores,
        ("(s @ U_q)[:, None", "[:, None, :]", "unsqueeze(1)", "features @ v_a")),
    "query_key_value.attention": (
        query_key_value.check_attention,
        ("k.transpose(-2, -1)", "q.shape[-1] ** 0.5", "~mask", "nan_to_num(", "mask.any(dim=-1",
         "torch.softmax(scores")),
    "query_key_value.asymmetric_relation": (
        query_key_value.check_asymmetric_relation,
        ("pinv", "torch.roll(", "W_Q @ P.T", "math.log(99")),
    "masking.pack_documents": (masking.check_pack_documents, (
        "repeat_interleave", "doc[:, None] == doc[None, :]", "i - starts[doc]", "searchsorted")),
    "masking.prefix_lm_mask": (
        masking.check_prefix_lm_mask,
        ("prefix_len[:, None, None, None]", "j < prefix_len", "[:, None, None, :]")),
    "masking.rolling_cache_step": (
        masking.check_rolling_cache_step,
        ("t % w", "t mod w", "min(t + 1, w)", "min(t+1, w)")),
    "cross_attention.decode": (
        cross_attention.check_decode_layer,
        ("memory_real[:, None, None, :]", "[:, None, None, :]", "split_heads(ca.",
         "norm2(x_t +", "norm3(x_t +", "out_proj(ah.merge_heads", "norm(x + block(x))")),
    "cross_attention.attend": (
        cross_attention.check_cross_attend,
        ("y @ W_Q", "memory @ W_K", "memory @ W_V", "memory_real[:, None, :]", "unsqueeze(1)",
         "softmax(scores, dim=-1)", "softmax(-1)")),
    "real_model.previous_token": (
        real_model.check_previous_token_scores,
        ("weights[..., i, i - 1]", "[..., i, i - 1]", "mask[:, 1:]", "[None, :, None, :]")),
    "real_model.value_norms": (
        real_model.check_value_norms,
        ("view(W_O_weight.shape[0], h, d_head)", "permute(1, 2, 0)", "einsum(", ".norm(dim=-1)",
         "[:, :, None, :]")),
}

#: The modules whose ``check_function`` the spy replaces, and whose own texts are searched.
MODULES = (start_here, rnn_bottleneck, query_key_value, masking, cross_attention, real_model)


def _weak(X):  # noqa: N803 - the right pattern, a fixed size that is too small for long rows
    W_Q = 3.0 * torch.linalg.pinv(X)                                          # noqa: N806
    return W_Q, W_Q @ torch.roll(torch.eye(X.shape[0], dtype=X.dtype), 1, dims=1).T


#: The checkers that build their verdicts themselves: wrong answers whose messages are read.
OWN_VERDICTS = {
    "query_key_value.asymmetric_relation": [
        one_hot_only, _weak, lambda X: (_weak(X)[0],) * 2, lambda X: _weak(X)[::-1]],
}


def _feedback(key) -> list[str]:
    """Every text the checker of ``key`` may show for a wrong answer (not its hints)."""
    seen: list[str] = []

    def spy(candidate, reference, cases, **kwargs):
        seen.extend(m.hint for m in kwargs.get("mistakes", ()))
        seen.extend(hint for _, hint in kwargs.get("error_hints", ()))
        seen.extend([kwargs["nan_hint"]] if kwargs.get("nan_hint") else [])
        return CheckResult(False, "Not yet: spied.")

    check = KEY_EXPRESSIONS[key][0]
    with pytest.MonkeyPatch.context() as spying:
        for module in MODULES:
            spying.setattr(module, "check_function", spy)
        check(stub)
    for wrong in OWN_VERDICTS.get(key, ()):
        verdict = check(wrong)
        assert not verdict, verdict.message
        seen.append(verdict.message)
    return seen


@pytest.mark.parametrize("key", sorted(KEY_EXPRESSIONS))
def test_no_feedback_text_contains_a_key_expression_of_its_exercise(key):
    texts = _feedback(key)
    assert texts, f"the spy saw no feedback for {key}"
    leaks = [(expression, text) for text in texts for expression in KEY_EXPRESSIONS[key][1]
             if expression in text]
    assert not leaks, "\n\n".join(f"{e!r} in: {t}" for e, t in leaks)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rpartition(".")[2])
def test_no_module_level_text_contains_a_key_expression_of_its_exercises(module):
    prefix = module.__name__.rpartition(".")[2] + "."
    expressions = {e for key, (_, found) in KEY_EXPRESSIONS.items() if key.startswith(prefix)
                   for e in found}
    texts = [(name, value) for name, value in vars(module).items()
             if isinstance(value, str) and not name.startswith("__")]
    texts += [("_WRONG", hint) for hint, _ in getattr(module, "_WRONG", ())]
    leaks = [(name, e) for name, text in texts for e in expressions if e in text]
    assert not leaks, leaks

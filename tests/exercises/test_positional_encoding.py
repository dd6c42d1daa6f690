"""Notebook 07's checkers: each accepts correct answers and names each known mistake; the
references are checked against the papers' formulas and Hugging Face's Llama and Bloom."""

from __future__ import annotations

import math

import pytest
import torch
from _exercises import assert_skeleton, stub

from attn_helpers.exercises import EXERCISES
from attn_helpers.exercises import positional_encoding as ex
from attn_helpers.exercises.positional_encoding import ALIBI_MISTAKES, LAYOUT_MISTAKES, ROPE_MISTAKES
from attn_helpers.positional import alibi_slopes, apply_rope, frequencies


def roformer(x, positions):
    """RoFormer's eq. (34): R(m) x, blocks [[cos, -sin], [sin, cos]] at m 10000^(-2(i-1)/d)."""
    d, out = x.shape[-1], torch.empty_like(x, dtype=torch.float64)
    for j, m in enumerate(positions.tolist()):
        blocks = []
        for i in range(1, d // 2 + 1):
            a = m * 10000.0 ** (-2 * (i - 1) / d)
            blocks.append(torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]],
                                       dtype=torch.float64))
        out[..., j, :] = x[..., j, :].double() @ torch.block_diag(*blocks).T   # rows: (R(m) x)^T
    return out.to(x.dtype)


def test_the_rope_reference_is_roformers_formula_on_every_case():
    for case in ex._rope_cases():
        got = ex.rope_reference(**case)
        assert got.dtype == case["x"].dtype
        assert torch.allclose(got.double(), roformer(**case).double(), atol=1e-5)


def learner_rope(x, positions):
    """A learner's RoPE: a loop over the pairs, with math."""
    d, out = x.shape[-1], torch.empty_like(x)
    for i in range(d // 2):
        a = positions.double() * 10000.0 ** (-2 * i / d)                     # (n,)
        cos, sin = a.cos().to(x.dtype), a.sin().to(x.dtype)
        u, v = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i], out[..., 2 * i + 1] = u * cos - v * sin, u * sin + v * cos
    return out


def test_rope_checker_accepts_correct_answers_but_not_float32_angles():
    def by_complex(x, positions):                           # Meta's Llama: pairs as complex numbers
        d = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        turn = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64),
                           positions.double()[:, None] * theta)
        pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)

    def float32_angles(x, positions):                       # omega and the angles in float32
        d = x.shape[-1]
        angles = positions[:, None] * 10000 ** (-torch.arange(0, d, 2) / d)    # float32
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)

    for answer in (learner_rope, roformer, by_complex):
        verdict = ex.check_rope(answer)
        assert verdict, verdict.message
    verdict = ex.check_rope(float32_angles)                 # right at small positions, not far out
    assert not verdict and verdict.message.endswith(f"Hint: {ex.FAR_HINT}"), verdict.message
    assert ex.check_rope(ex.rope_reference, solution=True)
    assert ex.check_rope(stub).message == "rope is not implemented yet."


def assert_names_the_mistake(verdict, mistake, keys):
    """Its own hint only, and no key line of the answer (what the skeleton leaves blank)."""
    assert not verdict and "Not yet" in verdict.message, verdict.message
    assert verdict.message.endswith(f"Hint: {mistake.hint}"), verdict.message
    assert not any(key in verdict.message.split("Hint:")[-1] for key in keys), verdict.message


@pytest.mark.parametrize("mistake", ROPE_MISTAKES, ids=range(len(ROPE_MISTAKES)))
def test_rope_checker_names_each_mistake(mistake):
    keys = ("0::2", "1::2", "* cos - ", "* sin + ", "flatten(-2)", "torch.stack", "[:, None]")
    assert_names_the_mistake(ex.check_rope(mistake.produce), mistake, keys)


@pytest.mark.parametrize("wrong, phrase", [
    (lambda x, p: learner_rope(x, p) * (1 + 0.1 * p[:, None]).to(x.dtype),          # a growing length
     "every pair keeps its length"),
    (lambda x, p: x * torch.repeat_interleave((p[:, None] * frequencies(x.shape[-1])).cos(), 2, -1)
     .to(x.dtype), "every pair keeps its length"),                                   # cos alone
    (lambda x, p: learner_rope(x, p ** 2), "depend on n - m only"),               # angle m^2 omega_i
    (lambda x, p: roformer(x, p + 0.5), "at position 0 the angle is 0"),          # half a step late
    (lambda x, p: roformer(x, -p), "you rotated by -m omega_i"),                  # the named ones,
    (lambda x, p: learner_rope(x, torch.arange(len(p))), "you rotated by 0 .. n-1"),  # routes
])
def test_a_wrong_rope_by_another_route_gets_its_hint(wrong, phrase):
    verdict = ex.check_rope(wrong)
    assert not verdict and phrase in verdict.message, verdict.message


def frequency_rope(x, positions, *, base=10000.0, d=None, scale=1.0):
    """RoPE, relative and length-keeping, with a wrong d, base or scale of the positions."""
    d = x.shape[-1] if d is None else d
    omega = base ** (-torch.arange(0, x.shape[-1], 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * scale * omega
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)


@pytest.mark.parametrize("wrong, pair", [
    (lambda x, p: frequency_rope(x, p, base=1000.0), 1),                         # base 1000
    (lambda x, p: frequency_rope(x, p, d=x.shape[-2]), 1),                        # d = x.shape[-2]
    (lambda x, p: frequency_rope(x, p, scale=1 / len(p)), 0),                     # positions / n
])
def test_a_rope_with_wrong_frequencies_gets_the_pair_and_its_angle(wrong, pair):
    verdict = ex.check_rope(wrong)
    message = verdict.message
    assert not verdict and "Hint: your rotation keeps lengths and is relative" in message, message
    assert f"pair {pair} turned by" in message and "not rescaled" in message, message


def hf_rotate(x, positions, base=10000.0):
    """Hugging Face Llama's rotation: ``LlamaRotaryEmbedding`` for cos/sin, ``apply_rotary_pos_emb``
    (``rotate_half``) on ``x`` ``(heads, n, d)``, as ``transformers`` ships it."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    heads, _, d = x.shape
    config = LlamaConfig(hidden_size=heads * d, num_attention_heads=heads,
                         max_position_embeddings=4096, rope_theta=base)
    config.rope_parameters = {"rope_type": "default", "rope_theta": base}
    cos, sin = LlamaRotaryEmbedding(config)(x[None].float(), positions[None])
    return apply_rotary_pos_emb(x[None].double(), x[None].double(), cos.double(), sin.double())[0][0]


def hf_permute(W, heads):
    """Hugging Face's conversion of Meta's Llama weights (interleaved RoPE) to its split halves:
    ``permute`` of ``convert_llama_weights_to_hf.py``, per head (``n_heads`` for ``wq``,
    ``num_key_value_heads`` for ``wk``)."""
    rows, d_in = W.shape
    return W.view(heads, rows // heads // 2, 2, d_in).transpose(1, 2).reshape(rows, d_in)


@pytest.mark.parametrize("h, g, d_head, d_in", [(1, 1, 8, 8), (4, 2, 8, 20), (6, 1, 16, 12),
                                                (2, 2, 2, 3), (8, 4, 64, 40)])
def test_the_reference_keeps_the_scores_of_hugging_faces_llama(h, g, d_head, d_in):
    """Hugging Face's Llama scores on the original weights equal apply_rope's on the converted ones,
    head by head (query head j reads key/value head j // (h/g)); the reference undoes HF's move."""
    gen = torch.Generator().manual_seed(h * 100 + d_head)
    W_Q, W_K = (torch.randn(n * d_head, d_in, generator=gen, dtype=torch.float64) for n in (h, g))
    x = torch.randn(9, d_in, generator=gen, dtype=torch.float64)                # (n, d_in)
    positions = torch.tensor([0, 1, 2, 5, 30, 31, 400, 2500, 4000])

    def heads(W, n):                                                            # (n, 9, d_head)
        return (x @ W.T).view(9, n, d_head).transpose(0, 1)

    k_hf = hf_rotate(heads(W_K, g), positions).repeat_interleave(h // g, 0)
    hf_scores = hf_rotate(heads(W_Q, h), positions) @ k_hf.transpose(-2, -1)
    new_Q, new_K = ex.to_interleaved_reference(W_Q, W_K, h, g)
    k_ours = apply_rope(heads(new_K, g), positions).repeat_interleave(h // g, 0)
    ours = apply_rope(heads(new_Q, h), positions) @ k_ours.transpose(-2, -1)
    assert torch.allclose(ours, hf_scores, atol=1e-4 * hf_scores.abs().max().item())  # float32 angles
    assert torch.equal(hf_permute(new_Q, h), W_Q) and torch.equal(hf_permute(new_K, g), W_K)
    assert sorted(new_Q.tolist()) == sorted(W_Q.tolist())                       # rows only move


def by_transpose(W_Q, W_K, h, g):
    """The conversion script's reshape, the other way round: halves (2, d/2) read as pairs."""
    def convert(W, heads):
        rows, d_in = W.shape
        return W.view(heads, 2, rows // heads // 2, d_in).transpose(1, 2).reshape(rows, d_in)
    return convert(W_Q, h), convert(W_K, g)


def by_rows(W_Q, W_K, h, g):
    """Row by row, with a loop over heads and pairs."""
    out = []
    for W, heads in ((W_Q, h), (W_K, g)):
        d, new = W.shape[0] // heads, torch.empty_like(W)
        for j in range(heads):
            for i in range(d // 2):
                new[j * d + 2 * i] = W[j * d + i]
                new[j * d + 2 * i + 1] = W[j * d + i + d // 2]
        out.append(new)
    return out


def by_matrix(W_Q, W_K, h, g):
    """A permutation matrix per weight, block-diagonal over the heads, in the weight's dtype."""
    def convert(W, heads):
        d = W.shape[0] // heads
        P = torch.zeros(d, d, dtype=W.dtype)
        for i in range(d // 2):
            P[2 * i, i] = P[2 * i + 1, i + d // 2] = 1
        return torch.block_diag(*[P] * heads) @ W
    return convert(W_Q, h), convert(W_K, g)


@pytest.mark.parametrize("answer", [by_transpose, by_rows, by_matrix])
def test_layout_checker_accepts_correct_answers(answer):
    verdict = ex.check_rope_layout(answer)
    assert verdict, verdict.message


@pytest.mark.parametrize("mistake", LAYOUT_MISTAKES, ids=range(len(LAYOUT_MISTAKES)))
def test_layout_checker_names_each_mistake(mistake):
    keys = ("torch.stack", "d_head // 2", "arange(d_head", "transpose(1, 2)", "view(heads, 2",
            "[0, 4, 1, 5", "i + d/2 ->", "copies old row i ")
    assert_names_the_mistake(ex.check_rope_layout(mistake.produce), mistake, keys)


def only_half_rotated(W_Q, W_K, h, g):
    """A learner's partial RoPE: each head's first d/2 rows reordered as a head of d/2, by a loop."""
    out = []
    for W, heads in ((W_Q, h), (W_K, g)):
        d, new = W.shape[0] // heads, W.clone()
        for j in range(heads):
            for i in range(d // 4):
                new[j * d + 2 * i], new[j * d + 2 * i + 1] = W[j * d + i], W[j * d + i + d // 4]
        out.append(new)
    return out


@pytest.mark.parametrize("wrong, phrase", [
    (only_half_rotated, "you moved only the first half of each head"),
    (lambda W_Q, W_K, h, g: by_rows(W_Q, W_K, h, g)[::-1], "you returned (W_K', W_Q')"),
])
def test_layout_checker_names_a_mistake_made_another_way(wrong, phrase):
    verdict = ex.check_rope_layout(wrong)
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message, verdict.message


@pytest.mark.parametrize("check, wrong", [(ex.check_rope, lambda x, p: learner_rope(x.double(), p)),
    (ex.check_rope_layout, lambda *args: tuple(w.double() for w in by_rows(*args)))])
def test_the_checkers_want_the_inputs_dtype(check, wrong):
    verdict = check(wrong)
    assert not verdict and "the right answer is torch.float32" in verdict.message, verdict.message


def bloom_alibi(n_queries, n_keys, slopes):
    """Hugging Face Bloom's ``build_alibi_tensor``: ``m_h j``, its own slopes, one row for all i."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    return build_alibi_tensor(torch.ones(1, n_keys), len(slopes), torch.float64)    # (H, 1, n_keys)


@pytest.mark.parametrize("h", [1, 3, 5, 6, 8, 12, 20])
def test_the_alibi_slopes_are_blooms(h):
    assert torch.allclose(alibi_slopes(h), bloom_alibi(1, 2, torch.empty(h))[:, 0, 1], rtol=1e-6, atol=0)


def minus_abs(n_queries, n_keys, slopes):
    i = torch.arange(n_keys)
    return -slopes[:, None, None] * (i[None, :] - i[-n_queries:, None]).abs()


def from_zero(n_queries, n_keys, slopes):  # the new queries counted from 0, not n_keys - n_queries
    return -slopes[:, None, None] * (torch.arange(n_queries)[:, None] - torch.arange(n_keys))


@pytest.mark.parametrize("answer", [ex.alibi_bias_reference, minus_abs, bloom_alibi, from_zero,
                                    lambda q, n, m: ex.alibi_bias_reference(q, n, m).float() + 7])
def test_alibi_checker_accepts_any_per_row_anchor(answer):
    verdict = ex.check_alibi_bias(answer)
    assert verdict and "softmax(s + c) = softmax(s)" in verdict.message, verdict.message
    anchor = {bloom_alibi: "Bloom's m_h j", minus_abs: "the paper's",
              from_zero: "your queries count from 0"}.get(answer, "")
    assert anchor in verdict.message, verdict.message


@pytest.mark.parametrize("wrong, hint", [*ALIBI_MISTAKES,
    (lambda q, n, m: -m[:, None, None] * torch.arange(n), ALIBI_MISTAKES[0][1]),    # -m_h j: per column
    (lambda q, n, m: -m[:, None, None] * torch.arange(q)[:, None], ALIBI_MISTAKES[1][1])])      # -m_h i
def test_alibi_checker_names_each_mistake(wrong, hint):
    verdict = ex.check_alibi_bias(wrong)
    assert not verdict and verdict.message.endswith(f"Hint: {hint}"), verdict.message


@pytest.mark.parametrize("wrong", [lambda q, n, m: ex.alibi_bias_reference(q, n, m)[0],   # one 2-D grid
                                   lambda q, n, m: ex.alibi_bias_reference(q, n, m)[:1]])
def test_alibi_checker_wants_a_grid_per_head(wrong):
    verdict = ex.check_alibi_bias(wrong)
    assert not verdict and "one grid per head" in verdict.message and "slopes[0]" not in verdict.message


def test_the_level_3_skeletons_filled_in_pass():
    assert_skeleton("positional_encoding.rope_layout", "W_Q, W_K, h, g", ex.check_rope_layout, (
        "W.shape[0] // heads",
        "torch.stack([torch.arange(d_head // 2), torch.arange(d_head // 2) + d_head // 2], -1)"
        ".flatten()"))
    assert_skeleton("positional_encoding.rope", "x, positions", ex.check_rope, (
        "10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)",
        "positions.double()[:, None] * omega",
        "even * cos - odd * sin", "even * sin + odd * cos"))
    assert_skeleton("positional_encoding.alibi_bias", "n_queries, n_keys, slopes", ex.check_alibi_bias, (
        "i[:, None] - j", "slopes[:, None, None]"))


@pytest.mark.parametrize("key, answers", [
    ("positional_encoding.rope", ("0::2", "1::2", "* cos -", "* sin +", "-sin", "cos a - ",
                                  "flatten(-2)", "torch.stack", "[:, None]")),
    ("positional_encoding.rope_layout", ("i + d/2 ->", "-> 2i", "row 2i is", "copies old row i",
                                         "[0, 4, 1, 5", "[0, 2, 4", "(0, d/2", "arange(d_head // 2)",
                                         "stack", "transpose(1, 2)", "view(heads, 2")),
    ("positional_encoding.alibi_bias", ("[:, None]", "i[:, None] - j", "arange")),
])
def test_the_first_two_hints_lead_without_stating_the_answer(key, answers):
    for text in EXERCISES[key].hints[:2]:
        assert not any(answer in text for answer in answers), text

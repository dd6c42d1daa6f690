"""Notebook 07's checkers: each accepts correct answers and names each known mistake; the
references are checked against the papers' formulas and Hugging Face's Llama."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from _exercises import assert_skeleton, stub
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_helpers as ah
from attn_helpers.exercises import EXERCISES
from attn_helpers.exercises import positional_encoding as ex
from attn_helpers.exercises.positional_encoding import LAYOUT_MISTAKES, REACH_MISTAKES, ROPE_MISTAKES
from attn_helpers.positional import apply_rope, frequencies


def roformer(x, positions):
    """RoFormer's eq. (34) written out: R(m) x with 2 x 2 blocks [[cos, -sin], [sin, cos]] at
    m theta_i, theta_i = 10000^(-2(i-1)/d) for i = 1 .. d/2, as an explicit block-diagonal matrix."""
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


def test_rope_checker_accepts_correct_answers():
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

    for answer in (learner_rope, roformer, by_complex, float32_angles):
        verdict = ex.check_rope(answer)
        assert verdict, verdict.message
    assert ex.check_rope(ex.rope_reference, solution=True)
    assert ex.check_rope(stub).message == "rope is not implemented yet."


def assert_names_the_mistake(verdict, mistake):
    assert not verdict and "Not yet" in verdict.message, verdict.message
    assert verdict.message.endswith(f"Hint: {mistake.hint}"), verdict.message    # its own, only


@pytest.mark.parametrize("mistake", ROPE_MISTAKES, ids=range(len(ROPE_MISTAKES)))
def test_rope_checker_names_each_mistake(mistake):
    assert_names_the_mistake(ex.check_rope(mistake.produce), mistake)


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


def test_a_correct_rope_that_overwrites_x_is_told_to_work_on_a_copy():
    def overwrites(x, positions):
        x.copy_(apply_rope(x, positions))
        return x

    verdict = ex.check_rope(overwrites)
    assert not verdict and "changed its input 'x' in place" in verdict.message, verdict.message


def test_rope_checker_wants_x_s_dtype():
    verdict = ex.check_rope(lambda x, p: learner_rope(x.double(), p))
    assert not verdict and "the right answer is torch.float32" in verdict.message, verdict.message


def test_no_rope_feedback_holds_the_answers_key_line():
    keys = ("0::2", "1::2", "* cos - ", "* sin + ", "flatten(-2)", "torch.stack", "[:, None]")
    for text in [ex.check_rope(m.produce).message for m in ROPE_MISTAKES]:
        assert not any(key in text.split("Hint:")[-1] for key in keys), text


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
    """Split-half scores as Hugging Face's Llama computes them, on the original weights, equal the
    course's apply_rope on the converted ones, head by head (query head j reads key/value head
    j // (h/g)), at positions up to 4000; and the reference undoes the conversion script's move."""
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
    assert_names_the_mistake(ex.check_rope_layout(mistake.produce), mistake)


def test_no_layout_feedback_holds_the_answers_key_line():
    """No mistake hint or verdict holds the index the skeleton leaves blank."""
    keys = ("torch.stack", "d_head // 2", "arange(d_head", "transpose(1, 2)", "view(heads, 2",
            "[0, 4, 1, 5", "i + d/2 ->", "copies old row i ")
    for text in [ex.check_rope_layout(m.produce).message for m in LAYOUT_MISTAKES]:
        assert not any(key in text for key in keys), text


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


def test_layout_checker_wants_two_tensors_in_the_inputs_dtype():
    verdict = ex.check_rope_layout(lambda *args: by_rows(*args)[0])
    assert not verdict and "returned 1 value(s); expected 2 (W_Q', W_K')" in verdict.message
    verdict = ex.check_rope_layout(lambda *args: (by_rows(*args)[0], None))
    assert not verdict and "you returned W_K' as a NoneType" in verdict.message, verdict.message
    verdict = ex.check_rope_layout(lambda *args: tuple(w.double() for w in by_rows(*args)))
    assert not verdict and "the right answer is torch.float32" in verdict.message, verdict.message


mpmath.mp.dps = 40


def exact_x(m: float, n: int) -> mpmath.mpf:
    """The real-valued k with share(k) = 1/2, to 40 digits: -ln((1 + r^n) / 2) / m, r = e^-m."""
    m = mpmath.mpf(m)
    return -mpmath.log((1 + mpmath.exp(-m * n)) / 2) / m


def summed_reach(m: float, n: int) -> int:
    """The definition itself, to 40 digits: the fewest nearest keys whose weight reaches half."""
    weights = [mpmath.exp(-mpmath.mpf(m) * delta) for delta in range(n)]
    total, running = mpmath.fsum(weights), mpmath.mpf(0)
    for k, w in enumerate(weights, start=1):
        running += w
        if running >= total / 2:
            return k
    raise AssertionError("unreachable: the whole row holds all its weight")


def test_the_reach_reference_is_the_definition_on_every_case():
    for case in ex._reach_cases():
        got = ex.half_weight_reach_reference(case["slopes"], case["L"])
        assert got.dtype == torch.long and got.shape == case["slopes"].shape
        assert got.tolist() == [summed_reach(m, case["L"]) for m in case["slopes"].tolist()], case


def test_the_cases_cover_the_edges_and_stay_away_from_ties():
    cases = ex._reach_cases()
    for case in cases:
        for m in case["slopes"].tolist():
            x = exact_x(m, case["L"])
            if x > 1:   # below 1 every route gives 1: the nearest key alone always holds half
                assert min(x - mpmath.floor(x), mpmath.ceil(x) - x) >= ex.REACH_MARGIN, (m, case["L"])


@pytest.mark.parametrize("n", [1, 2, 11, 1001])
def test_the_reach_limits(n):
    """One key reaches 1; a vanishing slope makes the row uniform, ceil(n / 2); a long row gives an
    endless row's ceil(ln 2 / m)."""
    tiny = torch.tensor([1e-12], dtype=torch.float64)
    assert ex.half_weight_reach_reference(tiny, n).item() == math.ceil(n / 2)
    slopes = ah.alibi_slopes(8)
    assert ex.half_weight_reach_reference(slopes, 1).tolist() == [1] * 8
    assert torch.equal(ex.half_weight_reach_reference(slopes, 10**6),
                       torch.ceil(math.log(2) / slopes).long())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(log_m=st.floats(math.log(1e-4), math.log(50.0)), n=st.integers(1, 3000))
def test_the_reach_is_between_1_and_n_and_matches_a_float64_running_sum(log_m, n):
    m = torch.tensor([math.exp(log_m)], dtype=torch.float64)
    k = ex.half_weight_reach_reference(m, n).item()
    assert 1 <= k <= n
    x = exact_x(m.item(), n)
    if min(x - mpmath.floor(x), mpmath.ceil(x) - x) > 1e-6:      # away from a tie
        assert k == summed_reach(m.item(), n)


def closed_form(m, n):
    r_n = torch.exp(-m * n)                                     # (H,): r^n
    return torch.ceil(-torch.log((1 + r_n) / 2) / m).long()


def running_sum(m, n, *, dtype=torch.float64):
    delta = torch.arange(n, dtype=dtype)                        # (n,): distances 0 .. n-1
    weights = torch.softmax(-m.to(dtype)[:, None] * delta, dim=-1)  # (H, n)
    return (weights.cumsum(-1) < 0.5).sum(-1) + 1                # keys before half, plus one


def bisection(m, n):
    """Search k in 1 .. n with the closed-form share (1 - r^k) / (1 - r^n) >= 1/2."""
    def share(k):
        return torch.expm1(-m * k) / torch.expm1(-m * n)
    low, high = torch.ones_like(m, dtype=torch.long), torch.full_like(m, n, dtype=torch.long)
    while bool((low < high).any()):
        mid = (low + high) // 2
        enough = share(mid) >= 0.5
        high, low = torch.where(enough, mid, high), torch.where(enough, low, mid + 1)
    return low


def log1p_form(m, n):
    return torch.ceil(-torch.log1p(torch.expm1(-m * n) / 2) / m).long()


@pytest.mark.parametrize("answer", [closed_form, log1p_form, bisection, running_sum],
                         ids=["closed form", "log1p", "bisection on the closed share", "row sum"])
def test_reach_checker_accepts_correct_answers(answer):
    verdict = ex.check_reach(answer)
    assert verdict, verdict.message


@pytest.mark.parametrize("mistake", REACH_MISTAKES, ids=range(len(REACH_MISTAKES)))
def test_reach_checker_names_each_mistake(mistake):
    assert_names_the_mistake(ex.check_reach(mistake.produce), mistake)


@pytest.mark.parametrize("wrong, phrase", [                     # named mistakes by a learner's route
    (lambda m, n: (running_sum(m, n) - 1), "one short"),                       # no + 1
    (lambda m, n: (-torch.log((1 + torch.exp(-m * n)) / 2) / m).long(), "one short"),   # truncated
    (lambda m, n: running_sum(-m, n), "the weights grow with the distance"),
    (lambda m, n: running_sum(m * math.log(2), n), "you weighed the key delta back by 2^"),
    (lambda m, n: running_sum(m, n + 1), "your row has L + 1 keys"),
])
def test_reach_checker_names_a_mistake_made_another_way(wrong, phrase):
    verdict = ex.check_reach(wrong)
    assert not verdict and "Not yet" in verdict.message and phrase in verdict.message, verdict.message


def test_reach_checker_wants_whole_numbers_in_a_tensor():
    for wrong, phrase in [(lambda m, n: closed_form(m, n).double(), "return them as a LongTensor (H,)"),
                          (lambda m, n: closed_form(m, n).int(), "return them as a LongTensor (H,)"),
                          (lambda m, n: closed_form(m, n).tolist(), "the reaches as a list"),
                          (lambda m, n: closed_form(m, n)[:1], "shape (1,)")]:
        verdict = ex.check_reach(wrong)
        assert not verdict and phrase in verdict.message, verdict.message
        assert "raised" not in verdict.message, verdict.message   # the learner's code raised nothing


def test_the_level_3_skeletons_filled_in_pass():
    assert_skeleton("positional_encoding.rope_layout", "W_Q, W_K, h, g", ex.check_rope_layout, (
        "W.shape[0] // heads",
        "torch.stack([torch.arange(d_head // 2), torch.arange(d_head // 2) + d_head // 2], -1)"
        ".flatten()"))
    assert_skeleton("positional_encoding.rope", "x, positions", ex.check_rope, (
        "10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)",
        "positions.double()[:, None] * omega",
        "even * cos - odd * sin", "even * sin + odd * cos"))
    assert_skeleton("positional_encoding.reach", "slopes, L", ex.check_reach, (
        "-torch.log((1 + r_L) / 2) / slopes", "torch.ceil(x).long()"))


@pytest.mark.parametrize("key, answers", [
    ("positional_encoding.rope", ("0::2", "1::2", "* cos -", "* sin +", "-sin", "cos a - ",
                                  "flatten(-2)", "torch.stack", "[:, None]")),
    ("positional_encoding.rope_layout", ("i + d/2 ->", "-> 2i", "row 2i is", "copies old row i",
                                         "[0, 4, 1, 5", "[0, 2, 4", "(0, d/2", "arange(d_head // 2)",
                                         "stack", "transpose(1, 2)", "view(heads, 2")),
    ("positional_encoding.reach", ("-ln(", "1 - r^k", "1 - r^K", "(1 + r^L) / 2", "round x UP")),
])
def test_the_first_two_hints_lead_without_stating_the_answer(key, answers):
    for text in EXERCISES[key].hints[:2]:
        assert not any(answer in text for answer in answers), text

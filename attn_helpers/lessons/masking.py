r"""Notebook 05: the experiments behind its claims about masks, the KV cache and grouped-query
attention, and ``claims(...)``, the named booleans the notebook asserts.

* :func:`masked_gradients`: the gradient that reaches a masked score is exactly zero, and a row
  with no visible key gets zero weights and a zero (not NaN) gradient.
* :func:`compare_generation`: a :class:`~attn_helpers.decoder_lm.TinyCausalLM` generates the same
  tokens with and without its KV caches; the work per step (positions run through the layers,
  attention scores) and the time are measured in the same run.
* :func:`cache_examples`: :func:`~attn_helpers.kv_cache.kv_cache_bytes` for Llama-2-7B's shape,
  with its 32 key/value heads and with 8, and the context lengths at which each cache outweighs
  Llama-2-7B's float16 weights.
* :func:`gqa_tradeoff`: a one-layer model trained on associative recall with ``g`` key/value heads,
  over several seeds: how the mean accuracy with fewer key/value heads compares with the seed
  spread at this scale.

Every threshold a claim uses is a constant below, defined once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._checks import require_positive_int
from ..attention import masked_softmax
from ..decoder_lm import Generation, TinyCausalLM
from ..kv_cache import kv_cache_bytes
from ..multihead import MultiHeadAttention
from ..training import train

__all__ = [
    "SPEEDUP_MIN", "LLAMA2_7B", "LLAMA2_7B_PARAMETERS", "RECALL", "masked_gradients",
    "GenerationComparison", "compare_generation", "cache_examples", "gqa_torch_gap",
    "recall_batch", "train_recall", "gqa_tradeoff", "claims", "gqa_claims", "forward_seconds",
    "overhead_claims", "top_left_causal_demo",
]

#: with the cache, generating must be at least this many times faster (same run, same model)
SPEEDUP_MIN = 1.5
#: the sizes of a Llama-2-7B-like model (Touvron et al., 2023): 32 layers, 32 heads of 128
LLAMA2_7B = dict(num_layers=32, num_kv_heads=32, head_dim=128)
#: Llama-2-7B's parameter count (its weights take 2 bytes each in float16)
LLAMA2_7B_PARAMETERS = 6_738_415_616
#: the associative-recall task and the model trained on it for the GQA trade-off
RECALL = dict(num_keys=16, num_values=8, pairs=6, d_model=32, num_heads=4, d_ff=64, steps=300,
              batch_size=32, lr=1e-2, eval_size=2000)
#: every trained run must beat chance (1 / num_values) by this factor
RECALL_OVER_CHANCE = 4
#: fewer key/value heads may cost at most this much mean accuracy (absolute) at this scale
GQA_MAX_MEAN_DROP = 0.15


def masked_gradients(n: int = 6, seed: int = 0) -> dict[str, float]:
    """Backpropagate through :func:`~attn_helpers.attention.masked_softmax` with a causal mask
    whose last row is fully masked. Returns the largest ``|gradient|`` on the masked scores, on the
    visible ones, on the fully masked row, and whether any gradient is NaN."""
    require_positive_int("n", n)
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, n, generator=generator, requires_grad=True)         # (n_q, n_k)
    values = torch.randn(n, 3, generator=generator)                             # (n_k, d_v)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    mask[-1] = False                                                            # a row sees nothing
    (masked_softmax(scores, mask) @ values).square().sum().backward()
    grad = scores.grad
    return {"masked": grad[~mask].abs().max().item(), "visible": grad[mask].abs().max().item(),
            "empty row": grad[-1].abs().max().item(), "nan": bool(grad.isnan().any())}


@dataclass
class GenerationComparison:
    """Greedy generation of one model with and without the KV cache, measured in the same run.

    Attributes: ``with_cache``, ``without_cache`` (:class:`~attn_helpers.decoder_lm.Generation`),
    ``seconds_with``, ``seconds_without`` (the fastest of the repeats, which alternate).
    """

    with_cache: Generation
    without_cache: Generation
    seconds_with: float
    seconds_without: float

    @property
    def steps(self) -> int:
        return len(self.with_cache.costs)

    @property
    def same_tokens(self) -> bool:
        return torch.equal(self.with_cache.tokens, self.without_cache.tokens)

    @property
    def logit_gap(self) -> float:
        """Largest ``|difference|`` between the two runs' logits (float rounding only)."""
        return (self.with_cache.logits - self.without_cache.logits).abs().max().item()

    @property
    def tokens_per_s(self) -> tuple[float, float]:
        """``(with cache, without cache)`` generated tokens per second."""
        return self.steps / self.seconds_with, self.steps / self.seconds_without

    @property
    def speedup(self) -> float:
        return self.seconds_without / self.seconds_with


def compare_generation(model: TinyCausalLM, prompt: torch.Tensor, steps: int, *,
                       repeats: int = 3) -> GenerationComparison:
    """Generate ``steps`` tokens from ``prompt`` ``(b, n_prompt)`` with and without the cache,
    ``repeats`` times each (alternating, so both see the same machine load), on one thread."""
    if not isinstance(model, TinyCausalLM):
        raise TypeError(f"model must be a TinyCausalLM, got {type(model).__name__}")
    require_positive_int("repeats", repeats)
    seconds = {True: [], False: []}
    runs = {}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(repeats):
            for use_cache in (True, False):
                start = time.perf_counter()
                runs[use_cache] = model.generate(prompt, steps, use_cache=use_cache)
                seconds[use_cache].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return GenerationComparison(runs[True], runs[False], min(seconds[True]), min(seconds[False]))


def forward_seconds(model: TinyCausalLM, positions: tuple[int, ...] = (1, 200), *,
                    repeats: int = 5) -> dict[int, float]:
    """The best of ``repeats`` timings of one forward pass over ``n`` positions, for each ``n`` in
    ``positions``, on one thread: how much of a step's time is per-call overhead."""
    require_positive_int("repeats", repeats)
    seconds = {}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for n in positions:
                tokens = torch.zeros(1, n, dtype=torch.long)
                model(tokens)                                          # warm-up
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    model(tokens)
                    times.append(time.perf_counter() - start)
                seconds[n] = min(times)
    finally:
        torch.set_num_threads(previous)
    return seconds


def overhead_claims(seconds: dict[int, float]) -> dict[str, bool]:
    """Why the cache's speed-up is far below its saving in positions: one forward pass over the
    most positions in ``seconds`` costs less than half as much as that many one-position passes
    (the fixed per-call cost of a small step; the margin holds without SIMD too)."""
    few, many = min(seconds), max(seconds)
    ratio = many // few
    return {f"a forward pass over {many} positions costs less than half of {ratio} passes over "
            f"{few}: part of each small step's time is a fixed per-call cost":
            seconds[many] < ratio / 2 * seconds[few]}


def cache_examples() -> dict[str, float]:
    """The worked examples of :func:`~attn_helpers.kv_cache.kv_cache_bytes` (float16, one
    sequence): bytes per token of Llama-2-7B's shape (:data:`LLAMA2_7B`) with its 32 and with 8
    key/value heads, the bytes of Llama-2-7B's float16 weights, and the context length at which
    each cache outweighs *those* weights. (A model with 8 key/value heads has smaller key and value
    projections, so fewer weights of its own; they are not computed here.)"""
    per_token = kv_cache_bytes(1, **LLAMA2_7B)
    per_token_gqa = kv_cache_bytes(1, **{**LLAMA2_7B, "num_kv_heads": 8})
    weights = 2 * LLAMA2_7B_PARAMETERS
    return {"bytes per token": per_token, "bytes per token, 8 kv heads": per_token_gqa,
            "weight bytes": weights, "tokens to outweigh the weights": weights / per_token,
            "tokens to outweigh the weights, 8 kv heads": weights / per_token_gqa}


def gqa_torch_gap(num_kv_heads: int, *, d_model: int = 32, num_heads: int = 8, n: int = 10,
                  seed: int = 0) -> float:
    """Largest ``|difference|`` between ``MultiHeadAttention(num_kv_heads=g)`` and
    ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` on the same projections."""
    torch.manual_seed(seed)
    layer = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads)
    x = torch.randn(2, n, d_model)                                              # (b, n, d_model)
    ours, _ = layer(x, x, x)
    d_head = layer.d_head
    q = layer.q_proj(x).unflatten(-1, (num_heads, d_head)).transpose(1, 2)     # (b, h, n, d_head)
    k = layer.k_proj(x).unflatten(-1, (num_kv_heads, d_head)).transpose(1, 2)  # (b, g, n, d_head)
    v = layer.v_proj(x).unflatten(-1, (num_kv_heads, d_head)).transpose(1, 2)  # (b, g, n, d_head)
    heads = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)           # (b, h, n, d_head)
    theirs = layer.out_proj(heads.transpose(1, 2).flatten(2))                  # (b, n, d_model)
    return (ours - theirs).abs().max().item()


def recall_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Associative recall: ``pairs`` (key, value) tokens with distinct keys, then a query key;
    the answer is the value stored with that key. A pair is one token, ``key * num_values +
    value``; a query is the token ``num_keys * num_values + key``.

    Returns ``(tokens (b, pairs + 1), answers (b,))`` with answers in ``0..num_values-1``."""
    require_positive_int("batch_size", batch_size)
    n_k, n_v, pairs = RECALL["num_keys"], RECALL["num_values"], RECALL["pairs"]
    keys = torch.rand(batch_size, n_k, generator=generator).argsort(-1)[:, :pairs]  # (b, pairs)
    values = torch.randint(0, n_v, (batch_size, pairs), generator=generator)        # (b, pairs)
    pick = torch.randint(0, pairs, (batch_size,), generator=generator)              # (b,)
    rows = torch.arange(batch_size)
    query = n_k * n_v + keys[rows, pick]                                             # (b,)
    return torch.cat([keys * n_v + values, query[:, None]], 1), values[rows, pick]


def train_recall(num_kv_heads: int, seed: int) -> dict[str, float]:
    """Train a one-layer :class:`TinyCausalLM` with ``num_kv_heads`` key/value heads on
    :func:`recall_batch` (sizes in :data:`RECALL`); return its final loss and its accuracy on
    ``eval_size`` fresh questions."""
    c = RECALL
    vocab = c["num_keys"] * c["num_values"] + c["num_keys"]
    torch.manual_seed(seed)
    model = TinyCausalLM(vocab, c["d_model"], c["num_heads"], 1, c["d_ff"],
                         num_kv_heads=num_kv_heads, max_len=c["pairs"] + 1)

    def loss_fn(model, tokens, answers):                    # the answer is read off the last position
        return F.cross_entropy(model(tokens)[:, -1, : c["num_values"]], answers)

    result = train(model, lambda step, g: recall_batch(c["batch_size"], g), loss_fn,
                   steps=c["steps"], lr=c["lr"], seed=seed, progress=False, single_threaded=True)
    tokens, answers = recall_batch(c["eval_size"], torch.Generator().manual_seed(10_000 + seed))
    with torch.no_grad():
        guess = model(tokens)[:, -1, : c["num_values"]].argmax(-1)
    return {"loss": result.final_loss, "accuracy": (guess == answers).float().mean().item()}


def gqa_tradeoff(kv_heads=(4, 2, 1), seeds=(0, 1, 2)) -> dict[int, list[dict[str, float]]]:
    """:func:`train_recall` for every ``g`` in ``kv_heads`` and every seed: ``{g: [run, ...]}``."""
    return {g: [train_recall(g, seed) for seed in seeds] for g in kv_heads}


def _accuracies(tradeoff) -> dict[int, torch.Tensor]:
    return {g: torch.tensor([run["accuracy"] for run in runs]) for g, runs in tradeoff.items()}


def claims(comparison: GenerationComparison, tradeoff: dict | None = None) -> dict[str, bool]:
    """Notebook 05's statements about masked gradients and the KV cache, checked on
    ``comparison`` (:func:`compare_generation`); given ``tradeoff``, also :func:`gqa_claims`."""
    grads = masked_gradients()
    with_costs, without_costs = comparison.with_cache.costs, comparison.without_cache.costs
    n_prompt = with_costs[0].positions
    examples = cache_examples()
    return {
        "masked scores get exactly zero gradient; a fully masked row too, and no NaN":
            grads["masked"] == 0 and grads["empty row"] == 0 and not grads["nan"]
            and grads["visible"] > 0,
        "with and without the cache, the generated tokens are identical":
            comparison.same_tokens,
        "with the cache, every step after the prompt runs one position through the layers":
            all(c.positions == 1 for c in with_costs[1:]),
        "without it, step t runs all n_prompt + t positions again":
            [c.positions for c in without_costs]
            == list(range(n_prompt, n_prompt + comparison.steps)),
        f"with the cache, generation is over {SPEEDUP_MIN}x faster (same run)":
            comparison.speedup > SPEEDUP_MIN,
        "a Llama-2-7B-sized cache takes 0.5 MiB per token in float16; 8 KV heads, 4x less":
            examples["bytes per token"] == 2 ** 19
            and examples["bytes per token"] == 4 * examples["bytes per token, 8 kv heads"],
        **(gqa_claims(tradeoff) if tradeoff is not None else {}),
    }


def gqa_claims(tradeoff: dict) -> dict[str, bool]:
    """The grouped-query trade-off on associative recall (:func:`gqa_tradeoff`, whose first key
    is ``g = h``): every run far above chance, and at this scale no drop larger than the seed
    spread (a null result, stated as one)."""
    acc = _accuracies(tradeoff)
    full, *fewer = acc
    means = {g: a.mean().item() for g, a in acc.items()}
    spread = {g: (a.max() - a.min()).item() for g, a in acc.items()}
    chance = 1 / RECALL["num_values"]
    return {
        f"every GQA run beats chance ({chance:.3f}) over {RECALL_OVER_CHANCE}x":
            all(bool((a > RECALL_OVER_CHANCE * chance).all()) for a in acc.values()),
        f"fewer KV heads cost at most {GQA_MAX_MEAN_DROP} mean accuracy (absolute) here":
            all(means[g] >= means[full] - GQA_MAX_MEAN_DROP for g in fewer),
        "each g < h loses no more mean accuracy than the spread of its own seeds":
            all(means[full] - means[g] <= spread[g] for g in fewer),
        "any two g < h: their means differ by no more than the smaller of their seed spreads":
            all(abs(means[a] - means[b]) <= min(spread[a], spread[b])
                for i, a in enumerate(fewer) for b in fewer[i + 1:]),
    }


def top_left_causal_demo(n_q: int = 1, n_k: int = 5, d: int = 4, seed: int = 0) -> dict:
    """``F.scaled_dot_product_attention(..., is_causal=True)`` with ``n_q < n_k`` (the last
    ``n_q`` positions' queries over all ``n_k`` keys, as in a cached step or chunked prefill):
    torch aligns its causal mask top-left (``j <= i``), the cache needs it bottom-right
    (``j <= i + n_k - n_q``). Returns the two masks and the gaps of torch's output and of the
    bottom-right mask's output from the last ``n_q`` rows of full causal attention."""
    from ..attention import scaled_dot_product_attention
    from ..masks import causal_mask

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n_k, d, generator=g) for _ in range(3))
    full, _ = scaled_dot_product_attention(q, k, v, causal_mask(n_k))   # (n_k, d)
    want = full[-n_q:]
    i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    top_left, bottom_right = j <= i, j <= i + (n_k - n_q)
    torch_out = F.scaled_dot_product_attention(q[-n_q:], k, v, is_causal=True)
    ours, _ = scaled_dot_product_attention(q[-n_q:], k, v, bottom_right)
    as_top_left, _ = scaled_dot_product_attention(q[-n_q:], k, v, top_left)
    return {"top-left": top_left, "bottom-right": bottom_right,
            "torch gap": (torch_out - want).abs().max().item(),
            "torch == top-left": (torch_out - as_top_left).abs().max().item(),
            "bottom-right gap": (ours - want).abs().max().item()}

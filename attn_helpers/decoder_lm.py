"""A tiny decoder-only (GPT-style) language model from the course's parts, and greedy generation
with and without a KV cache: tokens, token + learned position embeddings, pre-norm decoder layers
without cross-attention, LayerNorm, logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._checks import require_bool, require_positive_int, require_tensor, shape
from .kv_cache import KVCache
from .transformer import DecoderLayer

__all__ = ["TinyCausalLM", "StepCost", "Generation"]


@dataclass(frozen=True)
class StepCost:
    """One generation step's work per sequence: ``positions`` run through each layer, ``scores``
    computed over all layers and heads."""

    positions: int
    scores: int


@dataclass
class Generation:
    """``tokens (b, n_prompt + steps)``, ``logits (b, steps, vocab_size)`` each new token came
    from, one :class:`StepCost` per step, and ``cache_bytes`` (0 without a cache)."""

    tokens: torch.Tensor
    logits: torch.Tensor
    costs: list[StepCost]
    cache_bytes: int


class TinyCausalLM(nn.Module):
    """A small decoder-only Transformer: ``forward(tokens (b, n))`` gives logits ``(b, n,
    vocab_size)``, row ``i`` predicting token ``i + 1``; ``max_len`` bounds positions and caches."""

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, d_ff: int,
                 *, num_kv_heads: int | None = None, max_len: int = 128,
                 activation: str = "gelu"):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model),
                            ("num_layers", num_layers), ("max_len", max_len)):
            require_positive_int(name, value)
        self.vocab_size, self.max_len = vocab_size, max_len
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, norm_first=True, activation=activation,
                         num_kv_heads=num_kv_heads, cross_attention=False)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def _check_tokens(self, name: str, tokens, start: int = 0) -> None:
        require_tensor(name, tokens)
        if tokens.dim() != 2 or tokens.dtype != torch.long or tokens.numel() == 0:
            raise ValueError(f"{name} must be a long tensor (b >= 1, n >= 1), got {tokens.dtype} "
                             f"shape {shape(tokens)}")
        if start + tokens.shape[1] > self.max_len:
            raise ValueError(f"{name} {shape(tokens)} goes past max_len={self.max_len} positions")
        if not 0 <= int(tokens.min()) <= int(tokens.max()) < self.vocab_size:
            raise ValueError(f"{name} must hold ids in 0..{self.vocab_size - 1}, got "
                             f"{int(tokens.min())}..{int(tokens.max())}")

    def _run(self, tokens: torch.Tensor, caches: list[KVCache] | None):
        """Logits of ``tokens`` (the new positions when ``caches`` is given), its cost, weights."""
        start = 0 if caches is None else len(caches[0])        # position of tokens[:, 0]
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (b, n, d_model)
        all_weights = []
        for i, layer in enumerate(self.layers):
            x, weights = layer(x, need_weights=True, cache=None if caches is None else caches[i])
            all_weights.append(weights.self_attention)          # (b, h, n, n_k)
        scores = sum(w[0].numel() for w in all_weights)         # per sequence: layers x h x n x n_k
        logits = self.lm_head(self.norm(x))                     # (b, n, vocab_size)
        return logits, StepCost(tokens.shape[1], scores), all_weights

    def forward(self, tokens: torch.Tensor, *, need_weights: bool = False):
        """Logits ``(b, n, vocab_size)`` of a full causal pass; with ``need_weights=True`` also
        the list of each layer's self-attention weights ``(b, h, n, n)``."""
        self._check_tokens("tokens", tokens)
        require_bool("need_weights", need_weights)
        logits, _, weights = self._run(tokens, None)
        return (logits, weights) if need_weights else logits

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`~attn_helpers.kv_cache.KVCache` of ``max_len`` positions per layer."""
        return [KVCache(self.max_len) for _ in self.layers]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, steps: int, *, use_cache: bool) -> Generation:
        """Greedy decoding of ``steps`` tokens after ``prompt (b, n_prompt)``; ``use_cache``: one
        :class:`KVCache` per layer, only the new token runs. Returns a :class:`Generation`."""
        self._check_tokens("prompt", prompt)
        require_positive_int("steps", steps)
        require_bool("use_cache", use_cache)
        b, n_prompt = prompt.shape
        if n_prompt + steps > self.max_len:
            raise ValueError(f"need n_prompt + steps <= max_len={self.max_len}, got prompt "
                             f"{shape(prompt)} and steps={steps}")
        tokens = prompt.new_empty((b, n_prompt + steps))
        tokens[:, :n_prompt] = prompt
        logits = torch.empty((b, steps, self.vocab_size), dtype=self.lm_head.weight.dtype,
                             device=prompt.device)
        caches = self.new_caches() if use_cache else None
        costs = []
        for step in range(steps):
            end = n_prompt + step                               # tokens[:, :end] are known
            if caches is None:
                new = tokens[:, :end]                           # the whole prefix, again
            else:
                new = tokens[:, len(caches[0]):end]             # the prompt once, then one token
            step_logits, cost, _ = self._run(new, caches)
            logits[:, step] = step_logits[:, -1]                # (b, vocab): predicts token `end`
            tokens[:, end] = logits[:, step].argmax(-1)         # greedy
            costs.append(cost)
        cache_bytes = 0 if caches is None else sum(cache.nbytes for cache in caches)
        return Generation(tokens, logits, costs, cache_bytes)

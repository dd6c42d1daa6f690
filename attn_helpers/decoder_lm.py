r"""A tiny decoder-only language model (GPT-style) from the course's parts, and greedy generation
with and without a KV cache.

``tokens -> token + learned position embeddings -> num_layers pre-norm decoder layers without
cross-attention (causal self-attention, feed-forward) -> LayerNorm -> logits over the vocabulary``.

**Generation.** Without a cache, every step runs the whole prefix through every layer again and
keeps the last position's logits. With a cache (one :class:`~attn_helpers.kv_cache.KVCache` per
layer), the prompt goes through once, and each later step runs only the new token: in every layer
it is projected, its key and value are appended to that layer's cache, and its one query attends
to the cached keys. The tokens and logits are the same; :class:`StepCost` records, per step, how
many positions went through the layers and how many attention scores were computed.
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
    """The work of one generation step, per sequence, read off the tensors actually computed.

    Attributes:
        positions: positions run through each layer (each one projected to q, k, v and output,
            and through the feed-forward): the whole prefix without a cache, the new ones with it.
        scores: attention score entries computed, summed over layers and heads.
    """

    positions: int
    scores: int


@dataclass
class Generation:
    """What :meth:`TinyCausalLM.generate` returns.

    Attributes:
        tokens: ``(b, n_prompt + steps)`` the prompt followed by the generated tokens.
        logits: ``(b, steps, vocab_size)`` the logits each generated token was chosen from.
        costs: one :class:`StepCost` per step.
        cache_bytes: bytes of the KV caches (0 without a cache).
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    costs: list[StepCost]
    cache_bytes: int


class TinyCausalLM(nn.Module):
    """A small decoder-only Transformer language model.

    Args:
        vocab_size: number of token ids.
        d_model, num_heads, d_ff: layer sizes (see :class:`~attn_helpers.transformer.DecoderLayer`).
        num_layers: number of decoder layers.
        num_kv_heads: key/value heads per layer (grouped-query attention; default ``num_heads``).
        max_len: the longest sequence (learned position embeddings, and the caches' size).
        activation: ``"gelu"`` (default) or ``"relu"``.

    ``forward(tokens (b, n))`` returns logits ``(b, n, vocab_size)``; logit ``i`` predicts token
    ``i + 1`` from tokens ``0..i``.
    """

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
        """Greedy decoding: ``steps`` times, append the most likely next token.

        Args:
            prompt: ``(b, n_prompt)`` token ids, ``n_prompt >= 1``, ``n_prompt + steps <= max_len``.
            steps: number of tokens to generate.
            use_cache: keep each layer's keys and values (one ``KVCache`` per layer) and run only
                the new token at each step; otherwise re-run the whole prefix every step.

        Returns:
            a :class:`Generation`; the tokens and logits do not depend on ``use_cache`` (up to
            float rounding in the logits).
        """
        self._check_tokens("prompt", prompt)
        require_positive_int("steps", steps)
        require_bool("use_cache", use_cache)
        b, n_prompt = prompt.shape
        if n_prompt == 0 or n_prompt + steps > self.max_len:
            raise ValueError(f"need 1 <= n_prompt and n_prompt + steps <= max_len={self.max_len}, "
                             f"got prompt {shape(prompt)} and steps={steps}")
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

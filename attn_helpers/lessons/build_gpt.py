r"""Notebook 10 (build a GPT): the text, and the reference pieces of a small character-level GPT.

The data is real English that ships with Python: the help texts of ``pydoc_data.topics``, joined
in sorted key order (about 465,000 characters), read one character at a time. The first 90% (by
position) trains, the last 10% is held out.

The model is the notebook's, piece by piece, each one the code the learner writes:

* :class:`CausalSelfAttention`: ``q, k, v = x W_qkv`` split into heads, the course's own attention
  step with a causal mask, heads merged, ``W_O``. With a :class:`~attn_helpers.kv_cache.KVCache`
  holding ``start`` positions it appends the new keys and values and lets new query ``i`` attend
  to keys ``0..start+i`` (the causal mask offset by ``start``).
* :class:`Block`: pre-norm, ``x + attn(LN(x))`` then ``x + ff(LN(x))``.
* :class:`GPT`: token + position embeddings, the blocks, a final LayerNorm and the output head
  (tied to the token embedding). ``forward(tokens, start=0, caches=None)``: ``start`` is the
  position of ``tokens[:, 0]`` (the length of the cache when generating with one).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import scaled_dot_product_attention
from ..kv_cache import KVCache
from ..masks import causal_mask
from ..transformer import FeedForward

__all__ = ["Corpus", "load_corpus", "GPTConfig", "CausalSelfAttention", "Block", "GPT",
           "next_token_loss", "generate", "init_weights"]


@dataclass(frozen=True)
class Corpus:
    """The text as ids: ``train`` (first 90%) and ``val`` (last 10%), and the vocabulary."""

    chars: str            # the vocabulary, sorted; id i is chars[i]
    train: torch.Tensor   # (n_train,) long
    val: torch.Tensor     # (n_val,) long

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.chars)}
        unknown = sorted({c for c in text if c not in index})
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown!r}")
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def corpus_text() -> str:
    """The help topics of ``pydoc_data.topics``, joined in sorted key order."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


@functools.lru_cache(maxsize=1)
def load_corpus(train_share: float = 0.9) -> Corpus:
    text = corpus_text()
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(train_share * len(ids))
    return Corpus(chars, ids[:cut], ids[cut:])


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    context: int = 64        # the most positions the model reads (position embeddings)
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 4
    d_ff: int = 512


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention: ``x (b, n, d) -> (b, n, d)``."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)   # W_Q, W_K, W_V side by side
        self.out = nn.Linear(d_model, d_model)       # W_O
        self.weights = None                          # (b, h, n, n_k) when keep_weights is set
        self.keep_weights = False

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        b, n, d = x.shape
        h = self.num_heads
        q, k, v = self.qkv(x).split(d, dim=-1)                       # 3 x (b, n, d)
        q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in (q, k, v))  # (b, h, n, d_h)
        start = 0 if cache is None else len(cache)                   # position of x[:, 0]
        if cache is not None:
            cache.append(k, v)                                       # keys of 0..start+n-1
            k, v = cache.keys, cache.values                          # (b, h, start + n, d_h)
        mask = causal_mask(start + n)[start:]                        # (n, start + n): i sees 0..start+i
        out, weights = scaled_dot_product_attention(q, k, v, mask)   # (b, h, n, d_h)
        if self.keep_weights:
            self.weights = weights.detach()
        out = out.transpose(1, 2).reshape(b, n, d)                   # merge heads: (b, n, d)
        return self.out(out)


class Block(nn.Module):
    """A pre-norm Transformer block: ``x + attn(LN(x))``, then ``x + ff(LN(x))``."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, activation="gelu")

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache)      # (b, n, d)
        x = x + self.ff(self.norm2(x))               # (b, n, d)
        return x


class GPT(nn.Module):
    """Token + position embeddings, ``num_layers`` blocks, LayerNorm, output head (tied)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.num_heads, cfg.d_ff)
                                    for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight               # weight tying
        self.apply(init_weights)

    def forward(self, tokens: torch.Tensor, start: int = 0,
                caches: list[KVCache] | None = None) -> torch.Tensor:
        """``tokens (b, n)`` at positions ``start..start+n-1`` -> logits ``(b, n, vocab)``."""
        n = tokens.shape[1]
        if start + n > self.cfg.context:
            raise ValueError(f"positions {start}..{start + n - 1} go past the context "
                             f"{self.cfg.context}")
        positions = torch.arange(start, start + n)                   # (n,)
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (b, n, d)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return self.head(self.norm(x))                               # (b, n, vocab)

    def new_caches(self) -> list[KVCache]:
        return [KVCache(self.cfg.context) for _ in self.blocks]

    def keep_weights(self, keep: bool = True) -> None:
        for block in self.blocks:
            block.attn.keep_weights = keep
            block.attn.weights = None


def init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation without its 1/sqrt(2 n_layers) scaling of the residual projections:
    every weight ~ N(0, 0.02^2), biases 0."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)


def next_token_loss(model: nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of predicting ``chunk[:, 1:]`` from ``chunk[:, :-1]``."""
    inputs, targets = chunk[:, :-1], chunk[:, 1:]                    # shifted by one
    logits = model(inputs)                                           # (b, n, vocab)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, steps: int, temperature: float = 1.0,
             top_k: int | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample ``steps`` tokens after ``prompt (b, n0)``, ``n0 <= context``; returns
    ``(b, n0 + steps)``.

    With the cache, the prompt runs once and then each step runs only the new token, at its
    position ``start``; without it, each step re-runs the whole sequence from position 0. Once
    the text outgrows the context ``n_ctx``, the model reads its last ``n_ctx`` tokens at
    positions ``0..n_ctx-1`` (nanoGPT's crop): every token has moved to a new position, so every
    cached key and value is stale, and both ways re-run the window at each step.
    """
    n_ctx = model.cfg.context
    tokens = prompt
    caches = model.new_caches() if use_cache else None
    new, start = prompt, 0
    for _ in range(steps):
        logits = model(new, start, caches)[:, -1] / temperature     # (b, vocab), last position
        if top_k is not None:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]          # (b, 1): the k-th largest
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator)       # (b, 1)
        tokens = torch.cat([tokens, nxt], dim=1)
        if use_cache and tokens.shape[1] <= n_ctx:                   # the cache has room
            new, start = nxt, tokens.shape[1] - 1
        else:                                                        # no cache, or past n_ctx
            new, start, caches = tokens[:, -n_ctx:], 0, None
    return tokens

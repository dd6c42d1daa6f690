r"""Notebook 10 (build a GPT): the text (Python 3.11.7's help pages, shipped in
``data/python_help.txt``, read one character at a time; the first 90% trains), the reference GPT,
its training loop, the head scores, and the records of the studies ``studies/build_gpt_*.py``."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import scaled_dot_product_attention
from ..kv_cache import KVCache
from ..training import single_thread, torch_threads
from ..transformer import FeedForward

__all__ = ["Corpus", "load_corpus", "GPTConfig", "CausalSelfAttention", "Block", "GPT",
           "init_weights", "next_token_loss", "generate",
           "Recipe", "FINAL", "FINAL_SIZE", "NANOGPT", "BAR_NATS", "final_config", "get_batch",
           "estimate_loss", "train_step", "learning_rate", "train", "build_and_train",
           "RULES", "key_choices", "head_scores", "offset_profile", "offset_matched",
           "RUNGS", "load_record", "load_final_model", "ladder_claims", "recipe_claims",
           "single_thread"]

DATA = Path(__file__).resolve().parent.parent / "data"
CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


# --- the text ------------------------------------------------------------------------------------

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


CORPUS = Path(__file__).resolve().parent.parent / "data" / "python_help.txt"


def corpus_text() -> str:
    """Python 3.11.7's help pages, every topic of ``pydoc_data.topics`` in key order, as shipped
    (each Python release rewrites them, and the records and checkpoint are for this text)."""
    with open(CORPUS, encoding="utf-8", newline="") as f:
        return f.read()


@functools.lru_cache(maxsize=1)
def load_corpus(train_share: float = 0.9) -> Corpus:
    text = corpus_text()
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(train_share * len(ids))
    return Corpus(chars, ids[:cut], ids[cut:])


# --- the model -----------------------------------------------------------------------------------

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
        # (n, start + n), O(n L): query i (at position start + i) sees keys 0..start+i
        mask = torch.arange(start + n) <= torch.arange(start, start + n)[:, None]
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
        n = tokens.shape[1]                                          # at start..start+n-1
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
    """nanoGPT's initialisation, without its scaled residual projections: N(0, 0.02^2), biases 0."""
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
    """Sample ``steps`` tokens after ``prompt (b, n0)``, ``n0 <= context``: ``(b, n0 + steps)``.
    Past the context the model re-reads the last ``n_ctx`` tokens (nanoGPT's crop), cache or not."""
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


# --- training ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipe:
    """``steps`` AdamW steps of ``batch`` chunks; a linear warm-up to ``lr``, a cosine to ``min_lr``."""

    steps: int
    batch: int
    lr: float
    warmup: int
    min_lr: float = 0.0
    eval_every: int = 200
    betas: tuple = (0.9, 0.95)


#: The notebook's recipe: nanoGPT's CPU recipe with a 3x higher peak rate, beta2 0.95, batch 16.
FINAL = Recipe(steps=1200, batch=16, lr=3e-3, warmup=100, min_lr=3e-4, eval_every=100)
#: The final model: nanoGPT's CPU model (:class:`GPTConfig`'s default) with a feed-forward of 2d.
FINAL_SIZE = {"d_ff": 256}
#: nanoGPT's README recipe for a CPU (lr 1e-3, warmup 100, cosine to 1e-4), on GPTConfig().
NANOGPT = Recipe(steps=2000, batch=12, lr=1e-3, warmup=100, min_lr=1e-4, eval_every=2000,
                 betas=(0.9, 0.99))
#: The course's target in nats per character (about what nanoGPT's CPU settings reach here).
BAR_NATS = 1.43


def final_config(vocab_size: int) -> GPTConfig:
    return GPTConfig(vocab_size, **FINAL_SIZE)


def get_batch(data: torch.Tensor, batch: int, context: int,
              generator: torch.Generator) -> torch.Tensor:
    """``(batch, context + 1)`` chunks of ``data`` at random positions."""
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=generator)
    return torch.stack([data[s:s + context + 1] for s in starts.tolist()])


@torch.no_grad()
def estimate_loss(model: nn.Module, data: torch.Tensor, context: int,
                  windows: int | None = 100) -> float:
    """Mean next-character loss (nats) on ``windows`` evenly spaced windows (``None``: all)."""
    count = (len(data) - 1) // context
    chunks = data[: count * context + 1].unfold(0, context + 1, context)   # (count, context + 1)
    if windows is not None and windows < count:
        chunks = chunks[torch.linspace(0, count - 1, windows).long()]
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    for chunk in chunks.split(256):
        total += next_token_loss(model, chunk).item() * chunk[:, 1:].numel()
        n += chunk[:, 1:].numel()
    model.train(was_training)
    return total / n


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, chunk: torch.Tensor) -> float:
    """Exercise 3, first part: one step on ``chunk (b, n + 1)``, gradient norm clipped to 1; the loss."""
    loss = next_token_loss(model, chunk)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)                # the gradient's norm <= 1
    optimizer.step()
    return loss.item()


def learning_rate(step: int, recipe: Recipe) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)   # 0 -> 1
    return recipe.min_lr + 0.5 * (recipe.lr - recipe.min_lr) * (1 + math.cos(math.pi * progress))


def train(model: nn.Module, train_step: Callable, corpus: Corpus, recipe: Recipe,
          generator: torch.Generator, stop: int | None = None) -> list:
    """Exercise 3, second part: steps ``0..stop-1`` of ``recipe``; the curve
    ``(step, train, held-out)``."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]     # weight decay on these only
    others = [p for p in model.parameters() if p.dim() < 2]        # biases, LayerNorm gains
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                                   {"params": others, "weight_decay": 0.0}], betas=recipe.betas)
    n = model.cfg.context
    curve = []                                                       # (step, train, held-out)
    for step in range(recipe.steps if stop is None else stop):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, recipe)
        train_step(model, optimizer, get_batch(corpus.train, recipe.batch, n, generator))
        if (step + 1) % recipe.eval_every == 0:
            curve.append((step + 1, estimate_loss(model, corpus.train, n),
                          estimate_loss(model, corpus.val, n)))
    return curve


def build_and_train(recipe: Recipe = FINAL, *, seed: int = 0, threads: int = 1,
                    **config) -> tuple[GPT, list, float]:
    """A fresh :class:`GPT` (``config`` overrides the size) trained with ``recipe``: the model,
    its curve and the loop's wall seconds."""
    corpus = load_corpus()
    torch.manual_seed(seed)
    model = GPT(GPTConfig(corpus.vocab_size, **((FINAL_SIZE if recipe is FINAL else {}) | config)))
    with torch_threads(threads):
        began = time.perf_counter()
        curve = train(model, train_step, corpus, recipe, torch.Generator().manual_seed(seed))
        seconds = time.perf_counter() - began
    return model.eval(), curve, seconds


# --- heads by score (as notebook 09 scores MiniLM's) -----------------------------------------------

RULES = ("previous character", "itself", "start of the word")


def key_choices(text: str) -> dict[str, torch.Tensor]:
    """``{rule: (n,) long}``: the key each query's rule picks (``-1``: none; the word start only
    two or more characters into a word)."""
    i = torch.arange(len(text))
    word = torch.tensor([c.isalnum() or c == "_" for c in text])
    start, s = [], 0
    for pos, c in enumerate(text):
        if not (c.isalnum() or c == "_"):
            s = pos + 1
        start.append(s)
    start = torch.tensor(start)
    return {"previous character": torch.where(i >= 1, i - 1, -1), "itself": i,
            "start of the word": torch.where((i - start >= 2) & word, start, -1)}


def head_scores(weights: torch.Tensor, texts) -> dict:
    """``weights (L, h, b, n, n)`` of ``b`` texts -> ``{rule: (L, h)}`` mean weight on the rule's
    key, and ``{rule + " (uniform)": float}``, what an even spread over visible keys gets."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    L, h = weights.shape[:2]
    scores, uniform = {}, {}
    for rule in RULES:
        total, count, even = torch.zeros(L, h, dtype=torch.float64), 0, 0.0
        for j, text in enumerate(texts):
            keys = key_choices(text)[rule]
            queries = (keys >= 0).nonzero()[:, 0]
            total += weights[:, :, j, queries, keys[queries]].double().sum(-1)   # (L, h)
            count += len(queries)
            even += float((1.0 / (queries + 1).double()).sum())
        scores[rule] = total / max(count, 1)
        uniform[rule + " (uniform)"] = even / max(count, 1)
    return scores | uniform


def offset_profile(weights: torch.Tensor, distances: int | None = None) -> torch.Tensor:
    """``(L, h, distances)``: each head's mean weight on the key ``o = 0, 1, ...`` characters back."""
    n = weights.shape[-1]
    return torch.stack([weights[..., torch.arange(o, n), torch.arange(o, n) - o].double()
                        .mean((-1, -2)) for o in range(distances or n)], -1)


def offset_matched(weights: torch.Tensor, texts) -> torch.Tensor:
    """``(L, h)``: mean weight on the word start over mean weight on any key as far back."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    profile = offset_profile(weights)                                       # (L, h, n)
    got = torch.zeros(profile.shape[:2], dtype=torch.float64)
    base = torch.zeros_like(got)
    for j, text in enumerate(texts):
        keys = key_choices(text)["start of the word"]
        q = (keys >= 0).nonzero()[:, 0]
        got += weights[:, :, j, q, keys[q]].double().sum(-1)
        base += profile[:, :, q - keys[q]].sum(-1)
    return got / base


# --- the studies' records --------------------------------------------------------------------------

RUNGS = ("bigram", "one head", "multi-head", "feed-forward", "residual + LayerNorm", "depth")


def load_record(name: str) -> dict:
    """A study's record (``"build_gpt_ladder"``, ``"..._nanogpt_bar"``, ``"..._final_seeds"``)."""
    if name == "build_gpt_ladder":
        return torch.load(CHECKPOINTS / f"{name}.pt", weights_only=True)["metadata"]
    record = json.loads((DATA / f"{name}.json").read_text())
    record["mean"] = sum(record["nats"]) / len(record["nats"])
    return record


def load_final_model(vocab_size: int) -> GPT:
    """Seed 0 of ``studies/build_gpt_final_seeds.py`` (stored in float16), as float32."""
    model = GPT(final_config(vocab_size))
    state = torch.load(CHECKPOINTS / "build_gpt_final.pt", weights_only=True)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()


def ladder_claims(results: dict) -> dict:
    """The notebook's claims about the ladder (``studies/build_gpt_ladder.py``)."""
    bits = {rung: sum(v) / len(v) for rung, v in results["bits"].items()}
    spread = max(max(v) - min(v) for v in results["bits"].values())
    drops = [bits[a] - bits[b] for a, b in zip(RUNGS, RUNGS[1:], strict=False)]
    return {
        f"under the ladder's one recipe, every rung lowers the held-out loss (mean over "
        f"{len(results['seeds'])} seeds)": all(s > 0 for s in drops),
        "one head beats the counted bigram for every seed":
            max(results["bits"]["one head"]) < bits["bigram"],
        "from one head on, each drop is larger than the largest seed-to-seed spread":
            all(s > spread for s in drops[1:]),
        "depth gives the largest single drop": drops[-1] == max(drops),
        "the deep model is at least 0.8 bits per character below the bigram":
            bits["bigram"] - bits["depth"] >= 0.8,
    }


def recipe_claims(seeds: dict, bar: dict) -> dict:
    """The notebook's claims about the final recipe's seeds and nanoGPT's settings on this GPT."""
    return {
        f"the final recipe reaches at most {BAR_NATS} nats per character held out for each of "
        f"seeds {seeds['seeds']} (worst {max(seeds['nats']):.2f})": max(seeds["nats"]) <= BAR_NATS,
        f"nanoGPT's CPU settings on this course's GPT also reach at most {BAR_NATS} (seeds "
        f"{bar['seeds']}, worst {max(bar['nats']):.2f})": max(bar["nats"]) <= BAR_NATS,
        f"the final recipe trains on fewer characters than nanoGPT's settings "
        f"({seeds['recipe']['steps'] * seeds['recipe']['batch']:,} against "
        f"{bar['recipe']['steps'] * bar['recipe']['batch']:,} chunks)":
            seeds["recipe"]["steps"] * seeds["recipe"]["batch"]
            < bar["recipe"]["steps"] * bar["recipe"]["batch"],
    }

"""What the heads of notebook 10's GPT learned, by score (as notebook 09 scores MiniLM's heads).

For every head, the mean weight its queries put on one key chosen by a rule:

* ``previous character``: key ``i - 1`` (queries ``i >= 1``);
* ``itself``: key ``i``;
* ``start of the word``: the first character of the query's word (queries at least two
  characters into a word, so the rule differs from the two above);
* ``first position``: key 0 (queries ``i >= 1``), the sink notebook 09 saw on ``[CLS]``.

Each score is compared with what a head spreading its weight evenly over the visible keys would
get on the same queries (the ``uniform`` baseline).
"""

from __future__ import annotations

import torch

from .build_gpt import GPT, Corpus

__all__ = ["RULES", "key_choices", "head_scores", "held_out_attention", "head_report", "head_claims"]

RULES = ("previous character", "itself", "start of the word", "first position")


def key_choices(text: str) -> dict[str, torch.Tensor]:
    """``{rule: (n,) long}``: the key each query's rule picks, ``-1`` where it does not apply."""
    n = len(text)
    i = torch.arange(n)
    start, s = [], 0
    for pos, c in enumerate(text):
        if not (c.isalnum() or c == "_"):
            s = pos + 1
        start.append(s)
    start = torch.tensor(start)
    word = torch.where((i - start >= 2) & torch.tensor([c.isalnum() or c == "_" for c in text]),
                       start, -1)
    return {"previous character": torch.where(i >= 1, i - 1, -1), "itself": i,
            "start of the word": word, "first position": torch.where(i >= 1, 0, -1)}


def head_scores(weights: torch.Tensor, texts) -> dict[str, torch.Tensor]:
    """``weights (L, h, b, n, n)`` of ``b`` texts (a str or a list of ``b`` str) ->
    ``{rule: (L, h)}`` mean weight on the rule's key, plus ``{rule + " (uniform)": float}``."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    L, h, b, n, _ = weights.shape
    scores = {}
    for rule in RULES:
        total, count, uniform = torch.zeros(L, h, dtype=torch.float64), 0, 0.0
        for j, text in enumerate(texts):
            keys = key_choices(text)[rule]
            queries = (keys >= 0).nonzero()[:, 0]
            if len(queries):
                picked = weights[:, :, j, queries, keys[queries]].double()   # (L, h, q)
                total += picked.sum(-1)
                count += len(queries)
                uniform += float((1.0 / (queries + 1).double()).sum())
        scores[rule] = total / max(count, 1)
        scores[rule + " (uniform)"] = uniform / max(count, 1)
    return {k: v for k, v in scores.items() if not k.endswith("(uniform)")} | {
        k: v for k, v in scores.items() if k.endswith("(uniform)")}


@torch.no_grad()
def held_out_attention(model: GPT, corpus: Corpus, windows: int = 48):
    """Every head's weights on ``windows`` evenly spaced held-out windows of the model's
    context: ``(weights (L, h, b, n, n), texts)``."""
    n = model.cfg.context
    starts = torch.linspace(0, len(corpus.val) - n - 1, windows).long().tolist()
    ids = torch.stack([corpus.val[s:s + n] for s in starts])
    model.keep_weights(True)
    try:
        model(ids)
        weights = torch.stack([block.attn.weights for block in model.blocks])  # (L, b, h, n, n)
    finally:
        model.keep_weights(False)
    return weights.transpose(1, 2), [corpus.decode(row) for row in ids]


def head_report(model: GPT, corpus: Corpus) -> dict:
    """For each rule the best head ``(layer, head)`` (1-based), its score and the uniform
    baseline, on the held-out windows."""
    weights, texts = held_out_attention(model, corpus)
    scores = head_scores(weights, texts)
    report = {}
    for rule in RULES:
        grid = scores[rule]
        flat = int(grid.argmax())
        l, i = divmod(flat, grid.shape[1])
        report[rule] = {"head": (l + 1, i + 1), "score": float(grid[l, i]),
                        "uniform": scores[rule + " (uniform)"], "grid": grid}
    return report


def head_claims(report: dict) -> dict:
    """The notebook's sentences about the trained model's heads, each a bool."""
    prev, word = report["previous character"], report["start of the word"]
    return {
        "one head puts over 3x a uniform head's weight on the previous character":
            prev["score"] > 3 * prev["uniform"],
        "one head puts over 1.5x a uniform head's weight on the first character of the word":
            word["score"] > 1.5 * word["uniform"],
    }

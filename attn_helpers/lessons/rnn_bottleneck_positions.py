"""Notebook 01's output positions on three seeds: the record of ``studies/seq2seq_positions.py``
(:func:`by_position` at 24 digits for each no-attention model), the claims notebook 01 and the study
assert on it, and the figures of notebook 01's sections 4 and 5.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from .rnn_bottleneck import predict
from .tasks import EOS

__all__ = ["RECORD", "load_record", "by_position", "main_claims", "deeper_claims", "claims",
           "plot_by_length", "plot_by_position", "plot_gradients"]

#: ``{"narrow" (seeds 0, 1, 2) | "control" (seed 0): {seed: by_position(...) at n = 24}}``
RECORD = Path(__file__).resolve().parent.parent / "data" / "seq2seq_positions.json"


def load_record() -> dict:
    """The shipped record (``studies/seq2seq_positions.py`` re-creates it)."""
    return json.loads(RECORD.read_text())


def by_position(model, test) -> dict:
    """On ``test`` (sequences of one length n), by output position t: the share right, greedy and
    teacher-forced, and the share of greedy ``</s>``; of the wrong outputs (greedy, teacher-forced),
    the share that is target t+1 and the share that is target t-1."""
    n = test.src.shape[1]
    digits = test.tgt_out[:, :n]                                            # (b, n)
    greedy = predict(model, test)[0]                                        # (b, n)
    with torch.no_grad():                          # teacher forcing: step t reads the true y_<t
        forced = model(test.src, test.src_lengths, test.tgt_in)[0].argmax(-1)[:, :n]

    def skips(y):                                  # of the wrong outputs: target t+1, target t-1
        wrong = y != digits                                                 # (b, n)
        pairs = ((y[:, :-1] == digits[:, 1:], wrong[:, :-1]), (y[:, 1:] == digits[:, :-1], wrong[:, 1:]))
        return [round(((hit & miss).sum() / miss.sum()).item(), 4) for hit, miss in pairs]

    def share(hits):
        return [round(v, 4) for v in hits.float().mean(0).tolist()]
    return {"greedy": share(greedy == digits), "forced": share(forced == digits),
            "end": share(greedy == EOS), "skip_greedy": skips(greedy), "skip_forced": skips(forced)}


def _mean(values: list, part: slice) -> float:
    return sum(values[part]) / len(values[part])


def _runs(record: dict) -> tuple[list, str]:
    runs = [*record["narrow"].values(), *record["control"].values()]
    return runs, f"n = 24, no attention (seeds {', '.join(record['narrow'])}) and the parameter control"


def main_claims(record: dict) -> dict[str, bool]:
    """Notebook 01's section 4 on ``record``: teacher-forced, accuracy still falls with t."""
    runs, which = _runs(record)
    return {
        f"{which}, teacher-forced: the first 3 outputs > 0.8 right, the last 8 < 0.6, yet > 0.2 above "
        "greedy": all(_mean(p["forced"], slice(0, 3)) > 0.8 and _mean(p["forced"], slice(-8, None)) < 0.6
                      and _mean(p["forced"], slice(-8, None)) > _mean(p["greedy"], slice(-8, None)) + 0.2
                      for p in runs),
    }


def deeper_claims(record: dict) -> dict[str, bool]:
    """Notebook 01's Going deeper on ``record``: the greedy fall and what the wrong outputs are.
    Chance: a wrong digit drawn from the other nine equals a neighbouring target 0.9 x 1/9 = 0.1."""
    runs, which = _runs(record)
    return {
        f"{which}, greedy: the first 3 outputs > 0.7 right, the last 8 < 0.3, the last one < 0.1":
            all(_mean(p["greedy"], slice(0, 3)) > 0.7 and _mean(p["greedy"], slice(-8, None)) < 0.3
                and p["greedy"][-1] < 0.1 for p in runs),
        f"{which}: the last output is </s> in 0.4 to 0.9 of the examples":
            all(0.4 < p["end"][-1] < 0.9 for p in runs),
        f"{which}, teacher-forced: of the wrong outputs (t < n-1), over half are target t+1; of those "
        "at t > 0, < 0.15 are target t-1": all(p["skip_forced"][0] > 0.5 and p["skip_forced"][1] < 0.15
                                                for p in runs),
        f"{which}, greedy: of the wrong outputs, > 0.15 are target t+1 and > 0.15 target t-1 (1.5x "
        "chance, 0.1)": all(min(p["skip_greedy"]) > 0.15 for p in runs),
    }


def claims(record: dict) -> dict[str, bool]:
    """Every statement notebook 01 makes on ``record``: ``{statement: holds}``."""
    return {**main_claims(record), **deeper_claims(record)}


def plot_by_length(accuracy: dict, record: dict) -> None:
    """Section 4: greedy token accuracy by input length n of the checkpoints (``accuracy``:
    ``{model: {n: share}}``) and of the study's runs (``record``): seeds 1, 2, the context x4."""
    _, ax = plt.subplots(figsize=(7, 3.8))
    for (name, acc), style in zip(accuracy.items(), ["o-", "s-", "^--"], strict=True):
        ax.plot(list(acc), list(acc.values()), style, label=name, markersize=5)
    for kind, color in (("narrow", "C0"), ("attention", "C1")):   # seed 0: the checkpoints
        for seed in ("1", "2"):
            acc = record[kind][seed]["accuracy"]
            ax.plot([int(n) for n in acc], list(acc.values()), "-", color=color, linewidth=0.8,
                    alpha=0.6, label="the same two models, seeds 1 and 2" if
                    (kind, seed) == ("narrow", "1") else None)
    for seed, row in record["wide"].items():
        acc = row["accuracy"]
        ax.plot([int(n) for n in acc], list(acc.values()), ":", color="#cc79a7", marker="v",
                markersize=4, label=f"no attention, context x4 ({len(record['wide'])} seeds)"
                if seed == "0" else None)
    ax.axhline(0.1, color="grey", linestyle=":", label="chance (1 digit in 10)")
    ax.set(xlabel="input length n (tokens)", ylabel="token accuracy", ylim=(0, 1.02),
           xticks=range(4, 25, 4), title="reversal: greedy token accuracy by input length")
    ax.legend(fontsize=8)
    plt.show()


def plot_by_position(greedy, forced, end) -> None:
    """Section 4: by output position t, the share right (greedy bars, teacher-forced line) and
    the share of ``</s>`` (crosses), each ``(n,)``."""
    n = len(greedy)
    _, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(range(n), greedy, color="#3b75af", label="token accuracy, greedy")
    ax.plot(range(n), forced, ".-", color="#009e73", label="token accuracy, teacher-forced")
    ax.plot(range(n), end, "x", color="#d55e00", label="share that is </s>")
    ax.axhline(0.1, color="grey", linestyle=":", label="chance (1 digit in 10)")
    ax.set(xlabel="output position t (copies input n-1-t)", ylabel="share of the 100 examples",
           ylim=(0, 1.02), title=f"no attention (seed 0), n = {n}: accuracy by output position")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    plt.show()


def plot_gradients(untrained: dict) -> None:
    """Section 5: ``{model: [(n,) per seed]}``, the gradient from output t to the digit it copies."""
    _, ax = plt.subplots(figsize=(7, 3.8))
    for (name, per_seed), color in zip(untrained.items(), ["#3b75af", "#e69f00"], strict=True):
        for seed, gradient in enumerate(per_seed):
            ax.semilogy(gradient, color=color, alpha=0.8, label=name if seed == 0 else None)
    ax.set(xlabel="output position t (copies input n-1-t)", ylabel="gradient norm (log scale)",
           title=f"untrained, {len(per_seed)} seeds each: |d log p(y_t) / d x_(n-1-t)|")
    ax.legend(fontsize=8)
    plt.show()

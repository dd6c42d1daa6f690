"""Notebook 09's head ablation (Going deeper's null control and swap gap): each of
all-MiniLM-L6-v2's 72 heads switched off alone, and each of its 6 layers' heads switched off
together, 78 variants.

The 112 sentences are the notebook's: 24 queries, their 24 partners and 16 decoys (the
paraphrase-retrieval control), and the 48 further sentences of Going deeper's pairs (all 24
triples' passives and role swaps). Each variant's sentence embeddings come from
rm.ablated_embeddings itself (zero ablation: a head's output times 0 before W_O), on one thread,
as the notebook ran it.
Records, in attn_helpers/data/real_model_ablation.json, all the notebook reads from the embeddings:
- per query, its margin (the partner's cosine minus the best other candidate's among the 40), with
  all heads on (24,) and per variant (6, 13, 24): [l][0] layer l + 1 off, [l][1 + i] head i + 1 off;
- per pair (32 paraphrase pairs, then 32 others: the shipped ones, then 24 role swaps), its cosine,
  with all heads on (64,) and per variant (6, 13, 64);
- the sentences, the queries, the candidates and the pairs, so the notebook can check they are its own.
Values are rounded to 6 decimals (another CPU moves them by about 1e-6).
Asserts the claims notebook 09 makes on these numbers that need no resampling (it asserts them
again on the shipped record, with its resampled ones, in view), and that a re-run agrees with the
shipped record within 1e-4.
Re-run: python3 course.py studies real_model_ablation   (37 s CPU; 95-195 s wall on 2 busy cores)
"""
import json
import time
from pathlib import Path

import torch

from attn_helpers.lessons import real_model as rm
from attn_helpers.pretrained import load_encoder

RECORDS = ["attn_helpers/data/real_model_ablation.json"]
RECORD = Path(__file__).resolve().parent.parent / RECORDS[0]


def sentences(data: dict) -> dict:
    """The notebook's lists, built as in its cells (retrieval control, then swap gap)."""
    triples = rm.TRIPLES[:16]
    queries = [a for a, _ in data["paraphrases"]] + [f"The {a} {v} the {b}." for a, v, b in triples]
    partners = ([b for _, b in data["paraphrases"]]
                + [f"The {b} was {v} by the {a}." for a, v, b in triples])
    decoys = [f"The {b} was {rm.TRIPLES[k + 1][1]} by the {a}." for k, (a, _, b) in enumerate(triples)]
    actives = [f"The {a} {v} the {b}." for a, v, b in rm.TRIPLES]              # all 24 triples
    passive = [[s, f"The {b} was {v} by the {a}."]
               for s, (a, v, b) in zip(actives, rm.TRIPLES, strict=True)]
    swapped = [[s, f"The {b} {v} the {a}."] for s, (a, v, b) in zip(actives, rm.TRIPLES, strict=True)]
    pairs = data["paraphrases"] + passive + data["non_paraphrases"] + swapped
    texts = queries + partners + decoys
    extra = sorted({s for pair in pairs for s in pair} - set(texts))
    return {"queries": queries, "candidates": partners + decoys, "pairs": pairs,
            "sentences": texts + extra}


def margins(e: torch.Tensor, Q: int, C: int) -> torch.Tensor:
    """(..., s, d) unit embeddings, queries then candidates -> (..., Q): as the notebook's margins."""
    cos = e[..., :Q, :] @ e[..., Q:Q + C, :].transpose(-1, -2)          # (..., Q, C)
    others = cos.masked_fill(torch.eye(Q, C, dtype=torch.bool), -2.0)  # partner k is candidate k
    return cos.diagonal(dim1=-2, dim2=-1) - others.amax(dim=-1)


def measure(enc, lists: dict) -> dict:
    every, Q, C = lists["sentences"], len(lists["queries"]), len(lists["candidates"])
    on, off = rm.ablated_embeddings(enc, every)                         # (s, d), (L, 1 + h, s, d)
    ia, ib = (torch.tensor([every.index(pair[k]) for pair in lists["pairs"]]) for k in (0, 1))
    rounded = lambda t: torch.round(t.double(), decimals=6).tolist()   # noqa: E731
    return {**lists,
            "margin_on": rounded(margins(on, Q, C)), "margin_off": rounded(margins(off, Q, C)),
            "pair_cosine_on": rounded((on[ia] * on[ib]).sum(-1)),
            "pair_cosine_off": rounded((off[:, :, ia] * off[:, :, ib]).sum(-1))}


def claims(record: dict) -> dict[str, bool]:
    """The claims of notebook 09 on this record that need no resampling (it asserts them again)."""
    m_on, m_off = torch.tensor(record["margin_on"]), torch.tensor(record["margin_off"])
    on, off = torch.tensor(record["pair_cosine_on"]), torch.tensor(record["pair_cosine_off"])
    change = m_off.mean(-1) - m_on.mean()                               # (L, 1 + h)
    shipped, n_p = 8, 32                                # the pairs: 8 shipped, 24 passives; 8, 24 others
    passives, swaps = slice(shipped, n_p), slice(n_p + shipped, 2 * n_p)
    g_swap = on[passives].mean() - on[swaps].mean()
    swap = off[..., passives].mean(-1) - off[..., swaps].mean(-1) - g_swap  # (L, 1 + h) change
    easy = (off[..., :shipped].mean(-1) - off[..., n_p:n_p + shipped].mean(-1)
            - (on[:shipped].mean() - on[n_p:n_p + shipped].mean()))
    passive_part = off[:, 0, passives].mean(-1) - on[passives].mean()   # (L,) a layer off
    swap_part = off[:, 0, swaps].mean(-1) - on[swaps].mean()
    return {
        "every partner ranks first with all heads on": bool((m_on > 0).all()),
        "no single head, switched off, lowers the mean margin by more than 0.02":
            float(change[:, 1:].min()) > -0.02,
        "every whole layer, switched off, lowers it more than any single head":
            bool((change[:, 0] < change[:, 1:].min()).all()),
        "in all 24 triples the role swap is more similar than the passive":
            bool((on[passives] < on[swaps]).all()),
        "no single head, switched off, changes g_swap by more than 0.004":
            bool((swap[:, 1:].abs() < 0.004).all()),
        "layers 1, 2 and 6, each off, move g_swap more than any single head":
            bool((swap[[0, 1, 5], 0].abs() > swap[:, 1:].abs().max()).all()),
        "layers 1, 2 and 6, each off, lower g_swap by 0.005 to 0.015":
            bool(((swap[[0, 1, 5], 0] < -0.005) & (swap[[0, 1, 5], 0] > -0.015)).all()),
        "layer 5, switched off, raises g_swap": float(swap[4, 0]) > 0,
        "layers 1 and 6, each off, lower the passives' cosine by 0.005 to 0.015, the swaps' by < 0.002":
            bool(((passive_part[[0, 5]] < -0.005) & (passive_part[[0, 5]] > -0.015)
                  & (swap_part[[0, 5]].abs() < 0.002)).all()),
        "layer 2 off lowers the passives' cosine and raises the swaps'":
            float(passive_part[1]) < 0 < float(swap_part[1]),
        "layer 5 off raises both cosines, the passives' more":
            float(passive_part[4]) > float(swap_part[4]) > 0,
        "layers 3 to 5, each off, move g_swap by under 0.004": bool((swap[2:5, 0].abs() < 0.004).all()),
        "no layer or head, switched off, makes g_swap positive": bool((swap + g_swap < 0).all()),
        "every shipped paraphrase is more similar than every shipped non-paraphrase, with any one "
        "layer or head off":
            bool((off[..., :shipped].amin(-1) > off[..., n_p:n_p + shipped].amax(-1)).all()),
        "the last layer's heads off lower g_easy most": int(easy[:, 0].argmin()) == 5,
        "no single head, switched off, changes g_easy by more than 0.02":
            bool((easy[:, 1:].abs() < 0.02).all()),
    }


def main():
    torch.set_num_threads(1)                             # as notebook 09 runs it
    enc = load_encoder()
    began = time.monotonic()
    record = measure(enc, sentences(rm.load_sentences()))
    print(f"{time.monotonic() - began:.0f} s for {len(record['sentences'])} sentences, 78 variants")
    for claim, holds in claims(record).items():
        print("✓" if holds else "✗", claim)
    assert all(claims(record).values()), "a claim of notebook 09 fails on the fresh study"
    if RECORD.exists():                                  # cosines: about 1e-6 apart across CPUs
        old = json.loads(RECORD.read_text())
        for key in ("queries", "candidates", "pairs", "sentences"):
            assert record[key] == old[key], f"the study's {key} changed: re-execute notebook 09"
        for key in ("margin_on", "margin_off", "pair_cosine_on", "pair_cosine_off"):
            gap = (torch.tensor(record[key]) - torch.tensor(old[key])).abs().max()
            assert gap <= 1e-4, f"{key}: the fresh record differs from the shipped one by {gap:.2g}"
    RECORD.write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()

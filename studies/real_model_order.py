"""Notebook 09's word-order ablation (section 4.6): how much all-MiniLM-L6-v2's sentence embedding
notices word order, with each of its 72 heads switched off alone (and each layer's 12 together).

Order sensitivity of a sentence: 1 - cos(its embedding, the embedding of its words shuffled). The 40
sentences: the 12 shipped ones and 28 drawn from rm.template_sentences's grid; 3 shuffles of each.
One generator, seed 1, draws the 28 sentences and then the shuffles; rm.order_sensitivity computes
every variant through rm.ablated_embeddings (zero ablation), on one thread.
Records, in attn_helpers/data/real_model_order.json: the sentences and their shuffles' sensitivity,
with all heads on (3, 40) and per variant (6, 13, 3, 40): [l][0] layer l + 1 off, [l][1 + i] head
i + 1 off (rounded to 6 decimals); and L1H3's rank among the 72 heads on 1,000 resamples of
the sentences and of the shuffles (generator seed 0), as the notebook recomputes them.
Claims (asserted here and again in the notebook, threshold in view): L1H3 (layer 1, head 3), the
previous-token head of 4.3, switched off, lowers the mean order sensitivity most of all 72 heads; it
ranks first in >= 85% of the resamples and among the first 3 in >= 99%. A re-run must agree with
the shipped record within 1e-4.
Re-run: python3 course.py studies real_model_order   (74 s CPU; 6 min wall on 2 busy cores)
"""
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attn_helpers.lessons import real_model as rm
from attn_helpers.pretrained import load_encoder

RECORDS = ["attn_helpers/data/real_model_order.json"]
RECORD = Path(__file__).resolve().parent.parent / RECORDS[0]
HEAD = (0, 2)                                            # layer 1, head 3 (0-based): 4.3's head


def ranks(record: dict, R: int = 1000) -> tuple[int, torch.Tensor]:
    """L1H3's rank by the fall of the mean sensitivity (1 = largest fall), on the record and on
    ``R`` resamples of the sentences and the shuffles; as the notebook's cell."""
    on, off = (torch.tensor(record[f"sensitivity_{k}"], dtype=torch.float64) for k in ("on", "off"))
    k, s = on.shape
    fall = off[:, 1:].mean((-1, -2)) - on.mean()                       # (L, h): change, one head off
    gb = torch.Generator().manual_seed(0)
    cs, ck = (F.one_hot(torch.randint(n, (R, n), generator=gb), n).sum(1).double() for n in (s, k))
    boot = (torch.einsum("lhks,rk,rs->rlh", off[:, 1:], ck, cs)
            - torch.einsum("ks,rk,rs->r", on, ck, cs)[:, None, None])   # (R, L, h), times k s
    boot_rank = (boot.flatten(1) < boot[:, HEAD[0], HEAD[1], None]).sum(1) + 1   # (R,)
    return int((fall < fall[HEAD]).sum()) + 1, boot_rank


def claims(record: dict) -> dict[str, bool]:
    rank, boot_rank = ranks(record)
    return {"L1H3 off lowers the mean order sensitivity most of all 72 heads": rank == 1,
            "... first in >= 85% of 1,000 resamples": float((boot_rank == 1).double().mean()) >= 0.85,
            "... among the first 3 in >= 99%": float((boot_rank <= 3).double().mean()) >= 0.99}


def main():
    torch.set_num_threads(1)                             # as notebook 09 runs its encoder
    enc, g = load_encoder(), torch.Generator().manual_seed(1)
    sentences = rm.load_sentences()["sentences"] + rm.template_sentences(g, 28)
    began = time.process_time()
    on, off = rm.order_sensitivity(enc, sentences, g, 3)                # (3, 40), (6, 13, 3, 40)
    print(f"{time.process_time() - began:.0f} s CPU for {len(sentences)} sentences x 4, 78 variants")
    rounded = lambda t: torch.round(t.double(), decimals=6).tolist()   # noqa: E731
    record = {"sentences": sentences, "sensitivity_on": rounded(on), "sensitivity_off": rounded(off)}
    _, boot_rank = ranks(record)
    record["resample_rank"] = boot_rank.tolist()
    print(f"all heads on: {on.mean():.3f}; L1H3's rank in the resamples: first in "
          f"{(boot_rank == 1).double().mean():.3f}, top 3 in {(boot_rank <= 3).double().mean():.3f}")
    for claim, holds in claims(record).items():
        print("✓" if holds else "✗", claim)
    assert all(claims(record).values()), "a claim of notebook 09 fails on the fresh study"
    if RECORD.exists():                                  # about 1e-6 apart across CPUs
        old = json.loads(RECORD.read_text())
        assert record["sentences"] == old["sentences"], "the sentences changed: re-execute notebook 09"
        for key in ("sensitivity_on", "sensitivity_off"):
            gap = (torch.tensor(record[key]) - torch.tensor(old[key])).abs().max()
            assert gap <= 1e-4, f"{key}: the fresh record differs from the shipped one by {gap:.2g}"
    RECORD.write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()

"""Notebook 01's wide-context control: the record of ``studies/seq2seq_wide_context.py`` and the
claims that notebook 01 and the study assert on it.

The study trains notebook 01's no-attention model with a context vector of 256 numbers instead of
64 (``d_enc = 128``), on three seeds, and scores it beside the shipped 64-number models without and
with attention. This module stays apart from :mod:`.rnn_bottleneck` because the studies that train
the shipped checkpoints import that one: an edit there re-trains them.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["RECORD", "load_record", "claims"]

#: ``{"narrow" | "attention" | "wide": {seed: {"accuracy": {n: share}, "parameters", "context",
#: ("final_loss")}}}``; the accuracy is the greedy token accuracy on 100 test sequences of length n
RECORD = Path(__file__).resolve().parent.parent / "data" / "seq2seq_wide_context.json"


def load_record() -> dict:
    """The shipped record (``studies/seq2seq_wide_context.py`` re-creates it)."""
    return json.loads(RECORD.read_text())


def claims(record: dict) -> dict[str, bool]:
    """Notebook 01's statements about the wide-context control, on ``record``: a context vector
    four times wider helps the no-attention model, but does not close its gap to attention."""
    wide = [row["accuracy"] for row in record["wide"].values()]
    narrow, attention = record["narrow"]["0"]["accuracy"], record["attention"]["0"]["accuracy"]
    seeds = ", ".join(record["wide"])
    return {
        f"c = 256, seeds {seeds}: each gets >= 0.9 of the tokens right up to 12 digits (c = 64 "
        "without attention: < 0.75 at 12)": narrow["12"] < 0.75
        and all(acc[str(n)] >= 0.9 for acc in wide for n in range(4, 13)),
        f"c = 256, seeds {seeds}: at 24 digits each is >= 0.15 more accurate than c = 64":
            all(acc["24"] - narrow["24"] >= 0.15 for acc in wide),
        f"c = 256, seeds {seeds}: yet at 24 digits each is >= 0.3 below the attention model":
            all(attention["24"] - acc["24"] >= 0.3 for acc in wide),
    }

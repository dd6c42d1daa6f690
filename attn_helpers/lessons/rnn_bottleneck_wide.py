"""Notebook 01's controls: the record of ``studies/seq2seq_wide_context.py`` (three seeds of each
model, and a context vector of 256 numbers) and the claims notebook 01 and the study assert on it.
Kept apart from :mod:`.rnn_bottleneck`, whose edits re-train the shipped checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["RECORD", "load_record", "claims"]

#: ``{"narrow" | "attention" | "wide": {seed: {"accuracy": {n: share}, "parameters", "context",
#: ("final_loss", "loss_per_100_steps") for the runs the study trained}}}``
RECORD = Path(__file__).resolve().parent.parent / "data" / "seq2seq_wide_context.json"


def load_record() -> dict:
    """The shipped record (``studies/seq2seq_wide_context.py`` re-creates it)."""
    return json.loads(RECORD.read_text())


def claims(record: dict) -> dict[str, bool]:
    """Notebook 01's statements on ``record``: ``{statement: holds}``."""
    acc = {kind: {seed: row["accuracy"] for seed, row in rows.items()} for kind, rows in record.items()}
    narrow, attention, wide = acc["narrow"].values(), acc["attention"].values(), acc["wide"].values()
    seeds = {kind: ", ".join(rows) for kind, rows in acc.items()}
    return {
        f"attention, seeds {seeds['attention']}: >= 0.95 of the tokens right at every length":
            all(min(a.values()) >= 0.95 for a in attention),
        f"no attention (c = 64), seeds {seeds['narrow']}: < 0.4 at 24 digits, each":
            all(a["24"] < 0.4 for a in narrow),
        f"c = 256, seeds {seeds['wide']}: each gets >= 0.9 of the tokens right up to 12 digits (c = "
        "64, every seed: < 0.75 at 12)": all(a["12"] < 0.75 for a in narrow)
        and all(a[str(n)] >= 0.9 for a in wide for n in range(4, 13)),
        f"c = 256, seeds {seeds['wide']}: at 24 digits each is >= 0.15 more accurate than every "
        "c = 64 seed": all(w["24"] - a["24"] >= 0.15 for w in wide for a in narrow),
        f"c = 256, seeds {seeds['wide']}: yet at 24 digits each is >= 0.3 below every attention "
        "seed": all(a["24"] - w["24"] >= 0.3 for w in wide for a in attention),
    }

"""Notebook 01's longer budget: the record of ``studies/seq2seq_long_budget.py`` (the no-attention
model trained for three times the steps) and the claims notebook 01 and the study assert on it.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["RECORD", "load_record", "claims"]

#: ``{"steps": 4200, "narrow" (c = 64; seeds 0, 1): {seed: {"accuracy": {n: share},
#: "positions": by_position at n = 24, "final_loss", "loss_per_100_steps"}}}``
RECORD = Path(__file__).resolve().parent.parent / "data" / "seq2seq_long_budget.json"


def load_record() -> dict:
    """The shipped record (``studies/seq2seq_long_budget.py`` re-creates it)."""
    return json.loads(RECORD.read_text())


def claims(record: dict, short: dict) -> dict[str, bool]:
    """Notebook 01's statements on ``record``, against ``short``, the 1,400-step record of
    ``studies/seq2seq_wide_context.py``: ``{statement: holds}``."""
    narrow = [row["accuracy"] for row in record["narrow"].values()]
    attention = [row["accuracy"] for row in short["attention"].values()]
    which = f"c = 64, seeds {', '.join(record['narrow'])}, {record['steps']:,} steps"
    return {
        f"{which}: accuracy at 24 digits is >= 0.2 below that at 7 digits, each":
            all(a["7"] - a["24"] >= 0.2 for a in narrow),
        f"{which}: at 24 digits, each is >= 0.3 below every attention seed at 1,400 steps":
            all(b["24"] - a["24"] >= 0.3 for a in narrow for b in attention),
    }

"""Notebook 07's trained models: the offset-copy task under five position schemes, three seeds.

Trains `PositionTaskModel` (one causal attention layer, 3 heads of 8, 1200 Adam steps on lengths
8-16, one CPU thread) for every scheme (none, sinusoidal, learned, rope, alibi) on seeds 0, 1, 2,
and RoPE with the bases 625 and 160000 on the same seeds: 21 models in one checkpoint, with each
model's accuracy at 16, 32 and 64 tokens in its metadata. The notebook measures and asserts its
claims on the shipped models (sections 6 and Going deeper); this study asserts section 6's claims
(`offsets_claims`) on the fresh models, checks that they reproduce the shipped accuracies within
0.02 (any CPU), then writes the checkpoint.
Re-run: python3 course.py studies positional_offsets      (about 3-5 minutes on an idle 2-core CPU)
"""
from pathlib import Path

from torch import nn

from attn_helpers.lessons import positional_encoding as tasks
from attn_helpers.training import save_checkpoint

RECORDS = ["attn_helpers/checkpoints/positional_offsets.pt"]


def accuracy_at(curve, n):
    """Mean accuracy over positions 0 .. n-1 and both offsets: a sequence of n tokens."""
    return round(curve[:n].nanmean().item(), 4)


def offsets_claims(curves):
    """Notebook 07's section-6 claims (cell after its table), on ``curves``: model key -> (64
    positions, 2 offsets) accuracies, as `tasks.position_accuracy` returns them."""
    def by_seed(scheme, first, end, j=None):   # each seed's mean on positions first .. end - 1
        parts = [curves[tasks.model_key(scheme, seed)][first:end] for seed in tasks.SEEDS]
        return [(part if j is None else part[:, j]).nanmean().item() for part in parts]

    absolute = ("sinusoidal", "learned")
    return {
        "positions are needed: on positions 0-15, sinusoidal, learned and RoPE above 0.95, none "
        "below 0.5 (every seed)": min(min(by_seed(s, 0, 16)) for s in (*absolute, "rope")) > 0.95
            and max(by_seed("none", 0, 16)) < 0.5,
        "learned and sinusoidal: every seed below 0.35 on positions 16-31":
            max(max(by_seed(s, 16, 32)) for s in absolute) < 0.35,
        "RoPE, each offset: every seed above 0.85 on positions 16-31, below 0.3 on 32-63":
            all(min(by_seed("rope", 16, 32, j)) > 0.85 and max(by_seed("rope", 32, 64, j)) < 0.3
                for j in range(len(tasks.OFFSETS))),
        "1 back, positions 32-63: ALiBi's worst seed beats every seed of every other model":
            min(by_seed("alibi", 32, 64, 0))
            > max(max(by_seed(s, 32, 64, 0)) for s in tasks.SCHEMES if s != "alibi"),
    }


def main():
    models = nn.ModuleDict()
    for scheme, seed, base in tasks.MODELS:
        key = tasks.model_key(scheme, seed, base)
        models[key] = tasks.train_scheme(scheme, seed=seed, base=base)
        print("trained", key, flush=True)
    curves = {key: tasks.position_accuracy(model) for key, model in models.items()}
    accuracy = {key: {str(n): accuracy_at(curve, n) for n in tasks.TEST_LENGTHS}
                for key, curve in curves.items()}
    claims = offsets_claims(curves)
    for claim, holds in claims.items():
        print("✓" if holds else "✗", claim)
    assert all(claims.values()), "a claim of notebook 07 fails on the fresh models"

    try:
        shipped, metadata = tasks.load_models()
    except FileNotFoundError:
        shipped = None
    if shipped is not None:          # the fresh accuracies against the shipped ones (any CPU)
        for key, row in accuracy.items():
            for n, value in row.items():
                assert abs(value - metadata["accuracy"][key][n]) <= 0.02, (key, n, value)
        drift = max((a - b).abs().max().item() for a, b in zip(
            models.state_dict().values(), shipped.state_dict().values(), strict=True))
        print(f"largest weight change against the shipped checkpoint: {drift:.1e}")

    save_checkpoint(models, Path(RECORDS[0]), {
        "task": "copy from offsets 1 and 3", "steps": tasks.STEPS, "batch": tasks.BATCH,
        "lr": tasks.LR, "train_lengths": [tasks.TRAIN_MIN_LEN, tasks.TRAIN_MAX_LEN],
        "seeds": list(tasks.SEEDS), "accuracy": accuracy})


if __name__ == "__main__":
    main()

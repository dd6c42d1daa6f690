"""Notebook 07's trained models: the offset-copy task under five position schemes, three seeds.

Trains `PositionTaskModel` (one causal attention layer, 3 heads of 8, 1200 Adam steps on lengths
8-16, one CPU thread) for every scheme (none, sinusoidal, learned, rope, alibi) on seeds 0, 1, 2,
and RoPE with the bases 625 and 160000 on the same seeds: 21 models in one checkpoint, with each
model's accuracy at 16, 32 and 64 tokens in its metadata. The notebook measures and asserts its
claims on the shipped models (sections 6 and Going deeper); this study checks that a fresh
training reproduces the shipped accuracies within 0.02 (any CPU), then writes the checkpoint.
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


def main():
    models = nn.ModuleDict()
    for scheme, seed, base in tasks.MODELS:
        key = tasks.model_key(scheme, seed, base)
        models[key] = tasks.train_scheme(scheme, seed=seed, base=base)
        print("trained", key, flush=True)
    accuracy = {key: {str(n): accuracy_at(tasks.position_accuracy(model), n)
                      for n in tasks.TEST_LENGTHS} for key, model in models.items()}

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

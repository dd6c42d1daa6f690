"""Do notebook 06's findings about the two attention GRUs hold beyond seed 0?

Trains the recipes `rnn_bottleneck.CONFIGS["seq2seq_dates_general"]` (500 steps at lr 3e-3, then
100 at 1e-3) and `CONFIGS["seq2seq_reversal_additive"]` (1,000 + 400 steps) on seeds 1 and 2, one
thread, with `rnn_bottleneck.train_seq2seq`. Seed 0 is each recipe's shipped checkpoint
(studies/seq2seq_checkpoints.py), measured here, not re-trained. For every seed it records
`cross_attention.dates_readings` on the 300 test dates (token accuracy, the field of each ISO
step's strongest input word, mean entropy and strongest weight per step, the lowest teacher-forced
p of the correct token) and `cross_attention.reversal_readings` on 50 test sequences of every
length 4..24 (the peak against the mirror position L-1-t, entropy by length, the peak's and the 4
strongest keys' weight). Asserts `cross_attention.gru_seed_claims` on all three seeds (notebook 06
asserts some of them in view, seed 0 measured live; steps 4 and 7, the entropy at the second `-`
and p > 0.99 are asserted only here). A re-run is checked against the shipped record within
tolerances that hold across CPUs: seed 0 (the shipped checkpoints, only measured) reading by
reading within 0.05; seeds 1 and 2, trained again, through their claims and each reading's mean
over steps or lengths (within 0.05): one reading of a re-trained seed moves further (seed 1's
on-the-mirror share at length 15 was 0.824 on one CPU, 0.765 on another).
It also repeats notebook 06's weight ablations (Going deeper) on every seed (`ablations`): on the
dates, the month word's weight zeroed at every step, and each digit step's field words zeroed
(teacher forced); on reversal, at the steps that peak one after the mirror position, the mirror
state's or the peaked state's weight zeroed. Asserts `ABLATION_CLAIMS` on all three seeds.
Re-run: python3 course.py studies cross_attention_gru_seeds   (about 4 minutes on 2 idle cores;
14 under load)
"""
import dataclasses
import json
import time

import torch

from attn_helpers.lessons import cross_attention, rnn_bottleneck, tasks
from attn_helpers.masks import padding_mask

RECORDS = ["attn_helpers/data/cross_attention_gru_seeds.json"]
SEEDS = (0, 1, 2)                    # 0: the shipped checkpoints; 1 and 2: trained here
RECIPES = {"dates": "seq2seq_dates_general", "reversal": "seq2seq_reversal_additive"}


def readings(models: dict) -> dict:
    """Both tasks' readings, floats rounded to 4 digits."""
    found = {"dates": cross_attention.dates_readings(models["dates"],
                                                     tasks.eval_batches("dates", 300)[None]),
             "reversal": cross_attention.reversal_readings(models["reversal"],
                                                           tasks.eval_batches("reversal", 50))}
    return json.loads(json.dumps(found), parse_float=lambda x: round(float(x), 4))


def readout(model, test, tgt_in):
    """The model's weights ``a (b, n_t, n)`` on ``test`` fed ``tgt_in``, and a function from new
    weights (renormalised there) to each step's token; the decoder states do not depend on them."""
    with torch.no_grad():
        H, c = model.encode(test.src, test.src_lengths)                     # (b, n, 2 d_enc)
        S, _ = model.decoder(model.tgt_embed(tgt_in), model.initial_state(c))
        a = model.attend(S, H, c, padding_mask(test.src_lengths))[1]

    def tokens(new):
        with torch.no_grad():
            context = new / new.sum(-1, keepdim=True) @ H
            return model.out(torch.tanh(model.combine(torch.cat([S, context], -1)))).argmax(-1)
    return a, tokens


def ablations(models: dict) -> dict:
    """Notebook 06's weight ablations on one seed's two GRUs (see the module docstring)."""
    test = tasks.eval_batches("dates", 300)[None]
    months = torch.tensor([tasks.DATES.src_vocab.stoi[w] for w in tasks.MONTHS])
    before, _ = rnn_bottleneck.predict(models["dates"], test)                # (300, 10) greedy
    greedy_in = torch.cat([torch.full_like(before[:, :1], rnn_bottleneck.SOS), before[:, :-1]], 1)
    a, tokens = readout(models["dates"], test, greedy_in)
    month_at = (test.src[..., None] == months).any(-1).float().argmax(-1)   # (300,)
    kept_month = tokens(a.scatter(-1, month_at[:, None, None].expand(-1, a.shape[1], 1), 0.0))
    field = torch.zeros_like(a, dtype=torch.bool)                           # (300, 10, n)
    for i, src in enumerate(test.src):
        fields = tasks.date_fields(tasks.DATES.src_vocab.decode(src))
        for t, step in enumerate(tasks.ISO_STEP_FIELDS):
            field[i, t, : len(fields)] = torch.tensor([f == step for f in fields])
    a, tokens = readout(models["dates"], test, test.tgt_in[:, :10])         # teacher forced
    digits = cross_attention.DIGIT_STEPS
    right = tokens(a.masked_fill(field, 0.0)) == test.tgt_out[:, :10]       # (300, 10)
    found = {"month word zeroed: kept per step": (kept_month == before).float().mean(0).tolist(),
             "field words zeroed: digit steps right": right[:, digits].float().mean().item()}
    kept = {"mirror state zeroed: kept": [], "peaked state zeroed: kept": []}
    for test in tasks.eval_batches("reversal", 50).values():
        predicted, w = rnn_bottleneck.predict(models["reversal"], test)
        t = torch.arange(w.shape[1])
        mirror = (test.src_lengths[:, None] - 1 - t).clamp(min=0)          # (b, n_t): L-1-t
        lagging = (t < test.tgt_lengths[:, None]) & (w.argmax(-1) - mirror == 1)
        tgt_in = torch.cat([torch.full_like(predicted[:, :1], rnn_bottleneck.SOS), predicted[:, :-1]], 1)
        a, tokens = readout(models["reversal"], test, tgt_in)
        for name, j in zip(kept, (mirror, (mirror + 1).clamp(max=a.shape[-1] - 1)), strict=True):
            kept[name].append((tokens(a.scatter(-1, j[..., None], 0.0)) == predicted)[lagging])
    found |= {name: torch.cat(hits).float().mean().item() for name, hits in kept.items()}
    found["lagging steps"] = int(sum(len(h) for h in kept["mirror state zeroed: kept"]))
    return json.loads(json.dumps(found), parse_float=lambda x: round(float(x), 4))


#: the ablation statements, on ``{seed: ablations(...)}`` (notebook 06 asserts them on the record)
ABLATION_CLAIMS = {
    "every seed: zeroing the month word's weight keeps the month's second digit in <= 30% of dates":
        lambda a: all(r["month word zeroed: kept per step"][6] <= 0.3 for r in a.values()),
    "every seed: zeroing each digit step's field words leaves <= 45% of the digit steps right":
        lambda a: all(r["field words zeroed: digit steps right"] <= 0.45 for r in a.values()),
    "every reversal seed, at the steps that peak one after the mirror: zeroing the mirror state's "
    "weight keeps the digit at <= 40%, zeroing the peaked state's at >= 90%": lambda a: all(
        r["mirror state zeroed: kept"] <= 0.4 and r["peaked state zeroed: kept"] >= 0.9
        for r in a.values()),
}


def leaves(tree, path=()):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, (*path, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from leaves(value, (*path, i))
    else:
        yield path, tree


def means(readings: dict) -> dict:
    """The float readings of ``{path: value}``, a series (over steps or lengths) by its mean."""
    groups = {}
    for path, value in readings.items():
        if isinstance(value, float):
            series = isinstance(path[-1], int) or path[-1].isdigit()
            groups.setdefault(path[:-1] if series else path, []).append(value)
    return {path: sum(values) / len(values) for path, values in groups.items()}


def main():
    torch.set_num_threads(1)
    seeds, ablated = {}, {}
    for seed in SEEDS:
        started, models = time.monotonic(), {}
        for task, name in RECIPES.items():
            if seed == 0:
                models[task] = rnn_bottleneck.load_pretrained(name)
            else:
                config = dataclasses.replace(rnn_bottleneck.CONFIGS[name], seed=seed)
                models[task], _ = rnn_bottleneck.train_seq2seq(config, progress=False)
        seeds[str(seed)] = readings(models)
        ablated[str(seed)] = ablations(models)
        print(f"seed {seed} ablations:", json.dumps(ablated[str(seed)]))
        print(f"seed {seed} ({time.monotonic() - started:.0f} s):", json.dumps(seeds[str(seed)])[:400])

    record = {"recipes": RECIPES, "trained": "seeds 1, 2 (seed 0: the shipped checkpoints)",
              "seeds": seeds, "ablations": ablated}
    claims = cross_attention.gru_seed_claims(seeds)
    claims |= {claim: holds(ablated) for claim, holds in ABLATION_CLAIMS.items()}
    failed = [claim for claim, holds in claims.items() if not holds]
    if cross_attention.GRU_SEEDS_RECORD.exists():
        shipped = json.loads(cross_attention.GRU_SEEDS_RECORD.read_text())["seeds"]
        for seed, tree in seeds.items():
            fresh, old = dict(leaves(tree)), dict(leaves(shipped[seed]))
            if seed != "0":      # a re-trained seed: each reading's mean over its steps or lengths
                fresh, old = means(fresh), means(old)
            for path, value in fresh.items():   # shares within 0.05; counts within 5% of 300 dates
                limit = 0.05 if isinstance(value, float) else 0.05 * max(300, abs(old[path]))
                assert abs(value - old[path]) <= limit, (seed, path, value, old[path])
    cross_attention.GRU_SEEDS_RECORD.write_text(json.dumps(record, indent=1) + "\n")
    assert not failed, failed


if __name__ == "__main__":
    main()

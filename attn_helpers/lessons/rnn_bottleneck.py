"""Notebook 01: the RNN bottleneck. GRU encoder-decoders (:mod:`.seq2seq`) reverse digit
sequences, one through a fixed context vector, one with attention, and a wider no-attention
control: their training recipes, evaluation, input gradients, and :func:`claims`, the statements
the notebook asserts (its thresholds are the module's constants, defined once)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from ..training import TrainResult, load_checkpoint, single_thread, token_accuracy, train
from .seq2seq import ATTENTION_KINDS, Seq2Seq
from .tasks import EOS, PAD, Batch, eval_batches, example, get_task, make_batch
from .tasks import collate as tasks_collate

__all__ = ["ATTENTION_KINDS", "Seq2Seq", "seq2seq_loss", "predict", "accuracy_by_length",
           "input_gradient_norms", "copy_gradients", "path_length_fit", "untrained_model",
           "gradient_batch", "accuracy_by_position", "TrainConfig", "CONFIGS",
           "recipe_reversal_none", "recipe_reversal_additive", "recipe_reversal_none_wide",
           "recipe_dates_general", "untrained_gradients", "claims", "train_seq2seq", "build_model",
           "load_pretrained", "widget_claims"]

# --- loss, evaluation, gradients --------------------------------------------------------------


def seq2seq_loss(model: Seq2Seq, src, src_lengths, tgt_in, tgt_out) -> torch.Tensor:
    """Mean cross-entropy of the next-token predictions over real target tokens and ``</s>``."""
    logits, _ = model(src, src_lengths, tgt_in)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)


def _batch_tuple(batch: Batch) -> tuple:
    return batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out


def predict(model: Seq2Seq, batch: Batch):
    """Greedy predictions for a batch: ``(tokens (b, n_tgt), weights (b, n_tgt, n_src) or None)``,
    one step per target token (the ``</s>`` step is left out)."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    model.eval()
    return model.greedy_decode(batch.src, batch.src_lengths, batch.tgt_out.shape[1] - 1)


def accuracy_by_length(model: Seq2Seq, batches: dict) -> dict:
    """Greedy token accuracy for each ``{key: Batch}`` (e.g. each source length); ``{key: float}``.
    Only real target tokens count; padding and ``</s>`` do not."""
    result = {}
    for key, batch in batches.items():
        tokens, _ = predict(model, batch)
        n = tokens.shape[1]
        result[key] = token_accuracy(tokens, batch.tgt_out[:, :n], batch.content_mask[:, :n])
    return result


def accuracy_by_position(model: Seq2Seq, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """For a batch of sources of one length ``n``: ``(accuracy, end_share)``, both ``(n,)`` over
    the output position ``t``: the share of greedy tokens that are right, and the share that are
    ``</s>`` (the model ending the sequence there)."""
    tokens, _ = predict(model, batch)
    n = tokens.shape[1]
    return ((tokens == batch.tgt_out[:, :n]).float().mean(0), (tokens == EOS).float().mean(0))


def input_gradient_norms(model: Seq2Seq, batch: Batch) -> torch.Tensor:
    r"""``(b, n, n)``: entry ``[i, t, j]`` is :math:`\lVert \partial \log p(y_t) / \partial x_j
    \rVert` for example ``i`` (teacher forcing): how strongly input ``j`` can move output ``t``.
    Every source in ``batch`` has the same length ``n``; ``</s>`` is left out."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a tasks.Batch, got {type(batch).__name__}")
    n = int(batch.src_lengths[0])
    if not bool((batch.src_lengths == n).all()):
        raise ValueError(f"every source in batch must have the same length, got "
                         f"{batch.src_lengths.tolist()}")
    was_training = model.training
    model.eval()
    x = model.src_embed(batch.src[:, :n]).detach().requires_grad_(True)   # (b, n, d_emb)
    logits, _ = model(batch.src[:, :n], batch.src_lengths, batch.tgt_in[:, :n], src_embedded=x)
    log_p = torch.log_softmax(logits, -1).gather(-1, batch.tgt_out[:, :n, None])[..., 0]  # (b, n)
    rows = [torch.autograd.grad(log_p[:, t].sum(), x, retain_graph=True)[0].norm(dim=-1)
            for t in range(n)]                                             # n x (b, n): over j
    model.train(was_training)
    return torch.stack(rows, dim=1).detach()                               # (b, n_t = n, n)


def copy_gradients(norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reversal (output ``t`` copies input ``n-1-t``), from ``norms`` ``(b, n, n)``:
    ``(gradient, share)``, both ``(n,)``: the gradient norm from output ``t`` to the input it
    copies (geometric mean over the examples), and that norm over the sum over all inputs (mean
    over the examples; ``1/n``: as much as an average input)."""
    n = norms.shape[-1]
    t = torch.arange(n)
    own = norms[:, t, n - 1 - t]                          # (b, n): d log p(y_t) / d x_{n-1-t}
    return own.log().mean(0).exp(), (own / norms.sum(-1)).mean(0)


def path_length_fit(gradient: torch.Tensor) -> tuple[float, float]:
    """``(slope, r2)`` of the least-squares line through ``log10 gradient[t]`` against the path
    length ``min(t, n-1-t)`` from output ``t``'s digit to the nearer end of the encoder."""
    n = len(gradient)
    t = torch.arange(n)
    design = torch.stack([torch.minimum(t, n - 1 - t), torch.ones(n, dtype=torch.long)], 1).double()
    y = gradient.double().log10()[:, None]
    fit = torch.linalg.lstsq(design, y).solution
    residual = ((y - design @ fit) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    return fit[0, 0].item(), 1 - residual.item()


def untrained_model(name: str, seed: int) -> Seq2Seq:
    """A freshly initialised model of checkpoint ``name``'s recipe, seeded with ``seed``."""
    return build_model(replace(CONFIGS[name], seed=seed))


def gradient_batch(length: int = 24, examples: int = 20) -> Batch:
    """The first ``examples`` test sequences of length ``length``: the gradient experiment's data."""
    full = eval_batches("reversal", 100)[length]
    return Batch(*(getattr(full, f.name)[:examples] for f in fields(Batch)))


# --- recipes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """One checkpoint's task, model and training budget."""

    task: str
    attention: str
    steps: int = 1000
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0
    finetune_steps: int = 400
    finetune_lr: float = 1e-3
    d_emb: int = 32
    d_enc: int = 32
    d_attn: int = 32


# The two reversal models share the task, the sizes and the budget; only the attention differs.
CONFIGS = {
    "seq2seq_reversal_none": TrainConfig("reversal", "none"),
    "seq2seq_reversal_additive": TrainConfig("reversal", "additive"),
    # the control: no attention, but a wider encoder (context vector 68 instead of 64) and at least
    # as many parameters as the attention model, so parameters alone cannot explain the gap
    "seq2seq_reversal_none_wide": TrainConfig("reversal", "none", d_enc=34),
    "seq2seq_dates_general": TrainConfig("dates", "general", steps=500, finetune_steps=100),
}


def build_model(config: TrainConfig) -> Seq2Seq:
    """A freshly initialised :class:`Seq2Seq` for ``config`` (seeded with ``config.seed``)."""
    task = get_task(config.task)
    torch.manual_seed(config.seed)
    return Seq2Seq(len(task.src_vocab), len(task.tgt_vocab), attention=config.attention,
                   d_emb=config.d_emb, d_enc=config.d_enc, d_attn=config.d_attn)


def train_seq2seq(config: TrainConfig, *, progress: bool = True) -> tuple[Seq2Seq, TrainResult]:
    """Train ``config`` from scratch (:func:`attn_helpers.training.train`): ``steps`` at ``lr``,
    then ``finetune_steps`` at ``finetune_lr`` (a fresh Adam and batch stream), on one thread.
    The losses of both phases are returned."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    task = get_task(config.task)
    model = build_model(config)

    def batches(step, generator):
        return _batch_tuple(make_batch(task, config.batch_size, generator))

    description = f"{config.task}, attention={config.attention}"
    result = train(model, batches, seq2seq_loss, steps=config.steps, lr=config.lr,
                   seed=config.seed, progress=progress, description=description,
                   single_threaded=True)
    if config.finetune_steps:
        finetune = train(model, batches, seq2seq_loss, steps=config.finetune_steps,
                         lr=config.finetune_lr, seed=config.seed + 1, progress=progress,
                         description=f"{description}, fine-tuning", single_threaded=True)
        result.losses.extend(finetune.losses)
    return model, result


def _metadata(config: TrainConfig, model: Seq2Seq, result: TrainResult) -> dict:
    accuracy = accuracy_by_length(model, eval_batches(config.task, 100))
    return {
        **{k: v for k, v in config.__dict__.items()},
        "final_loss": round(result.final_loss, 4),
        "accuracy": {str(k): round(v, 4) for k, v in accuracy.items()},
    }


def _recipe(name: str):
    config = CONFIGS[name]
    model, result = train_seq2seq(config)
    return model, _metadata(config, model, result)


def recipe_reversal_none():
    """``python -m attn_helpers train seq2seq_reversal_none``: the no-attention baseline."""
    return _recipe("seq2seq_reversal_none")


def recipe_reversal_additive():
    """``python -m attn_helpers train seq2seq_reversal_additive``: additive attention."""
    return _recipe("seq2seq_reversal_additive")


def recipe_reversal_none_wide():
    """``python -m attn_helpers train seq2seq_reversal_none_wide``: the no-attention control with
    a wider encoder and at least as many parameters as the attention model."""
    return _recipe("seq2seq_reversal_none_wide")


def recipe_dates_general():
    """``python -m attn_helpers train seq2seq_dates_general``: the dates model of notebook 06."""
    return _recipe("seq2seq_dates_general")


def load_pretrained(name: str) -> Seq2Seq:
    """The shipped checkpoint ``name`` (a key of :data:`CONFIGS`), in eval mode."""
    if name not in CONFIGS:
        raise ValueError(f"unknown checkpoint {name!r}; known: {sorted(CONFIGS)}")
    model = build_model(CONFIGS[name])
    load_checkpoint(model, name)
    return model


# --- the claims of notebook 01 -----------------------------------------------------------------

SHORT = 7                   # "up to 7 digits both models are near perfect" ...
NEAR_PERFECT = 0.95         # ... meaning a token accuracy of at least 0.95
LONG_PLAIN_BELOW = 0.4      # "about a third" at 24 digits: below 0.4
GAP = 0.5                   # attention beats no attention (and the wide control) by >= 0.5 at 24
FIRST, LAST = 3, 8          # n = 24: the first 3 outputs are right (> 0.7), the last 8 not (< 0.3)
CHANCE = 0.1                # a guessed digit: 1 in 10; the last output is right less often
ENDS_EARLY = 0.5            # the last output is </s> in more than half of the examples
GRADIENT_SEEDS = (0, 1, 2)  # untrained models: three initialisations each
ORDERS = 100                # "two orders of magnitude": a ratio > 100
DECAY, R2 = -0.15, 0.95     # "exponential decay": log10 slope < -0.15 per step, R^2 > 0.95
FLAT, FLAT_ALL, DILUTED = 2.0, 4.0, 0.5   # attention: gradient within 2x over t >= 1, 4x over all t,
#                                           and at both ends < 0.5x no attention's (1/n dilution)
SHARE_FIRST, SHARE_LATE, SHARE_ATTENDED = 4.0, 1.25, 2.0   # in units of 1/n


def untrained_gradients(seeds=GRADIENT_SEEDS) -> dict[str, list[torch.Tensor]]:
    """``{"no attention" | "additive attention": [gradient (n,) per seed]}``: the gradient from
    output ``t`` to the input it copies (:func:`copy_gradients`) for freshly initialised models."""
    batch = gradient_batch()
    with single_thread():
        return {label: [copy_gradients(input_gradient_norms(untrained_model(name, seed), batch))[0]
                        for seed in seeds]
                for label, name in (("no attention", "seq2seq_reversal_none"),
                                    ("additive attention", "seq2seq_reversal_additive"))}


def claims(plain: Seq2Seq, attended: Seq2Seq, *, wide: Seq2Seq | None = None,
           group: str | None = None) -> dict[str, bool]:
    """Notebook 01's statements about the reversal models, as named booleans; the notebook asserts
    them on the shipped checkpoints, the tests on freshly re-trained models. ``wide`` (optional)
    is the no-attention control. Names start with their group (``length``, ``position``,
    ``control``, ``gradient``); ``group`` keeps one. Computed once, on one thread."""
    key = (plain, attended, wide)                # the models themselves: no stale id() matches
    if _COMPUTED.get("models") != key:
        with single_thread():
            _COMPUTED.update(models=key, claims=_claims(plain, attended, wide))
    chosen = {k: v for k, v in _COMPUTED["claims"].items() if group is None or k.startswith(group)}
    if not chosen:
        raise ValueError(f"no claim of notebook 01 starts with {group!r}")
    return chosen


_COMPUTED: dict = {}   # the last three models and their claims


def widget_claims(attended: Seq2Seq, n: int = 24) -> dict[str, bool]:
    """Notebook 01's statement about its widget's opening picture (example 0 of ``n`` digits)."""
    _, weights = predict(attended, tasks_collate("reversal", [example("reversal", 0, n)]))
    offsets = None if weights is None else (weights[0].argmax(-1) - torch.arange(n - 1, -1, -1)).abs()
    return {f"widget: with attention, example 0 of {n} digits: every output's strongest input is "
            "within one position of the digit it copies (n-1-t)":
            offsets is not None and bool((offsets <= 1).all())}


def _claims(plain: Seq2Seq, attended: Seq2Seq, wide: Seq2Seq | None) -> dict[str, bool]:
    test_sets = eval_batches("reversal", 100)
    acc_plain, acc_attn = accuracy_by_length(plain, test_sets), accuracy_by_length(attended, test_sets)
    n = max(test_sets)
    by_position, end_share = accuracy_by_position(plain, test_sets[n])
    short = [k for k in test_sets if k <= SHORT]
    result = {
        f"length: with attention, token accuracy >= {NEAR_PERFECT} at every length":
            min(acc_attn.values()) >= NEAR_PERFECT,
        f"length: up to {SHORT} digits, both models get >= {NEAR_PERFECT} of the tokens right":
            min(min(acc_plain[k], acc_attn[k]) for k in short) >= NEAR_PERFECT,
        f"length: without attention, accuracy falls ({SHORT} > 12 > {n} digits), "
        f"to < {LONG_PLAIN_BELOW} at {n}":
            acc_plain[n] < acc_plain[12] < acc_plain[SHORT] and acc_plain[n] < LONG_PLAIN_BELOW,
        f"length: at {n} digits attention is >= {GAP} more accurate":
            acc_attn[n] - acc_plain[n] >= GAP,
        f"position: without attention, n = {n}: the first {FIRST} outputs > 0.7 right, "
        f"the last {LAST} < 0.3, the last one below chance (< {CHANCE})":
            by_position[:FIRST].mean() > 0.7 and by_position[-LAST:].mean() < 0.3
            and by_position[-1].item() < CHANCE,
        f"position: without attention, n = {n}: the last output is </s> in > {ENDS_EARLY} "
        "of the examples":
            end_share[-1].item() > ENDS_EARLY,
    }
    if wide is not None:
        size_wide, size_attn = (sum(p.numel() for p in m.parameters()) for m in (wide, attended))
        acc_wide = accuracy_by_length(wide, {n: test_sets[n]})[n]
        result[f"control: the wide no-attention model has >= the attention model's parameters, "
               f"and attention is >= {GAP} more accurate than it at {n}"] = (
            size_wide >= size_attn and acc_attn[n] - acc_wide >= GAP)
    untrained, middle = untrained_gradients(), range(n)[n // 3: n - n // 3]
    result[f"gradient, untrained, no attention: > {ORDERS}x smaller in the middle than at either "
           f"end (each of {len(GRADIENT_SEEDS)} seeds)"] = all(
        int(g.argmin()) in middle and min(g[0], g[-1]) > ORDERS * g.min()
        for g in untrained["no attention"])
    result[f"gradient, untrained, no attention: log10 falls linearly with the path length "
           f"min(t, n-1-t), slope < {DECAY} per step, R^2 > {R2} (each seed)"] = all(
        slope < DECAY and r2 > R2 for slope, r2 in map(path_length_fit, untrained["no attention"]))
    result[f"gradient, untrained, attention: varies < {FLAT}x over t >= 1; the first output's "
           f"is the largest, < {FLAT_ALL}x the smallest (each seed)"] = all(
        g[1:].max() < FLAT * g[1:].min() and g[0] > g[1:].max() and g[0] < FLAT_ALL * g.min()
        for g in untrained["additive attention"])
    result[f"gradient, untrained, attention: at both ends (t = 0 and n-1) < {DILUTED}x the "
           "no-attention model's (each seed): weights of about 1/n dilute each input"] = all(
        a[0] < DILUTED * p[0] and a[-1] < DILUTED * p[-1]
        for p, a in zip(untrained["no attention"], untrained["additive attention"], strict=True))
    batch = gradient_batch()
    cut = [untrained_model("seq2seq_reversal_additive", seed) for seed in GRADIENT_SEEDS]
    for model in cut:
        torch.nn.init.zeros_(model.bridge.weight)     # W_b = 0: c no longer starts the decoder
    result[f"gradient, untrained, attention: with W_b = 0 the first output's excess is gone "
           f"(varies < {FLAT}x over all t, each seed)"] = all(
        g.max() < FLAT * g.min()
        for g in (copy_gradients(input_gradient_norms(m, batch))[0] for m in cut))
    no_attention = [plain] if wide is None else [plain, wide]
    shares = [copy_gradients(input_gradient_norms(m, batch))[1] * n            # in units of 1/n
              for m in [*no_attention, attended]]
    result[f"gradient, trained, no attention{'' if wide is None else ' (and the wide control)'}: "
           f"the copied digit's share falls from > {SHARE_FIRST}/n (t = 0) to < {SHARE_LATE}/n "
           "(mean over t >= n/2, and at the last output)"] = all(
        share[0] > SHARE_FIRST and share[n // 2:].mean() < SHARE_LATE and share[-1] < SHARE_LATE
        for share in shares[:-1])
    result[f"gradient, trained, attention: the copied digit's share is > {SHARE_ATTENDED}/n "
           "at every t"] = shares[-1].min() > SHARE_ATTENDED
    return {claim: bool(holds) for claim, holds in result.items()}

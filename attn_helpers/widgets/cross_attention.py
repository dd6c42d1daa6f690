"""Notebook 06's widgets: section 1's toy row, live (query mix, scale, padding); and an example
decoded step by step (rows after the step grey), by the GRU or either head of a Transformer."""

from __future__ import annotations

import ipywidgets as widgets
import torch

from .._checks import require_bool, require_int_in, require_number
from ..attention import scaled_dot_product_attention
from ..entropy import attention_entropy, max_entropy
from ..lessons.rnn_bottleneck import Seq2Seq
from ..lessons.tasks import collate, example, get_task
from .core import AttentionFrame, LiveAttentionWidget
from .masking import CaptionedView
from .rnn_bottleneck import check_model, decode_examples


class _DecodedFrame(AttentionFrame):
    @property
    def ceiling(self) -> torch.Tensor:    # ln n_k on decoded rows, no line (NaN) on later rows
        return super().ceiling.where(self.mask.any(-1), torch.nan)


def _decoded(model, task, index: int):
    """Example ``index`` greedily decoded: ``(source, target, output, weights)``, the weights
    ``(n_q, n_k)`` for the GRU, ``(h, n_q, n_k)`` for a Transformer."""
    source, target = example(task, index)
    if isinstance(model, Seq2Seq):
        ((output, weights),) = decode_examples(model, task, [(source, target)])
        return source, target, output, weights
    batch = collate(task, [(source, target)])
    tokens, weights = model.greedy_decode(batch.src, batch.src_lengths, steps=len(target))
    return source, target, [task.tgt_vocab.itos[i] for i in tokens[0].tolist()], weights[0]


def _alignment(source, target, output, weights, step: int, reader: str = "GRU") -> AttentionFrame:
    step = min(step, len(output) - 1)                    # one slider serves every length
    n_q, n_k = weights.shape
    row = weights[step].double()
    best, entropy, ceiling = int(row.argmax()), attention_entropy(row).item(), max_entropy(n_k)
    frame = _DecodedFrame(
        weights=weights, query_labels=[f"{t} ({i})" for i, t in enumerate(output)],
        key_labels=source, mask=(torch.arange(n_q) <= step)[:, None].expand(n_q, n_k).clone(),
        highlight_row=step, readouts={
            "step": f"{step} (steps 0 to {n_q - 1})",
            "output token": f"{output[step]} (target {target[step]})",
            "strongest source token": f"{source[best]} (position {best})",
            "its weight": row[best].item(), "entropy (nats)": entropy, "ceiling ln n": ceiling})
    frame.caption = (
        f"{reader}: {' '.join(source)}  |  decoder step {step} (0 to {n_q - 1}): wrote {output[step]!r} "
        f"(target {target[step]!r})",
        f"strongest input word: {source[best]!r} with weight {row[best].item():.2f}  |  "
        f"entropy {entropy:.2f} of at most ln {n_k} = {ceiling:.2f} nats")
    return frame


def _check(model, step) -> None:
    check_model(model)
    if model.attention == "none":
        raise ValueError("model has no attention (attention='none'): there is no alignment to show")
    require_int_in("step", step, 0)


def alignment_frame(model: Seq2Seq, task: str, index: int, step: int) -> AttentionFrame:
    """Example ``index`` of ``task`` decoded by ``model``: its alignment up to ``step`` (clamped)."""
    _check(model, step)
    return _alignment(*_decoded(model, get_task(task), index), step)


def alignment_widget(model: Seq2Seq, task: str, *, examples: int = 20,
                     transformer=None) -> LiveAttentionWidget:
    """An example picker and a decoder-step slider; every example is decoded once, here. With
    ``transformer`` (a ``lessons.cross_attention.TransformerSeq2Seq`` for the same task), a
    ``reader`` menu shows the GRU's weights or one of the Transformer's heads."""
    _check(model, 0)
    task = get_task(task)
    controls = {
        "index": widgets.IntSlider(value=0, min=0, max=examples - 1, description="example",
                                   continuous_update=False),
        "step": widgets.IntSlider(value=0, min=0, max=0, description="decoder step"),
    }
    decoded = {"GRU": [_decoded(model, task, index) for index in range(examples)]}  # (src, tgt, out, w)
    if transformer is not None:
        runs = [_decoded(transformer, task, index) for index in range(examples)]
        decoded |= {f"Transformer head {h}": [(*run[:3], run[3][h]) for run in runs]
                    for h in range(runs[0][3].shape[0])}
        controls["reader"] = widgets.Dropdown(options=list(decoded), description="reader")

    def fit_steps(change=None):  # the step slider ends at the example's last output step
        controls["step"].max = len(decoded["GRU"][controls["index"].value][2]) - 1

    fit_steps()
    controls["index"].observe(fit_steps, names="value")   # before the widget's own observer
    view = CaptionedView((7.8, 5.4), title="cross-attention: output step x input word",
                         axis_names=("input position (word)", "output step (token)"),
                         entropy_title="entropy per output step")
    longest = max(len(out) for runs in decoded.values() for _, _, out, _ in runs)
    view.panel.ax_entropy.set_yticks(range(longest))      # one tick per output step
    view.panel.ax_entropy.yaxis.tick_right()    # step labels clear of the colour bar's ticks
    view.panel.ax_entropy.tick_params(axis="y", length=0)          # "0", not "- 0"
    return LiveAttentionWidget(lambda index, step, reader="GRU": _alignment(
        *decoded[reader][index], step, reader), controls, view,
        title=f"Decoding step by step ({task.name})")


TOY_WORDS = ("ten", "may", "nineteen", "eighty")
TOY_MEMORY = torch.tensor([[1., 0, 0, 10], [0, 1, 0, 5], [0, 0, 1, 19], [0, 0, 1, 80]],
                          dtype=torch.float64)   # section 1: is day, is month, is year | number
MAX_PADS = 4


def toy_frame(mix: float, scale: float, pads: int, mask_pads: bool = True) -> AttentionFrame:
    """Section 1's toy: the query ``scale * ((1 - mix) "the month?" + mix "the year?")`` reads the
    memory padded with ``pads`` zero rows (masked when ``mask_pads``); keys the fields, values the
    numbers. One row, its entropy and the value read."""
    mix, scale = require_number("mix", mix), require_number("scale", scale)
    if not 0 <= mix <= 1 or scale < 0:
        raise ValueError(f"mix must lie in 0..1 and scale be >= 0, got mix={mix}, scale={scale}")
    require_int_in("pads", pads, 0, MAX_PADS)
    memory = torch.cat([TOY_MEMORY, torch.zeros(pads, 4, dtype=torch.float64)])   # (n_k, 4)
    real = (torch.arange(len(memory)) < len(TOY_WORDS))[None]                      # (1, n_k)
    query = scale * torch.tensor([[0, 1 - mix, mix]], dtype=torch.float64)         # (1, 3)
    read, weights = scaled_dot_product_attention(query, memory[:, :3], memory[:, 3:],
                                                 real if require_bool("mask_pads", mask_pads) else None)
    frame = AttentionFrame(weights, [f"{1 - mix:.1f} month? + {mix:.1f} year?"],
                           [*TOY_WORDS, *["<pad>"] * pads], mask=real if mask_pads else None)
    entropy, ceiling, on_pads = frame.entropy.item(), frame.ceiling.item(), weights[0, 4:].sum().item()
    frame.readouts = {"weights": " ".join(f"{a:.2f}" for a in weights[0].tolist()),
                      "entropy (nats)": entropy, "ceiling ln(visible keys)": ceiling,
                      "value read": read.item(), "weight on padding": on_pads}
    frame.caption = (
        f"query {1 - mix:.1f} x 'the month?' + {mix:.1f} x 'the year?', W_Q = {scale:g} I  |  "
        f"{pads} pads, {'masked' if mask_pads else 'NOT masked'}",
        f"reads {read.item():.1f}  |  weight on padding {on_pads:.2f}  |  entropy {entropy:.2f} of "
        f"at most {ceiling:.2f} nats")
    return frame


def toy_widget() -> LiveAttentionWidget:
    """Section 1's toy, live: query mix, query scale, padded length, the pads masked or not."""
    controls = {
        "mix": widgets.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.1, description="query mix"),
        "scale": widgets.FloatSlider(value=10.0, min=0.0, max=20.0, step=0.5, description="query scale"),
        "pads": widgets.IntSlider(value=2, min=0, max=MAX_PADS, description="pads"),
        "mask_pads": widgets.Checkbox(value=True, description="mask the pads"),
    }
    view = CaptionedView((8.2, 2.7), title="one cross-attention row", max_shape=(1, 4 + MAX_PADS),
                         axis_names=("memory position (key)", "query"), entropy_title="entropy")
    view.panel.ax_entropy.xaxis.label.set_text("nats (dashes: ln visible)")     # fits the figure
    return LiveAttentionWidget(toy_frame, controls, view,
                               title="Section 1's toy: move the query, pad the memory")

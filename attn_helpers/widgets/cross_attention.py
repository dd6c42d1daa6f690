"""Notebook 06's widget: decode an example step by step and watch the cross-attention.

:func:`alignment_frame` / :func:`alignment_widget`: pick an example and a decoder step; the
alignment is shown up to that step (later rows are still grey), the current row is framed, and
the entropy view marks it.
"""

from __future__ import annotations

import ipywidgets as widgets
import torch

from ..entropy import attention_entropy, max_entropy
from ..lessons.rnn_bottleneck import Seq2Seq
from ..lessons.tasks import example, get_task
from .core import AttentionFrame, LiveAttentionWidget
from .masking import CaptionedView
from .rnn_bottleneck import check_model, decode_examples

__all__ = ["alignment_frame", "alignment_widget"]


def _decoded(model: Seq2Seq, task, index: int):
    source, target = example(task, index)
    ((output, weights),) = decode_examples(model, task, [(source, target)])
    return source, target, output, weights


def _alignment(source, target, output, weights, step: int) -> AttentionFrame:
    step = min(step, len(output) - 1)
    n_q, n_k = weights.shape
    mask = (torch.arange(n_q) <= step)[:, None].expand(n_q, n_k).clone()
    row = weights[step].double()
    best = int(row.argmax())
    labels = [f"{t} ({i})" for i, t in enumerate(output)]
    frame = AttentionFrame(
        weights=weights, query_labels=labels, key_labels=source, mask=mask, highlight_row=step,
        readouts={
            "step": f"{step} (steps 0 to {n_q - 1})",
            "output token": f"{output[step]} (target {target[step]})",
            "strongest source token": f"{source[best]} (position {best})",
            "its weight": row[best].item(),
            "entropy (nats)": attention_entropy(row).item(),
            "ceiling ln n": max_entropy(n_k),
        },
    )
    entropy, ceiling = attention_entropy(row).item(), max_entropy(n_k)
    frame.caption = (
        f"{' '.join(source)}  |  decoder step {step} (0 to {n_q - 1}): wrote {output[step]!r} "
        f"(target {target[step]!r})",
        f"strongest input word: {source[best]!r} with weight {row[best].item():.2f}  |  "
        f"entropy {entropy:.2f} of at most ln {n_k} = {ceiling:.2f} nats")
    return frame


def _check(model, step) -> None:
    check_model(model)
    if model.attention == "none":
        raise ValueError("model has no attention (attention='none'): there is no alignment to show")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")


def alignment_frame(model: Seq2Seq, task: str, index: int, step: int) -> AttentionFrame:
    """The alignment of example ``index`` of ``task`` decoded by ``model``, up to decoder ``step``.

    Rows after ``step`` are masked (not decoded yet), row ``step`` is highlighted. ``step`` is
    clamped to the last output step, so the same slider serves examples of any length. Readouts:
    the step, its output token, the strongest source token and its weight, the row's entropy
    and its ceiling ``ln n_src``.
    """
    _check(model, step)
    return _alignment(*_decoded(model, get_task(task), index), step)


def alignment_widget(model: Seq2Seq, task: str, *, examples: int = 20) -> LiveAttentionWidget:
    """Notebook 06's widget: an example picker and a decoder-step slider. Each example is decoded
    once, the first time it is shown; moving the step only redraws."""
    _check(model, 0)
    task = get_task(task)
    controls = {
        "index": widgets.IntSlider(value=0, min=0, max=examples - 1, description="example",
                                   continuous_update=False),
        "step": widgets.IntSlider(value=0, min=0, max=0, description="decoder step"),
    }
    decoded: dict = {}  # example index -> (source, target, output, weights)

    def example_at(index):
        if index not in decoded:
            decoded[index] = _decoded(model, task, index)
        return decoded[index]

    def fit_steps(change=None):
        """The step slider ends at the example's last output step: no key press on it is dead."""
        controls["step"].max = len(example_at(controls["index"].value)[2]) - 1

    fit_steps()
    controls["index"].observe(fit_steps, names="value")   # before the widget's own observer

    def compute(index, step):
        return _alignment(*example_at(index), step)

    # no room reserved for the largest example: the colour bar sits beside the example on show
    # (a larger one re-lays the panel out once)
    view = CaptionedView((7.8, 5.4), title="cross-attention: output step x input word",
                         axis_names=("input position (word)", "output step (token)"),
                         entropy_title="entropy per output step")
    return LiveAttentionWidget(compute, controls, view, title=f"Decoding step by step ({task.name})")

"""``python -m attn_helpers bench widget [--repeats N] [--check]``: one slider move in the kernel
(compute, draw, PNG into the ``ipywidgets.Image``) for every notebook's widget, and the generic view
at :data:`TOKENS` tokens. Target: every median at most :data:`MAX_RATIO` of re-creating a seaborn
heatmap, measured in the same run."""

from __future__ import annotations

import argparse
import io
import json
import sys
import time

import ipywidgets as widgets
import numpy as np
import seaborn as sns
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..entropy import attention_entropy
from ..lessons import build_gpt, multi_head, rnn_bottleneck
from ..masks import causal_mask
from ..widgets.build_gpt import gpt_widget
from ..widgets.complexity import tile_stepper_widget
from ..widgets.core import AttentionFrame, AttentionView, LiveAttentionWidget
from ..widgets.cross_attention import alignment_widget, toy_widget
from ..widgets.masking import masking_widget
from ..widgets.multi_head import multihead_widget
from ..widgets.positional_encoding import positional_widget
from ..widgets.query_key_value import lookup_2d_widget
from ..widgets.real_model import real_model_widget
from ..widgets.rnn_bottleneck import bottleneck_widget
from ..widgets.scaling import scaling_widget
from ..widgets.start_here import warmup_widget
from . import summarize

TOKENS = 32
MAX_RATIO = 0.1


def _rnn_bottleneck():
    return bottleneck_widget({
        "no attention": rnn_bottleneck.load_pretrained("seq2seq_reversal_none"),
        "additive attention": rnn_bottleneck.load_pretrained("seq2seq_reversal_additive")})


def _multi_head():
    model, _ = multi_head.load_two_relations()
    tokens, targets = multi_head.evaluation_batch()
    with torch.no_grad():
        _, weights = model(tokens[:6])  # (6, h, n, n)
    labels = [multi_head.token_labels(t) for t in tokens[:6]]
    return multihead_widget(weights, labels, head_names=["head 0", "head 1"],
                            mask=causal_mask(len(labels[0])), model=model, eval_tokens=tokens,
                            eval_targets=targets)


def _build_gpt():
    corpus = build_gpt.load_corpus()
    torch.manual_seed(0)   # untrained: a move's cost does not depend on training
    model = build_gpt.GPT(build_gpt.GPTConfig(corpus.vocab_size)).eval()
    return gpt_widget(model, corpus, "The for statement loops over")


#: notebook slug -> its widget, built as the notebook builds it
NOTEBOOK_WIDGETS = {
    "start_here": warmup_widget, "rnn_bottleneck": _rnn_bottleneck,
    "query_key_value": lookup_2d_widget, "scaling": scaling_widget, "multi_head": _multi_head,
    "masking": masking_widget,
    "cross_attention": lambda: alignment_widget(
        rnn_bottleneck.load_pretrained("seq2seq_dates_general"), "dates"),
    "cross_attention_toy": toy_widget,
    "positional_encoding": positional_widget, "complexity": tile_stepper_widget,
    "real_model": real_model_widget, "build_gpt": _build_gpt}


def control_values(control, most: int = 12) -> list:
    """Values the arrow keys reach on ``control`` (at most ``most``); none for a text box."""
    if isinstance(control, widgets.Text):
        return []
    if isinstance(control, widgets.Checkbox):
        return [not control.value, control.value]
    if isinstance(control, widgets.Dropdown | widgets.SelectionSlider | widgets.ToggleButtons):
        values = list(control._options_values)
    else:
        count = int(round((control.max - control.min) / control.step))
        values = [control.min + i * control.step for i in range(count + 1)]
        if isinstance(control, widgets.FloatLogSlider):
            values = [control.base ** v for v in values]
    return values[::max(1, len(values) // most)]


def moves(widget: LiveAttentionWidget) -> list[tuple[str, object]]:
    """One control after the other through its values, back to where it started."""
    sequence = []
    for name, control in widget.controls.items():
        start, values = control.value, control_values(control)
        if values:
            sequence += [(name, v) for v in values if v != start] + [(name, start)]
    return sequence


def time_moves(step, repeats: int) -> tuple[list[float], list[float]]:
    """``(wall ms, CPU ms of this process)`` of ``step(i)`` for ``i < repeats``."""
    wall, cpu = [], []
    for i in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        step(i)
        cpu.append((time.process_time() - start_cpu) * 1000.0)
        wall.append((time.perf_counter() - start) * 1000.0)
    return wall, cpu


def notebook_widget_step(slug: str):
    """``(step(i), number of distinct moves)`` for the widget of notebook ``slug``."""
    widget = NOTEBOOK_WIDGETS[slug]()
    sequence = moves(widget)

    def step(i: int):
        name, value = sequence[i % len(sequence)]
        widget.controls[name].value = value
        if widget.error:
            raise RuntimeError(f"{slug}: {widget.error}")

    return step, len(sequence)


def generic_steps(n: int = TOKENS):
    """``(live, seaborn)`` steps: softmax of fixed scores at a sweep of temperatures, drawn by the
    live view or by a new seaborn figure."""
    scores = torch.randn(n, n, generator=torch.Generator().manual_seed(n)) * 2
    labels = [f"t{i}" for i in range(n)]

    def frame(temperature: float) -> AttentionFrame:
        weights = torch.softmax(scores / temperature, dim=-1)
        return AttentionFrame(weights, labels, labels,
                              readouts={"mean entropy": attention_entropy(weights).mean().item()})

    slider = widgets.FloatSlider(value=1.0, min=0.1, max=5.0, step=0.01)
    LiveAttentionWidget(frame, {"temperature": slider}, AttentionView())
    image = widgets.Image(format="png")

    def live(i: int):
        slider.value = 0.2 + (i % 40) * 0.05

    def seaborn(i: int):
        f = frame(0.2 + (i % 40) * 0.05)
        fig = Figure(figsize=(9, 5))
        FigureCanvasAgg(fig)
        ax_map, ax_entropy = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
        sns.heatmap(f.weights.numpy(), vmin=0, vmax=1, cmap="viridis", ax=ax_map,
                    xticklabels=labels, yticklabels=labels)
        ax_entropy.barh(np.arange(n), f.entropy.numpy())
        ax_entropy.axvline(np.log(n), linestyle="--", color="#c0392b")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        image.value = buffer.getvalue()

    return live, seaborn


def bench_widget(repeats: int = 60) -> list[dict]:
    """Records for every notebook widget (at least one pass through its moves), the generic view
    and seaborn (``repeats // 5`` moves, at least 3; both after 2 untimed)."""
    records = []
    for slug in NOTEBOOK_WIDGETS:
        step, count = notebook_widget_step(slug)
        wall, cpu = time_moves(step, max(repeats, count))
        records.append({"widget": slug, **summarize(wall),
                        "cpu_median_ms": summarize(cpu)["median_ms"]})
    for name, step in zip(("generic view", "seaborn"), generic_steps(), strict=True):
        time_moves(step, 2)
        count = repeats if name == "generic view" else max(3, repeats // 5)
        records.append({"widget": name, **summarize(time_moves(step, count)[0])})
    return records


def widget_verdict(records: list[dict]) -> tuple[bool, str]:
    """``(met, text)``: every median at most :data:`MAX_RATIO` of the seaborn re-plot's."""
    baseline = next(r["median_ms"] for r in records if r["widget"] == "seaborn")
    lines, ok = [], True
    for r in (r for r in records if r["widget"] != "seaborn"):
        ratio = r["median_ms"] / baseline
        ok &= ratio <= MAX_RATIO
        cpu = f" (CPU {r['cpu_median_ms']:6.2f} ms)" if "cpu_median_ms" in r else ""
        lines.append(f"{r['widget']:>20}: median {r['median_ms']:7.2f} ms, p90 {r['p90_ms']:7.2f} "
                     f"ms{cpu}, {ratio:.3f} of seaborn's (1/{baseline / r['median_ms']:.0f})"
                     + ("" if ratio <= MAX_RATIO else "  OVER"))
    lines.append(f"target: every move at most {MAX_RATIO:g} of re-creating a seaborn heatmap at "
                 f"{TOKENS} tokens ({baseline:.1f} ms in this run): {'met' if ok else 'NOT met'}")
    return ok, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench widget", description=__doc__)
    parser.add_argument("--repeats", type=int, default=60, help="timed moves per live case")
    parser.add_argument("--check", action="store_true", help="exit 1 when a ratio is over the target")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    records = bench_widget(args.repeats)
    print(json.dumps(records, indent=1))
    ok, verdict = widget_verdict(records)
    print(verdict, file=sys.stderr)
    return 0 if ok or not args.check else 1

"""``python -m attn_helpers bench widget [--repeats N] [--check]``: one slider move in the kernel.

One move = the pure compute + rendering + PNG into the ``ipywidgets.Image``. Two kinds of records:

* every notebook's widget, built as its notebook builds it (trained models from the shipped
  checkpoints), driven through its controls as arrow keys would move them, one control after the
  other: ``{"widget": "<notebook slug>", "method": "live", "median_ms", "p90_ms",
  "cpu_median_ms"}`` (wall clock; and the CPU time of the kernel's thread, which a busy machine
  does not inflate). The first visit of an example (a decode) is timed with the rest;
* the generic live view at 8, 32 and 64 tokens beside the naive approach of re-creating a
  seaborn heatmap figure on every change, in the same run:
  ``{"tokens", "method": "live" | "seaborn", "median_ms", "p90_ms"}``.

The target is a ratio measured in the same run, never a fixed number of milliseconds: every
notebook widget's median move, and the generic view's at 32 tokens, at most
:data:`WIDGET_MAX_RATIO` (1/10) of re-creating the seaborn heatmap at 32 tokens. The verdict
prints every median and its ratio; ``--check`` exits 1 only when a ratio is over the target.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from importlib import import_module

import ipywidgets as widgets
import numpy as np
import seaborn as sns
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..entropy import attention_entropy
from ..masks import causal_mask
from ..widgets import AttentionFrame, AttentionView, LiveAttentionWidget

WIDGET_TOKENS = (8, 32, 64)
#: a move's median over re-creating a seaborn heatmap at this many tokens, same run: at most this
WIDGET_BASELINE_TOKENS = 32
WIDGET_MAX_RATIO = 0.1


def time_calls(step: Callable[[int], object], repeats: int, warmup: int = 3) -> list[float]:
    """Run ``step(i)`` ``warmup + repeats`` times; return the last ``repeats`` durations in ms."""
    for i in range(warmup):
        step(i)
    durations = []
    for i in range(repeats):
        start = time.perf_counter()
        step(warmup + i)
        durations.append((time.perf_counter() - start) * 1000.0)
    return durations


def time_moves(step: Callable[[int], object], repeats: int) -> tuple[list[float], list[float]]:
    """Like :func:`time_calls` (no warm-up), returning ``(wall ms, CPU ms of this thread)`` per
    call: on a busy machine the CPU time tells what a move costs, the wall time what it took."""
    wall, cpu = [], []
    for i in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        step(i)
        cpu.append((time.thread_time() - start_cpu) * 1000.0)
        wall.append((time.perf_counter() - start) * 1000.0)
    return wall, cpu


def summarize(durations: list[float]) -> dict:
    """Median and 90th percentile of a list of durations (ms), rounded to 3 decimals."""
    ordered = sorted(durations)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(p90, 3)}


def temperature_frame(scores: torch.Tensor, labels: list[str], temperature: float) -> AttentionFrame:
    """The benchmark's pure compute: softmax of fixed scores at a temperature."""
    weights = torch.softmax(scores / temperature, dim=-1)
    return AttentionFrame(weights, labels, labels,
                          readouts={"mean entropy": attention_entropy(weights).mean().item()})


# --- every notebook's widget, built as its notebook builds it --------------------------------


def _rnn_bottleneck():
    from ..lessons import rnn_bottleneck
    from ..widgets.rnn_bottleneck import bottleneck_widget
    return bottleneck_widget({
        "no attention": rnn_bottleneck.load_pretrained("seq2seq_reversal_none"),
        "additive attention": rnn_bottleneck.load_pretrained("seq2seq_reversal_additive")})


def _multi_head():
    from ..lessons import multi_head
    from ..widgets.multi_head import multihead_widget
    model, _ = multi_head.load_two_relations()
    tokens, targets = multi_head.evaluation_batch()
    examples = tokens[:6]
    with torch.no_grad():
        _, weights = model(examples)  # (6, h, n, n)
    labels = [multi_head.token_labels(t) for t in examples]
    return multihead_widget(weights, labels, head_names=["head 0", "head 1"],  # as notebook 04
                            mask=causal_mask(len(labels[0])), model=model, eval_tokens=tokens,
                            eval_targets=targets)


def _cross_attention():
    from ..lessons import rnn_bottleneck
    from ..widgets.cross_attention import alignment_widget
    return alignment_widget(rnn_bottleneck.load_pretrained("seq2seq_dates_general"), "dates")


def _real_model():
    from ..widgets.real_model import real_model_widget
    return real_model_widget()  # the pretrained encoder from its installed package


def _build_gpt():
    from ..lessons import build_gpt as bg
    from ..widgets.build_gpt import gpt_widget
    corpus = bg.load_corpus()
    torch.manual_seed(0)   # the notebook's model, untrained: a move's cost does not depend on training
    model = bg.GPT(bg.GPTConfig(corpus.vocab_size)).eval()
    return gpt_widget(model, corpus, "The for statement loops over")   # as notebook 10


def _factory(module: str, name: str) -> Callable[[], LiveAttentionWidget]:
    def build():
        return getattr(import_module(f"attn_helpers.widgets.{module}"), name)()
    return build


NOTEBOOK_WIDGETS: dict[str, Callable[[], LiveAttentionWidget]] = {
    "start_here": _factory("start_here", "warmup_widget"),
    "rnn_bottleneck": _rnn_bottleneck,
    "query_key_value": _factory("query_key_value", "lookup_2d_widget"),
    "scaling": _factory("scaling", "scaling_widget"),
    "multi_head": _multi_head,
    "masking": _factory("masking", "masking_widget"),
    "cross_attention": _cross_attention,
    "positional_encoding": _factory("positional_encoding", "positional_widget"),
    "complexity": _factory("complexity", "tile_stepper_widget"),
    "real_model": _real_model,
    "build_gpt": _build_gpt,
}


def control_values(control, most: int = 12) -> list:
    """Values a learner reaches with the arrow keys on ``control`` (at most ``most``, evenly
    spread): every step of a slider, every option of a dropdown, both states of a checkbox;
    none for a text box (typing a sentence is not a move)."""
    if isinstance(control, widgets.Text):
        return []
    if isinstance(control, widgets.Checkbox):
        return [not control.value, control.value]
    if isinstance(control, (widgets.Dropdown, widgets.SelectionSlider, widgets.ToggleButtons)):
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


def notebook_widget_step(slug: str) -> tuple[Callable[[int], object], int]:
    """``(step(i), number of distinct moves)`` for the widget of notebook ``slug``."""
    widget = NOTEBOOK_WIDGETS[slug]()
    sequence = moves(widget)

    def step(i: int):
        name, value = sequence[i % len(sequence)]
        widget.controls[name].value = value
        if widget.error:
            raise RuntimeError(f"{slug}: {widget.error}")

    return step, len(sequence)


def temperatures(i: int) -> float:
    """A sweep of temperatures that never repeats two moves in a row."""
    return 0.2 + (i % 40) * 0.05


def live_widget_step(n: int) -> Callable[[int], object]:
    scores = torch.randn(n, n, generator=torch.Generator().manual_seed(n)) * 2
    labels = [f"t{i}" for i in range(n)]
    slider = widgets.FloatSlider(value=1.0, min=0.1, max=5.0, step=0.01)
    widget = LiveAttentionWidget(
        lambda temperature: temperature_frame(scores, labels, temperature),
        {"temperature": slider}, AttentionView(),
    )

    def step(i: int):
        slider.value = temperatures(i)
        if widget.error:
            raise RuntimeError(widget.error)

    return step


def seaborn_step(n: int) -> Callable[[int], object]:
    scores = torch.randn(n, n, generator=torch.Generator().manual_seed(n)) * 2
    labels = [f"t{i}" for i in range(n)]
    image = widgets.Image(format="png")

    def step(i: int):
        frame = temperature_frame(scores, labels, temperatures(i))
        fig = Figure(figsize=(9, 5))  # a new figure every move: what the live widget avoids
        FigureCanvasAgg(fig)
        ax_map, ax_entropy = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
        sns.heatmap(frame.weights.numpy(), vmin=0, vmax=1, cmap="viridis", ax=ax_map,
                    xticklabels=labels, yticklabels=labels)
        ax_entropy.barh(np.arange(n), frame.entropy.numpy())
        ax_entropy.axvline(np.log(n), linestyle="--", color="#c0392b")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        image.value = buffer.getvalue()

    return step


def bench_widget(repeats_live: int = 60, repeats_seaborn: int = 12) -> list[dict]:
    """Notebook widgets (at least one pass through each widget's moves, and ``repeats_live``
    moves), then the generic view against seaborn."""
    records = []
    for slug in NOTEBOOK_WIDGETS:
        step, count = notebook_widget_step(slug)
        wall, cpu = time_moves(step, max(repeats_live, count))
        records.append({"widget": slug, "method": "live", **summarize(wall),
                        "cpu_median_ms": summarize(cpu)["median_ms"]})
    for n in WIDGET_TOKENS:
        records.append({"tokens": n, "method": "live",
                        **summarize(time_calls(live_widget_step(n), repeats_live))})
        records.append({"tokens": n, "method": "seaborn",
                        **summarize(time_calls(seaborn_step(n), repeats_seaborn))})
    return records


def widget_verdict(records: list[dict]) -> tuple[bool, str]:
    """Check the target on one run's records: every notebook widget's median move, and the
    generic view's at 32 tokens, at most ``WIDGET_MAX_RATIO`` of the seaborn re-plot's median at
    32 tokens. Returns ``(met, text)``; the text gives every median and its ratio."""
    by = {(r["tokens"], r["method"]): r for r in records if "tokens" in r}
    baseline = by[(WIDGET_BASELINE_TOKENS, "seaborn")]["median_ms"]
    lines, ok = [], True

    def judged(label: str, median: float, extra: str = "") -> str:
        nonlocal ok
        ratio = median / baseline
        ok &= ratio <= WIDGET_MAX_RATIO
        return (f"{label:>20}: median {median:7.2f} ms{extra}, {ratio:.3f} of seaborn's (1/"
                f"{baseline / median:.0f}){'' if ratio <= WIDGET_MAX_RATIO else '  OVER'}")

    for r in (r for r in records if "widget" in r):
        lines.append(judged(r["widget"], r["median_ms"],
                            f", p90 {r['p90_ms']:7.2f} ms (CPU {r['cpu_median_ms']:6.2f} ms)"))
    for n in WIDGET_TOKENS:
        live, naive = by[(n, "live")]["median_ms"], by[(n, "seaborn")]["median_ms"]
        lines.append(f"{'generic view':>20}: {n:2d} tokens, live {live:6.2f} ms, seaborn "
                     f"{naive:7.2f} ms: x{naive / live:.1f}")
    lines.append(judged(f"generic, {WIDGET_BASELINE_TOKENS} tokens",
                        by[(WIDGET_BASELINE_TOKENS, "live")]["median_ms"]))
    lines.append(f"target: every move at most {WIDGET_MAX_RATIO:g} of re-creating a seaborn "
                 f"heatmap at {WIDGET_BASELINE_TOKENS} tokens ({baseline:.1f} ms in this run): "
                 f"{'met' if ok else 'NOT met'}")
    return ok, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench widget",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=60, help="timed moves per live case")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when a ratio is over the target")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    records = bench_widget(args.repeats, max(3, args.repeats // 5))
    print(json.dumps(records, indent=1))
    ok, verdict = widget_verdict(records)
    print(verdict, file=sys.stderr)
    return 0 if ok or not args.check else 1

"""The widget checks that used to sit in the teaching cells of notebooks 00-02: driven from code
exactly as the notebooks drive them, each widget redraws once per move, shows no error, and its
readouts agree with its pure frame function."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import query_key_value as qkv_lesson
from attn_helpers.lessons import rnn_bottleneck
from attn_helpers.widgets import query_key_value as qkv_widgets
from attn_helpers.widgets import rnn_bottleneck as seq_widgets
from attn_helpers.widgets import start_here as warmup


def test_warm_up_redraws_once_per_move_without_error():
    """Notebook 00, section 4: three moves after the first picture, four redraws."""
    widget = warmup.warmup_widget()
    assert widget.renders == 1 and widget.error is None
    for values in ({"temperature": 0.1}, {"temperature": 10.0}, {"temperature": 1.0, "causal": True}):
        readouts = widget.set(**values)
        frame = warmup.warmup_frame(widget.values["temperature"], widget.values["causal"])
        assert readouts == {k: f"{v:.4f}" for k, v in frame.readouts.items()}
        assert torch.equal(widget.frame.weights, frame.weights)
    assert widget.error is None and widget.renders == 4


@pytest.fixture(scope="module")
def explorer():
    models = {"no attention": rnn_bottleneck.load_pretrained("seq2seq_reversal_none"),
              "additive attention": rnn_bottleneck.load_pretrained("seq2seq_reversal_additive")}
    return seq_widgets.bottleneck_widget(models)


def test_bottleneck_explorer_moves_as_in_notebook_01(explorer):
    explorer.set(length=24, model_name="no attention", index=0)
    assert explorer.error is None and explorer.frame.weights.shape == (24, 24)
    explorer.set(model_name="additive attention")
    frame = explorer.frame
    assert explorer.error is None and frame.readouts["token accuracy"] == 1.0
    explorer.set(length=5, model_name="no attention")
    assert explorer.error is None and explorer.frame.readouts["token accuracy"] == 1.0


def test_lookup_widget_moves_as_in_notebook_02():
    lookup = qkv_widgets.lookup_2d_widget()
    lookup.set(query_x=qkv_lesson.QUERY[0], query_y=qkv_lesson.QUERY[1], temperature=1.0)
    keys = torch.tensor(list(qkv_widgets.DEMO_KEYS.values()), dtype=torch.float64)
    values = torch.eye(3, dtype=torch.float64)[list(qkv_lesson.PLANE_VALUES)]
    _, soft, _, _ = qkv_lesson.lookups(torch.tensor(qkv_lesson.QUERY, dtype=torch.float64),
                                       keys, values)
    assert torch.allclose(lookup.frame.weights[0], soft, atol=1e-12)
    lookup.set(query_x=-2.5, query_y=0.3)
    for temperature in (0.1, 1.0, 10.0):
        lookup.set(temperature=temperature)
        expected = qkv_widgets.lookup_2d_frame(-2.5, 0.3, temperature)
        assert torch.allclose(lookup.frame.weights, expected.weights)
    assert lookup.error is None

"""The widget regression checks that used to sit in notebooks 03 and 04's teaching cells: the same
moves as the notebooks' strict cells, and what the widgets must then show."""

from __future__ import annotations

import pytest
import torch

from attn_helpers.lessons import multi_head as heads_task
from attn_helpers.masks import causal_mask
from attn_helpers.widgets.multi_head import multihead_widget
from attn_helpers.widgets.scaling import scaling_frame, scaling_widget

LARGEST = "largest weight (mean over rows)"
GRADIENT = "gradient norm |J| (mean over rows)"


def test_notebook_03_widget_moves():
    """Notebook 03, section 6: grow d_k unscaled, switch the scaling on, then cool it to T = 0.1."""
    explorer = scaling_widget()
    explorer.set(d_k=4, scaled=False, temperature=1.0)
    largest, gradient = {}, {}
    for d_k in (4, 64, 1024):
        explorer.set(d_k=d_k)
        largest[d_k] = explorer.frame.readouts[LARGEST]
        gradient[d_k] = explorer.frame.readouts[GRADIENT]
    assert largest[4] < largest[64] < largest[1024] and largest[1024] > 0.95
    assert gradient[1024] < 0.25 * gradient[4]
    explorer.set(scaled=True)
    assert explorer.frame.readouts[LARGEST] < 0.5                     # spread out again
    explorer.set(temperature=0.1)
    assert explorer.frame.readouts[LARGEST] > 0.9                     # cold again
    assert explorer.frame.readouts["scores divided by"] == pytest.approx(3.2)
    assert explorer.frame.readouts == scaling_frame(**explorer.values).readouts   # the pure function
    assert explorer.error is None


def test_notebook_04_widget_moves():
    """Notebook 04, section 5: example 2, all heads, then each head; the strongest keys of the
    last query are the first letter and the previous letter."""
    model, _ = heads_task.load_two_relations()
    tokens, _ = heads_task.evaluation_batch()
    examples = tokens[:6]
    with torch.no_grad():
        _, weights = model(examples)
        scores = heads_task.head_relation_scores(model(tokens)[1])
    previous_head, first_head = int(scores[:, 0].argmax()), int(scores[:, 1].argmax())
    names = ["head 0", "head 1"]
    names[previous_head] += " (previous letter)"
    names[first_head] += " (first letter)"
    explorer = multihead_widget(weights, [heads_task.token_labels(t) for t in examples],
                                head_names=names, mask=causal_mask(tokens.shape[1]))
    explorer.set(example=2, head="all")
    labels = heads_task.token_labels(examples[2])
    explorer.set(head=first_head)
    assert explorer.frame.key_labels[int(explorer.frame.weights[-1].argmax())] == labels[0]
    explorer.set(head=previous_head)
    assert explorer.frame.key_labels[int(explorer.frame.weights[-1].argmax())] == labels[-2]
    assert explorer.view.last_mode == "single" and explorer.error is None

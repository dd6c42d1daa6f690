"""The widget regression check that used to sit in notebook 04's teaching cells: the same moves as
the notebook's strict cell, and what the widget must then show. (Notebook 03's widget moves are
asserted in its own strict cell, which nbval runs.)"""

from __future__ import annotations

import torch

from attn_helpers.lessons import multi_head as heads_task
from attn_helpers.masks import causal_mask
from attn_helpers.widgets.multi_head import multihead_widget


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

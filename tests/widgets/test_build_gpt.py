"""Notebook 10's widgets: the attention view on a GPT (pure frame function, readouts, errors
shown, static picture, heads zeroed) and the sampler."""

from __future__ import annotations

import copy

import pytest
import torch

from attn_helpers.lessons import build_gpt as bg
from attn_helpers.widgets import build_gpt as gw


@pytest.fixture(scope="module")
def setup():
    corpus = bg.load_corpus()
    torch.manual_seed(0)
    model = bg.GPT(bg.GPTConfig(corpus.vocab_size, context=32, d_model=32, num_heads=4,
                                num_layers=2, d_ff=64)).eval()
    return model, corpus


def test_the_frame_is_one_causal_head_with_its_ceiling(setup):
    model, corpus = setup
    run = gw.run_prompt(model, corpus, "for x in y:\n    pass")
    assert run.weights.shape == (2, 4, 20, 20) and run.labels[3] == "␣" and run.labels[11] == "⏎"
    frame = gw.gpt_frame(run, 2, 3)
    assert torch.equal(frame.weights, run.weights[1, 2])
    assert (frame.weights.triu(1) == 0).all()
    assert (frame.entropy <= frame.ceiling + 1e-6).all()
    assert frame.readouts["head"] == "layer 2, head 3" and frame.head == 2
    assert frame.layer_entropy.shape == (4,)
    with pytest.raises(ValueError, match="layer"):
        gw.gpt_frame(run, 3, 1)
    run = gw.run_prompt(model, corpus, "a" * 40 + "the end")     # the last context characters
    assert run.truncated and len(run.labels) == 32 and run.text.endswith("the end")


def test_the_widget_moves_and_shows_errors(setup):
    model, corpus = setup
    widget = gw.gpt_widget(model, corpus, "The for statement")
    readouts = widget.set(layer=2, head=4)
    assert readouts["head"] == "layer 2, head 4" and widget.error is None
    before = widget.image.value
    widget.set(prompt="")
    assert "empty" in widget.error and widget.image.value == before
    widget.set(prompt="while True")
    assert widget.error is None and len(widget.frame.query_labels) == 10


def test_zeroing_a_head_is_zeroing_its_columns_of_w_o_and_the_readouts_compare(setup):
    model, corpus = setup
    ids, cut = corpus.encode("for x in y:\n    pass")[None], copy.deepcopy(model)
    with torch.no_grad():
        cut.blocks[0].attn.out.weight[:, 8:16] = 0       # d_h = 8: layer 1, head 2
        with gw.ablated(model, [(1, 2)]):
            assert torch.allclose(model(ids), cut(ids), atol=1e-6)
        cut.blocks[0].attn.out.bias += model.blocks[0].attn.out.weight[:, 8:16] @ torch.ones(8)
        with gw.ablated(model, {(1, 2): torch.ones(8)}):  # a mean: a constant through W_O
            assert torch.allclose(model(ids), cut(ids), atol=1e-5)
        assert not torch.allclose(model(ids), cut(ids), atol=1e-6)   # the hook is gone
    widget = gw.gpt_widget(model, corpus, "The for statement", layer=2, head=1)
    weights = widget.frame.weights
    readouts = widget.set(zero="l1h2, L1H2")
    assert readouts["heads zeroed"] == "L1H2" and "greedy continuation, intact" in readouts
    assert "intact" in readouts["loss on the prompt (nats per character)"]
    assert not torch.equal(widget.frame.weights, weights) and "L1H2 zeroed" in widget.view.title.texts[0]
    widget.set(zero="L3H1")
    assert "zero's layer must be between 1 and 2" in widget.error


def test_the_sampler(setup):
    model, corpus = setup
    sampler = gw.Sampler(model, corpus, bg.generate, prompt="The ")
    samples = sampler.set(temperature=0.5, top_k=3)
    assert len(samples) == 3 and all(s.startswith("The ") and len(s) == 32 for s in samples)
    bundle = sampler._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "image/png" in data and samples[0] in data["text/plain"]
    sampler.set(prompt="\u2603")
    assert "vocabulary" in sampler.output.value


def test_the_widget_opens_on_the_head_asked_for_and_its_picture_names_it(setup):
    model, corpus = setup
    widget = gw.gpt_widget(model, corpus, "The for statement", layer=2, head=3)
    view = widget.view
    assert view.title.texts == ["layer 2, head 3: attention weights"]
    # the title is pasted text at matplotlib's title place: a head move does not redraw the figure
    background = view.blit._background
    x, y = view.title.xy[0]
    box = view.panel.ax_map.get_window_extent()
    assert box.x0 < x < box.x1 and y > box.y1          # centred over the heatmap, above it
    before = widget.image.value
    widget.set(head=1)
    assert view.title.texts == ["layer 2, head 1: attention weights"]
    assert view.blit._background is background and widget.image.value != before
    title = view.heads.ax.get_title()
    assert title.startswith("this layer's heads") and "dashes" in view.heads.ax.get_xlabel()
    with pytest.raises(ValueError, match="head must be between 1 and 4"):
        gw.gpt_widget(model, corpus, "The for statement", head=5)
    with pytest.raises(TypeError, match="layer must be an int"):
        gw.gpt_widget(model, corpus, "The for statement", layer=1.0)


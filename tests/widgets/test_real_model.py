"""Notebook 09's widget (``widgets.real_model``): one model run per sentence, equal to the
encoder's own outputs; moves only redraw; ablation equals ``encode(head_mask=...)``; bad input is
shown in the widget and keeps the last picture (kernel time: ``bench widget --check``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _reference import decode_png

from attn_helpers.lessons import real_model as rm
from attn_helpers.pretrained import load_encoder
from attn_helpers.widgets.panels import HIGHLIGHT_COLOR
from attn_helpers.widgets.real_model import (
    SentenceError,
    ablated_embeddings,
    example_pairs,
    real_model_frame,
    real_model_widget,
    run_sentence,
    token_label,
)

A, B = "The film was extremely boring.", "The movie was really dull."


@pytest.fixture(scope="module")
def enc():
    return load_encoder()


@pytest.fixture(scope="module")
def runs(enc):
    return run_sentence(enc, A), run_sentence(enc, B)


class Counter:
    """Counts runs of the embedding layer (one per sentence through the model) and of layer 6."""

    def __init__(self, enc):
        self.embeddings = self.last_layer = 0
        self.handles = [enc.embeddings.register_forward_hook(lambda *_: self._add("embeddings")),
                        enc.layers[-1].register_forward_hook(lambda *_: self._add("last_layer"))]

    def _add(self, name):
        setattr(self, name, getattr(self, name) + 1)

    def remove(self):
        for handle in self.handles:
            handle.remove()


# --- the pure parts -------------------------------------------------------------------------


def test_run_sentence_equals_the_encoder(enc, runs):
    run, _ = runs
    batch = enc.tokenize([A])
    _, attentions = enc(batch["input_ids"], batch["attention_mask"])
    assert run.labels == batch["tokens"][0]
    torch.testing.assert_close(run.weights, attentions[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(run.embedding, enc.encode([A])[0], atol=1e-5, rtol=0)
    mask = batch["attention_mask"]
    entropy, fraction = rm.entropy_grid(attentions, mask)
    torch.testing.assert_close(run.entropy, entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(run.fraction, fraction, atol=1e-5, rtol=0)
    torch.testing.assert_close(run.previous, rm.offset_scores(attentions, mask, -1))
    torch.testing.assert_close(run.cls, rm.sink_shares(attentions, mask, batch["input_ids"],
                                                       enc.cls_id))
    assert run.notes == "none"


@pytest.mark.parametrize("layer, head", [(1, 1), (4, 7), (6, 12)])
def test_ablated_embeddings_equal_encode_with_a_head_mask(enc, runs, layer, head):
    run, _ = runs
    off = ablated_embeddings(enc, run, layer)
    assert off.shape == (12, 384)
    head_mask = torch.ones(6, 12, dtype=torch.bool)
    head_mask[layer - 1, head - 1] = False
    expected = enc.encode([A], head_mask=head_mask)[0]
    torch.testing.assert_close(off[head - 1], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(expected, run.embedding, atol=1e-4)  # the head does something


def test_frame_readouts_and_weights(enc, runs):
    run, partner = runs
    frame = real_model_frame(run, partner, 1, 3)
    assert torch.equal(frame.weights, run.weights[0, 2]) and frame.cell == (0, 2)
    assert frame.readouts["similarity to the second sentence"] == pytest.approx(
        float(enc.encode([A, B]).prod(0).sum()), abs=1e-5)
    assert frame.readouts["weight on previous token"] == pytest.approx(run.previous[0, 2].item())
    assert frame.readouts["weight on previous token"] > 0.9  # the previous-token head
    assert "similarity with this head off" not in frame.readouts
    off = (ablated_embeddings(enc, run, 1)[2], ablated_embeddings(enc, partner, 1)[2])
    frame = real_model_frame(run, partner, 1, 3, True, off)
    assert frame.readouts["change"] == pytest.approx(
        float(off[0] @ off[1]) - frame.readouts["similarity to the second sentence"])
    assert "switched off" in frame.title


@pytest.mark.parametrize("kwargs, match", [
    ({"layer": 7}, "layer"), ({"head": True}, "head"), ({"ablate": True}, "ablated"),
])
def test_frame_bad_arguments(runs, kwargs, match):
    args = {"layer": 1, "head": 1, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):  # a bool head is a TypeError
        real_model_frame(*runs, **args)


def test_the_widget_opens_on_the_head_asked_for_and_refuses_a_bad_one(enc):
    widget = real_model_widget(enc, [("The cat sat.", "A cat sat.")], layer=4, head=2)
    assert widget.frame.title.startswith("weights a_ij of L4H2, rows: queries")
    with pytest.raises(ValueError, match="head"):
        real_model_widget(enc, [("The cat sat.", "A cat sat.")], head=13)


@pytest.mark.parametrize("text", ["", "   \n\t", "\u200b"])
def test_run_sentence_rejects_text_without_word_pieces(enc, text):
    with pytest.raises(SentenceError, match="empty|no word pieces"):
        run_sentence(enc, text)
    with pytest.raises(TypeError, match="str"):
        run_sentence(enc, 42)
    assert token_label("café") == "café" and token_label("猫") == "?"   # what the font cannot draw


# --- the widget -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def widget(enc):
    return real_model_widget(enc)


def test_widget_starts_on_the_first_example(widget):
    pairs = example_pairs()
    assert widget.values["sentence"] == pairs[0][0] and widget.values["partner"] == pairs[0][1]
    assert widget.error is None and widget.examples in widget.ui.children


def test_moves_only_redraw_and_new_sentences_run_once(enc, widget):
    counter = Counter(enc)
    try:
        widget.set(sentence=A, partner=B, layer=1, head=1, ablate=False)
        counter.embeddings = 0
        for layer, head in [(2, 5), (3, 5), (3, 9), (6, 12), (1, 3)]:
            widget.set(layer=layer, head=head)
            assert torch.equal(widget.frame.weights,
                               widget.run(A, "sentence").weights[layer - 1, head - 1])
        assert counter.embeddings == 0                      # no model run on a move
        widget.set(sentence="A brand new sentence about a red kite.")
        assert counter.embeddings == 1                      # one run, the partner is cached
        counter.embeddings = counter.last_layer = 0
        widget.set(ablate=True)                             # layer 1: 12 heads, 2 sentences
        assert counter.embeddings == 0 and counter.last_layer == 2  # one batch per sentence
        widget.set(head=7)
        widget.set(head=12)                                 # same layer: nothing reruns
        assert counter.last_layer == 2
        widget.set(layer=2)
        widget.set(layer=1)                                 # cached: nothing reruns
        assert counter.embeddings == 0 and counter.last_layer == 4
    finally:
        counter.remove()
        widget.set(ablate=False)


def test_ablation_toggle_changes_the_similarity_readout(enc, widget):
    widget.set(sentence=A, partner=B, layer=6, head=4, ablate=True)
    head_mask = torch.ones(6, 12, dtype=torch.bool)
    head_mask[5, 3] = False
    expected = float(enc.encode([A, B], head_mask=head_mask).prod(dim=0).sum())
    assert float(widget.readouts["similarity with this head off"]) == pytest.approx(expected,
                                                                                    abs=2e-4)
    before = float(widget.readouts["similarity to the second sentence"])
    assert float(widget.readouts["change"]) == pytest.approx(expected - before, abs=2e-4)
    widget.set(ablate=False)
    assert "change" not in widget.readouts


def test_the_frame_on_the_head_map_follows_the_head(widget):
    orange = np.array([255, 127, 14])

    def frame_centre():
        image = decode_png(widget.image.value, "RGB")
        ys, xs = np.nonzero(np.abs(image - orange).max(-1) <= 30)
        right = xs > image.shape[1] * 0.6                  # the head map is on the right
        return xs[right].mean(), ys[right].mean()

    assert HIGHLIGHT_COLOR == "#ff7f0e"
    widget.set(sentence=A, partner=B, layer=1, head=1)
    x1, y1 = frame_centre()
    widget.set(head=12)
    x2, y2 = frame_centre()
    widget.set(layer=6)
    x3, y3 = frame_centre()
    assert x2 > x1 + 100 and abs(y2 - y1) < 3 and y3 > y2 + 50


def test_examples_fill_both_boxes_with_one_redraw(widget):
    pairs = example_pairs()
    renders = widget.renders
    widget.examples.value = 2
    assert (widget.values["sentence"], widget.values["partner"]) == pairs[2]
    assert widget.renders == renders + 1
    widget.examples.value = 0


@pytest.mark.parametrize("text", ["", "    "])
def test_empty_text_is_a_message_and_keeps_the_last_picture(widget, text):
    widget.set(sentence=A, partner=B)
    picture, frame = widget.image.value, widget.frame
    widget.set(sentence=text)                               # must not raise
    assert widget.error.startswith("SentenceError") and "empty" in widget.error
    assert "Traceback" not in widget.error_html.value and "empty" in widget.error_html.value
    assert widget.image.value == picture and widget.frame is frame
    widget.set(sentence=A)
    assert widget.error is None and widget.error_html.value == ""


def test_emoji_other_scripts_and_overlong_text_get_a_note(widget):
    widget.set(sentence="I love 😀 pizza 🍕 and 猫が好き", partner=B)
    assert widget.error is None
    assert "[UNK]" in widget.readouts["notes"] and "font" in widget.readouts["notes"]
    assert "?" in widget.frame.query_labels
    widget.set(sentence="Пока, мир.")                       # Cyrillic: drawn as it is
    assert widget.readouts["notes"] == "none"
    widget.set(sentence="word " * 600)
    assert widget.error is None and widget.readouts["word pieces n"] == "512"
    assert "512" in widget.readouts["notes"] and widget.frame.weights.shape == (512, 512)
    widget.set(sentence=A)

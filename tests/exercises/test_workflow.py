"""The exercise workflow (``exercises.workflow``): registration, stubs, hints on demand, progress."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _exercises import stub

from attn_helpers import exercises
from attn_helpers.__main__ import main as tools_main
from attn_helpers.course_map import COURSE
from attn_helpers.exercises import (
    complexity,
    cross_attention,
    masking,
    multi_head,
    positional_encoding,
    query_key_value,
    rnn_bottleneck,
    scaling,
    start_here,
    workflow,
)
from attn_helpers.exercises.core import Mistake, check_function

KEY = "start_here.test_double"


def reference(x):
    return x * 2


@pytest.fixture
def check_double():
    @workflow.exercise(KEY, "double a tensor", hints=("think", "y = 2 x", "return x * 2"))
    def check(fn):
        return check_function(fn, reference, [{"x": torch.ones(3)}], what="double")

    yield check
    workflow.EXERCISES.pop(KEY, None)
    workflow._RESULTS.pop(KEY, None)


def state():
    return workflow.progress("start_here", show=False)["start_here"][KEY]


#: The function checkers and the name each one's stub verdict gives.
STUB_NAMES = [
    (start_here.check_softmax_with_temperature, "softmax_with_temperature"),
    (start_here.check_entropy, "entropy"), (rnn_bottleneck.check_rnn_encoder, "rnn_encoder"),
    (rnn_bottleneck.check_additive_scores, "additive_scores"),
    (query_key_value.check_attention, "attention"),
    (query_key_value.check_asymmetric_relation, "next_token_projections"),
    (scaling.check_choose_scale, "choose_scale"), (scaling.check_softmax_backward, "softmax_backward"),
    (scaling.check_projection_gradients, "projection_gradients"),
    (multi_head.check_grouped_query_attention, "grouped_query_attention"),
    (masking.check_prefix_lm_mask, "prefix_lm_mask"),
    (masking.check_rolling_cache_step, "rolling_cache_step"),
    (cross_attention.check_cross_attend, "cross_attend"),
    (cross_attention.check_decode_layer, "decode_layer"),
    (positional_encoding.check_rope, "rope"),
    (positional_encoding.check_rope_layout, "to_interleaved"),
    (positional_encoding.check_alibi_bias, "alibi_bias"),
    (complexity.check_merge_states, "merge_states"),
    (complexity.check_causal_backward, "causal_backward"),
    (complexity.check_linear_step, "linear_step"),
]


@pytest.mark.parametrize("check, what", STUB_NAMES, ids=[what for _, what in STUB_NAMES])
def test_each_checkers_stub_is_not_implemented_yet_and_nothing_more(check, what):
    assert check(stub).message == f"{what} is not implemented yet."
    assert check(lambda *args: None).message == f"{what} is not implemented yet (it returned None)."
    assert check.exercise_key in workflow.EXERCISES


def test_a_list_of_outputs_counts_as_the_tuple_the_reference_returns():
    cases = [{"x": torch.arange(3.0)}]
    assert check_function(lambda x: [x * 2, x + 1], lambda x: (x * 2, x + 1), cases)
    assert not check_function(lambda x: [x * 2, x + 2], lambda x: (x * 2, x + 1), cases)
    assert not check_function(lambda x: [x * 2], reference, cases)   # a list is not one tensor


def test_a_mistakes_nan_row_names_a_zero_row_but_the_answers_zero_row_is_no_mistake():
    def row0(x, value):                                   # row 0, a row with nothing to attend to
        return x.index_fill(0, torch.tensor([0]), value)

    cases = [{"x": torch.ones(2, 3)}]
    mistakes = [Mistake(lambda x: row0(x * 3, torch.nan), "a softmax written out"),
                Mistake(lambda x: row0(x * 2, torch.nan), "no finite stand-in")]
    zero_row = check_function(lambda x: row0(x * 3, 0), reference, cases, mistakes=mistakes)
    nan_row = check_function(lambda x: row0(x * 2, torch.nan), lambda x: row0(x * 2, 0), cases,
                             mistakes=mistakes)
    assert "Hint: a softmax written out" in zero_row.message and "Hint: no finite" in nan_row.message


def test_the_watch_sees_the_product_inside_an_einsum_of_three_operands():
    def backward(scores, g):                  # notebook 03's exercise 2: a a^T inside one einsum
        a = scores.softmax(-1)
        return a * g - torch.einsum("...i,...j,...j->...i", a, a, g)

    message = scaling.check_softmax_backward(backward).message
    assert "(einsum), as big as the (..., n, n) Jacobian" in message, message


def test_progress_and_hints(check_double, capsys):
    assert state() is None
    assert not check_double(lambda x: x)
    assert state() is False
    assert check_double(lambda x: x + x)
    assert workflow.progress()["start_here"][KEY] is True
    assert "double a tensor" in capsys.readouterr().out
    for level, text in ((1, "think"), (2, "y = 2 x"), (3, "return x * 2")):
        exercises.hint(KEY, level)
        out = capsys.readouterr().out
        assert f"Hint {level} of 3" in out and text in out
    table = workflow.progress("masking")                             # one notebook's table
    assert list(table) == ["masking"] and set(table["masking"]) == {
        key for key in workflow.EXERCISES if key.startswith("masking.")}
    out = capsys.readouterr().out
    assert out.startswith("05 masking: ") and "01 rnn" not in out


def test_bad_keys_levels_and_slugs_are_refused():
    with pytest.raises(ValueError, match="level must be 1, 2 or 3"):
        exercises.hint("start_here.anything", 4)
    with pytest.raises(TypeError, match="key must be a string"):
        exercises.hint(3)
    with pytest.raises(ValueError, match="no exercise 'start_here.nothing'"):
        exercises.hint("start_here.nothing")
    with pytest.raises(ValueError, match="slug must be one of"):
        workflow.progress("no_such_notebook")


def test_a_reference_solution_never_counts_as_the_learners_pass(check_double):
    result = check_double(lambda x: x + x, solution=True)
    assert result and "does not count as your pass" in result.message
    assert state() is None and not workflow.progress_file().exists()
    with pytest.raises(AssertionError, match=f"reference solution of {KEY} fails"):
        check_double(lambda x: x, solution=True)


def test_the_latest_verdict_is_kept_across_kernels_in_the_progress_file(check_double):
    assert not check_double(lambda x: x)                         # a failure is not written
    assert not workflow.progress_file().exists()
    assert check_double(lambda x: x + x)
    workflow._RESULTS.clear()                                      # a new kernel, another notebook
    assert state() is True
    assert not check_double(stub)                                  # Run All on the stub
    assert state() is False
    workflow._RESULTS.clear()                                      # and the file says so too
    assert state() is None and KEY not in workflow._read_passes()
    assert check_double(lambda x: x + x)
    assert check_double(lambda x: x + x, solution=True)            # never touches the record
    workflow._RESULTS.clear()
    assert state() is True
    workflow.progress_file().write_text("not json")                # a damaged file reads as empty
    assert state() is None
    assert workflow.reset_progress() == workflow.progress_file()
    assert not workflow.progress_file().exists()


def test_the_progress_file_lives_in_the_user_data_directory_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTN_COURSE_PROGRESS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(workflow.sys, "platform", "linux")
    assert workflow.progress_file() == tmp_path / "attention-step-by-step" / "progress.json"
    assert Path(__file__).resolve().parents[2] not in workflow.progress_file().parents


def test_the_progress_command_prints_and_resets(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTN_COURSE_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setattr(workflow, "_RESULTS", {})                  # a fresh process: no verdicts
    (tmp_path / "progress.json").write_text('{"passed": {"masking.prefix_lm_mask": "2026-01-01"}}')
    assert tools_main(["progress"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "progress.json") in out and "00 start_here: 0 of" in out
    assert "05 masking: 1 of" in out
    assert tools_main(["progress", "--reset"]) == 0 and "progress reset" in capsys.readouterr().out
    assert not (tmp_path / "progress.json").exists()


def test_every_notebook_registers_its_exercises_with_three_hints():
    assert {ex.slug for ex in exercises.EXERCISES.values()} == {lesson.slug for lesson in COURSE}
    assert all(len(ex.hints) == 3 and all(ex.hints) for ex in exercises.EXERCISES.values())

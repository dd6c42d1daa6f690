"""The exercise workflow (``exercises.workflow``): registration, stubs, hints on demand, progress."""

from __future__ import annotations

import pytest
import torch

from attn_helpers import exercises
from attn_helpers.exercises import workflow
from attn_helpers.exercises.core import check_function


def reference(x):
    return x * 2


def test_a_stub_is_reported_as_not_implemented_and_nothing_more():
    def stub(x):
        raise NotImplementedError

    result = check_function(stub, reference, [{"x": torch.ones(3)}], what="double")
    assert not result and result.message == "double is not implemented yet."
    result = check_function(lambda x: None, reference, [{"x": torch.ones(3)}], what="double")
    assert not result and "not implemented yet" in result.message and "Hint" not in result.message


def test_registered_checker_records_progress_and_gives_hints(capsys):
    @workflow.exercise("start_here.test_double", "double a tensor",
                       hints=("think", "y = 2 x", "return x * 2"))
    def check_double(fn):
        return check_function(fn, reference, [{"x": torch.ones(3)}], what="double")

    try:
        assert workflow.progress(show=False)["start_here"]["start_here.test_double"] is None
        assert not check_double(lambda x: x)
        assert workflow.progress(show=False)["start_here"]["start_here.test_double"] is False
        assert check_double(lambda x: x + x)
        table = workflow.progress()
        assert table["start_here"]["start_here.test_double"] is True
        assert "double a tensor" in capsys.readouterr().out
        for level, text in ((1, "think"), (2, "y = 2 x"), (3, "return x * 2")):
            exercises.hint("start_here.test_double", level)
            out = capsys.readouterr().out
            assert f"Hint {level} of 3" in out and text in out
    finally:
        workflow.EXERCISES.pop("start_here.test_double", None)
        workflow._RESULTS.pop("start_here.test_double", None)


def test_bad_keys_and_levels_are_refused():
    with pytest.raises(ValueError, match="level must be 1, 2 or 3"):
        exercises.hint("start_here.anything", 4)
    with pytest.raises(TypeError, match="key must be a string"):
        exercises.hint(3)
    with pytest.raises(ValueError, match="no exercise 'start_here.nothing'"):
        exercises.hint("start_here.nothing")
    with pytest.raises(ValueError, match="slug of the course"):
        workflow.exercise("no_such_notebook.x", "x", hints=("a", "b", "c"))
    with pytest.raises(ValueError, match="three non-empty hints"):
        workflow.exercise("masking.x", "x", hints=("a", "b"))


def _register_double():
    @workflow.exercise("start_here.test_double", "double a tensor",
                       hints=("think", "y = 2 x", "return x * 2"))
    def check_double(fn):
        return check_function(fn, reference, [{"x": torch.ones(3)}], what="double")

    return check_double


def _unregister_double():
    workflow.EXERCISES.pop("start_here.test_double", None)
    workflow._RESULTS.pop("start_here.test_double", None)


def _state():
    return workflow.progress("start_here", show=False)["start_here"]["start_here.test_double"]


def test_a_reference_solution_never_counts_as_the_learners_pass():
    check_double = _register_double()
    try:
        result = check_double(lambda x: x + x, solution=True)
        assert result and "does not count as your pass" in result.message
        assert _state() is None
        assert not workflow.progress_file().exists()
        with pytest.raises(AssertionError, match="reference solution of start_here.test_double fails"):
            check_double(lambda x: x, solution=True)
        with pytest.raises(TypeError, match="solution must be True or False"):
            check_double(lambda x: x + x, solution="yes")
    finally:
        _unregister_double()


def test_a_pass_is_kept_across_kernels_in_the_progress_file_and_can_be_reset(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_PROGRESS_DIR", str(tmp_path / "p"))
    check_double = _register_double()
    try:
        assert not check_double(lambda x: x)                       # a failure is not written
        assert not workflow.progress_file().exists()
        assert check_double(lambda x: x + x)
        assert workflow.progress_file() == tmp_path / "p" / "progress.json"
        workflow._RESULTS.clear()                                    # a new kernel, another notebook
        assert _state() is True
        workflow.progress_file().write_text("not json")              # a damaged file reads as empty
        assert _state() is None
        assert check_double(lambda x: x + x)
        assert workflow.reset_progress() == tmp_path / "p" / "progress.json"
        assert not workflow.progress_file().exists()
        assert _state() is None
    finally:
        _unregister_double()


def test_progress_of_one_notebook_and_a_bad_slug(capsys):
    table = workflow.progress("masking")
    assert list(table) == ["masking"] and all(v is None for v in table["masking"].values())
    out = capsys.readouterr().out
    assert out.startswith("05 masking: 0 of ") and "01 rnn" not in out
    with pytest.raises(ValueError, match="slug must be one of"):
        workflow.progress("no_such_notebook")


def test_the_progress_file_lives_in_the_user_data_directory_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTN_COURSE_PROGRESS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(workflow.sys, "platform", "linux")
    assert workflow.progress_file() == tmp_path / "attention-step-by-step" / "progress.json"
    repo = __import__("pathlib").Path(__file__).resolve().parents[2]
    assert repo not in workflow.progress_file().parents


def test_the_progress_command_prints_and_resets(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, ATTN_COURSE_PROGRESS_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "attn_helpers", "progress"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "progress.json") in out and "00 start_here: 0 of" in out
    (tmp_path / "progress.json").write_text('{"passed": {"masking.window_mask": "2026-01-01"}}')
    out = subprocess.run([sys.executable, "-m", "attn_helpers", "progress"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "05 masking: 1 of" in out
    out = subprocess.run([sys.executable, "-m", "attn_helpers", "progress", "--reset"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "progress reset" in out and not (tmp_path / "progress.json").exists()


def test_a_forbidden_library_call_fails_the_check_by_name_and_is_restored():
    import torch.nn.functional as F

    import attn_helpers as ah

    def ref(q):
        return ah.max_entropy(q.shape[-1]) * torch.ones(())

    def lazy(q):
        return ah.max_entropy(q.shape[-1]) * torch.ones(())

    cases = [{"q": torch.ones(2, 3)}]
    forbid = [(ah, "max_entropy"), (F, "scaled_dot_product_attention")]
    result = check_function(lazy, ref, cases, what="your entropy", forbid=forbid)
    assert not result and "called attn_helpers.max_entropy" in result.message
    assert "Write the steps yourself" in result.message
    assert ah.max_entropy(4) == pytest.approx(1.3862944)                 # restored afterwards
    assert F.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"
    own = check_function(lambda q: torch.log(torch.tensor(float(q.shape[-1]))), ref, cases,
                         forbid=forbid)
    assert own, own.message


def test_a_forbidden_function_imported_by_name_is_blocked_too():
    import attn_helpers as ah

    namespace = {"max_entropy": ah.max_entropy, "torch": torch}
    exec("def lazy(q):\n    return max_entropy(q.shape[-1]) * torch.ones(())", namespace)

    def ref(q):
        return torch.log(torch.tensor(float(q.shape[-1])))

    result = check_function(namespace["lazy"], ref, [{"q": torch.ones(2, 3)}],
                            forbid=[(ah, "max_entropy")])
    assert not result and "called attn_helpers.max_entropy" in result.message
    assert namespace["max_entropy"] is ah.max_entropy                    # restored


def test_the_course_own_code_or_a_solution_never_passes_as_the_learners():
    import attn_helpers as ah
    from attn_helpers.multihead import MultiHeadAttention

    check_double = _register_double()
    try:
        def double_solution(x):
            return x + x

        result = check_double(double_solution)
        assert not result and "reference solution from the collapsed cell" in result.message
        assert _state() is False
        result = check_double(ah.max_entropy)                   # the course's own function
        assert not result and "the course's own attn_helpers" in result.message

        class Lazy(MultiHeadAttention):                          # inherits the course's forward
            pass

        result = check_double(Lazy)
        assert not result and "a subclass of the course's own" in result.message

        class Own(MultiHeadAttention):                           # writes its own forward: judged
            def forward(self, x):
                return x + x

        assert "course's own" not in check_double(Own).message
        assert check_double(lambda x: x + x)
    finally:
        _unregister_double()


def test_the_latest_verdict_wins_a_failure_after_a_saved_pass_removes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_PROGRESS_DIR", str(tmp_path / "p"))
    check_double = _register_double()

    def stub(x):
        raise NotImplementedError

    try:
        assert check_double(lambda x: x + x)
        workflow._RESULTS.clear()                                    # a new kernel: the saved pass
        assert _state() is True
        assert not check_double(stub)                                # Run All on the stub
        assert _state() is False
        workflow._RESULTS.clear()                                    # and the file says so too
        assert _state() is None and "start_here.test_double" not in workflow._read_passes()
        assert check_double(lambda x: x + x)
        assert check_double(lambda x: x + x, solution=True)          # never touches the record
        assert not check_double(lambda x: x)
        assert check_double(lambda x: x + x, solution=True)
        assert _state() is False
    finally:
        _unregister_double()


def test_wrapping_a_solution_a_reference_or_a_mistake_is_refused_by_name():
    import attn_helpers.exercises.start_here as start_here

    def softmax_with_temperature_solution(scores, t):
        e = torch.exp(scores / t - (scores / t).amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    namespace = {"softmax_with_temperature_solution": softmax_with_temperature_solution,
                 "start_here": start_here, "torch": torch}
    exec("def wrapper_a(s, t):\n    return softmax_with_temperature_solution(s, t)\n"   # noqa: S102
         "def wrap_reference(s, t):\n    return start_here.softmax_with_temperature_reference(s, t)\n"
         "def own(s, t):\n    e = torch.exp(s / t - (s / t).amax(-1, keepdim=True))\n"
         "    return e / e.sum(-1, keepdim=True)\n", namespace)
    check = start_here.check_softmax_with_temperature
    result = check(namespace["wrapper_a"])
    assert not result and "called softmax_with_temperature_solution, the reference solution" in (
        result.message) and "never counts as your pass" in result.message
    assert namespace["softmax_with_temperature_solution"] is softmax_with_temperature_solution
    result = check(namespace["wrap_reference"])
    assert not result and "softmax_with_temperature_reference, the checker's own reference" in (
        result.message)
    assert start_here.softmax_with_temperature_reference.__name__.endswith("_reference")  # restored

    def closure(s, t):                                           # reached through a closure
        return softmax_with_temperature_solution(s, t)

    assert "the reference solution" in check(closure).message
    assert check(namespace["own"])
    assert check(softmax_with_temperature_solution, solution=True)  # a solution may run itself
    # a class's method reaching the checker's reference, through the module attribute
    from attn_helpers.exercises import multi_head

    class Wrapper(torch.nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.h = num_heads
            self.in_proj = torch.nn.Linear(d_model, 3 * d_model)
            self.out_proj = torch.nn.Linear(d_model, d_model)

        def forward(self, x, mask=None):
            return multi_head._reference(x, mask, self.h, 0)

    result = multi_head.check_multi_head_module(Wrapper)
    assert not result and "the checker's" in result.message


def test_a_solution_reached_by_any_alias_is_refused_and_restored():
    """Review 3: a default argument, a list, functools.partial, a class attribute and a globals()
    lookup all reach the same function object; its code refuses while the learner's runs."""
    from attn_helpers.exercises.masking import check_window_mask

    notebook = {"torch": torch}                                    # a notebook's globals
    exec(  # noqa: S102 - the cells a learner might write
        "import functools\n"
        "def window_mask_solution(lengths, n, window):\n"
        "    j = torch.arange(n)\n"
        "    real = j[None, :] >= n - lengths[:, None]\n"
        "    offset = j[:, None] - j[None, :]\n"
        "    return real[:, None, :] & (offset >= 0) & (offset < window)\n"
        "box, partial = [window_mask_solution], functools.partial(window_mask_solution)\n"
        "class Holder:\n"
        "    f = staticmethod(window_mask_solution)\n"
        "def by_default(l, n, w, _f=window_mask_solution):\n    return _f(l, n, w)\n"
        "def by_list(l, n, w):\n    return box[0](l, n, w)\n"
        "def by_partial(l, n, w):\n    return partial(l, n, w)\n"
        "def by_class(l, n, w):\n    return Holder.f(l, n, w)\n"
        "def by_globals(l, n, w):\n    return globals()['window_mask_solution'](l, n, w)\n",
        notebook)
    solution = notebook["window_mask_solution"]
    code = solution.__code__
    for name in ("by_default", "by_list", "by_partial", "by_class", "by_globals"):
        result = check_window_mask(notebook[name])
        assert not result and "window_mask_solution, the reference solution" in result.message, name
        assert solution.__code__ is code                                        # restored
    assert check_window_mask(solution, solution=True)


def test_refusing_ops_catches_every_route_to_an_aten_op():
    import torch.nn.functional as F  # noqa: N812

    from attn_helpers.exercises.core import Refused, refusing_ops

    guard = refusing_ops(["_softmax_backward_data"], "write it yourself", autograd=True)
    s, g = torch.randn(3, 5), torch.randn(3, 5)

    def backward():
        x = s.clone().requires_grad_()
        torch.softmax(x, -1).backward(g)

    routes = [
        lambda: torch.ops.aten._softmax_backward_data(g, torch.softmax(s, -1), -1, s.dtype),
        lambda: torch.softmax(s.clone().requires_grad_(), -1).grad_fn(g),
        lambda: torch.func.jvp(lambda x: torch.softmax(x, -1), (s,), (g,)),
        lambda: torch.func.vjp(lambda x: torch.softmax(x, -1), s)[1](g),
        lambda: torch.autograd.grad(torch.softmax(s.clone().requires_grad_(), -1), s, g),
        backward,
    ]
    for route in routes:
        with pytest.raises(Refused, match="write it yourself"), guard({}):
            route()
    with guard({}):                                              # the formula itself runs
        a = torch.softmax(s, -1)
        a * (g - (a * g).sum(-1, keepdim=True))
    assert torch.autograd.grad is not None and torch.Tensor.backward.__name__ == "backward"
    sdpa = refusing_ops(["scaled_dot_product_attention", "_scaled_dot_product_*"], "no sdpa")
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    for route in (lambda: torch.ops.aten.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                  lambda: F.scaled_dot_product_attention(q, q, q)):
        with pytest.raises(Refused, match="no sdpa"), sdpa({}):
            route()


def test_refusing_autograd_refuses_a_graph_but_not_inputs_that_require_grad():
    """A grad_fn called by hand or the engine needs a tensor that requires grad: refused when made
    inside the guard; an input that requires grad is handed over detached, so using it is not."""
    from attn_helpers.exercises.core import Refused, refusing_ops

    guard = refusing_ops([], "write it yourself", autograd=True)
    s, g = torch.randn(3, 5), torch.randn(3, 5)
    routes = [lambda: (s.clone().requires_grad_() * 2).grad_fn(g),
              lambda: torch.nn.Parameter(s.clone()) @ g.mT]
    for route in routes:
        with pytest.raises(Refused, match="write it yourself.*requires grad"), guard({}):
            route()
    inputs = {"s": s.clone().requires_grad_(), "pair": (g.clone().requires_grad_(), 3)}
    with guard(inputs):
        out = torch.softmax(inputs["s"], -1) * inputs["pair"][0]
    assert not out.requires_grad and not inputs["s"].requires_grad
    assert torch.equal(inputs["s"], s) and inputs["pair"][1] == 3


def test_a_list_of_outputs_counts_as_the_tuple_the_reference_returns():
    """Review 7: returning [dW_Q, dW_K] was refused as "1 value(s); expected 2"."""
    from attn_helpers.exercises.core import check_function

    def reference(x):
        return x * 2, x + 1

    cases = [{"x": torch.arange(3.0)}]
    assert check_function(lambda x: [x * 2, x + 1], reference, cases)
    assert not check_function(lambda x: [x * 2, x + 2], reference, cases)
    one = check_function(lambda x: [x * 2], lambda x: x * 2, cases)
    assert not one            # a list where one tensor is expected is still not that tensor

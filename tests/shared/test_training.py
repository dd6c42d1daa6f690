"""attn_helpers.training: the loop, its seeds and evaluations, checkpoints, bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attn_helpers import training

W_TRUE = torch.tensor([[2.0], [-1.0], [0.5]])


def make_batch(step, generator):
    """A tiny linear regression: y = x @ w_true + noise."""
    x = torch.randn(32, 3, generator=generator)
    return x, x @ W_TRUE + 0.01 * torch.randn(32, 1, generator=generator)


def loss_fn(model, x, y):
    return nn.functional.mse_loss(model(x), y)


def fresh_linear(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(3, 1)


def test_a_few_steps_lower_the_loss_reproducibly_with_a_seed():
    runs = [training.train(fresh_linear(), make_batch, loss_fn, steps=60, lr=0.05, seed=s,
                           progress=False).losses for s in (3, 3, 4)]
    assert len(runs[0]) == 60 and runs[0][-1] < 0.1 * sum(runs[0][:5]) / 5
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_evaluate_is_called_in_eval_mode_without_gradients():
    seen = []

    def evaluate(model):
        seen.append((model.training, torch.is_grad_enabled()))
        return {"weight norm": model.weight.norm().item()}

    result = training.train(fresh_linear(), make_batch, loss_fn, steps=10, evaluate=evaluate,
                            eval_every=4, progress=False)
    assert [step for step, _ in result.evaluations] == [4, 8, 10]
    assert seen == [(False, False)] * 3


def test_checkpoint_round_trip_and_the_wrong_model_refused(tmp_path):
    model, other = fresh_linear(0), fresh_linear(1)
    path = training.save_checkpoint(model, tmp_path / "m.pt", {"task": "reversal", "acc": [0.5]})
    assert set(torch.load(path, weights_only=True)) == {"state_dict", "metadata"}
    assert training.load_checkpoint(other.train(), path) == {"task": "reversal", "acc": [0.5]}
    assert not other.training and torch.equal(model.weight, other.weight)
    with pytest.raises(RuntimeError, match="size mismatch|Missing key|Unexpected key"):
        training.load_checkpoint(nn.Linear(4, 1), path)


def test_token_accuracy():
    predictions = torch.tensor([[1, 2, 3], [4, 5, 0]])
    targets = torch.tensor([[1, 2, 4], [4, 0, 0]])
    assert training.token_accuracy(predictions, targets) == pytest.approx(4 / 6)
    real = torch.tensor([[True, True, True], [True, True, False]])
    assert training.token_accuracy(predictions, targets, real) == pytest.approx(3 / 5)


def nan_loss(model, x, y):
    return loss_fn(model, x, y) * float("nan")


@pytest.mark.parametrize("call, error, pattern", [
    (lambda p: training.train(fresh_linear(), make_batch, loss_fn, steps=0), ValueError,
     "steps must be a positive int, got 0"),
    (lambda p: training.train(fresh_linear(), make_batch, loss_fn, steps=2, lr=0.0), ValueError,
     "lr must be > 0"),
    (lambda p: training.train(fresh_linear(), make_batch, nan_loss, steps=3, progress=False),
     FloatingPointError, "loss became nan at step 1"),
    (lambda p: training.load_checkpoint(fresh_linear(), p / "missing.pt"), FileNotFoundError,
     "missing.pt; a study in studies/ writes it"),
    (lambda p: training.checkpoint_path("../escape"), ValueError, "name must be letters"),
    (lambda p: training.token_accuracy(torch.zeros(2, 3), torch.zeros(2, 2)), ValueError,
     r"predictions \(2, 3\) and targets \(2, 2\)"),
    (lambda p: training.token_accuracy(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2)),
     ValueError, "mask must be bool"),
])
def test_bad_inputs(tmp_path, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(tmp_path)

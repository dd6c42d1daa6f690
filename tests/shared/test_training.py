"""attn_helpers.training: the loop lowers the loss, is reproducible with a seed, checkpoints make
a round trip, and bad input is refused with a clear message."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attn_helpers import training
from attn_helpers.lessons import rnn_bottleneck as seq2seq
from attn_helpers.lessons import tasks


def regression_problem():
    """A tiny linear regression: y = x @ w_true + noise."""
    w_true = torch.tensor([[2.0], [-1.0], [0.5]])

    def make_batch(step, generator):
        x = torch.randn(32, 3, generator=generator)
        return x, x @ w_true + 0.01 * torch.randn(32, 1, generator=generator)

    def loss_fn(model, x, y):
        return nn.functional.mse_loss(model(x), y)

    return make_batch, loss_fn


def fresh_linear(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(3, 1)


def test_a_few_steps_lower_the_loss_reproducibly_with_a_seed():
    make_batch, loss_fn = regression_problem()
    runs = [training.train(fresh_linear(), make_batch, loss_fn, steps=60, lr=0.05, seed=s,
                           progress=False).losses for s in (3, 3, 4)]
    assert len(runs[0]) == 60 and runs[0][-1] < 0.1 * sum(runs[0][:5]) / 5
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_a_few_steps_lower_the_seq2seq_loss():
    config = seq2seq.TrainConfig("dates", "general", steps=25, finetune_steps=0, batch_size=16, d_emb=8,
                                 d_enc=8, d_attn=8)
    _, result = seq2seq.train_seq2seq(config, progress=False)
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5 - 0.15


def test_evaluate_is_called_in_eval_mode_without_gradients():
    make_batch, loss_fn = regression_problem()
    seen = []

    def evaluate(model):
        seen.append((model.training, torch.is_grad_enabled()))
        return {"weight norm": model.weight.norm().item()}

    result = training.train(fresh_linear(), make_batch, loss_fn, steps=10, evaluate=evaluate,
                            eval_every=4, progress=False)
    assert [step for step, _ in result.evaluations] == [4, 8, 10]
    assert seen == [(False, False)] * 3


def test_checkpoint_round_trip_and_the_wrong_model_refused(tmp_path):
    model, other = (seq2seq.Seq2Seq(13, 13, attention="additive", d_emb=8, d_enc=6, d_attn=5)
                    for _ in range(2))
    path = training.save_checkpoint(model, tmp_path / "m.pt", {"task": "reversal", "acc": [0.5]})
    payload = torch.load(path, weights_only=True)        # plain tensors and JSON-like metadata
    assert set(payload) == {"state_dict", "metadata"}
    assert training.load_checkpoint(other.train(), path) == {"task": "reversal", "acc": [0.5]}
    assert not other.training
    batch = tasks.make_batch("reversal", 3, torch.Generator().manual_seed(0))
    assert torch.equal(model.eval()(batch.src, batch.src_lengths, batch.tgt_in)[0],
                       other(batch.src, batch.src_lengths, batch.tgt_in)[0])
    with pytest.raises(RuntimeError, match="size mismatch|Missing key|Unexpected key"):
        training.load_checkpoint(nn.Linear(4, 1), path)


def test_token_accuracy():
    predictions = torch.tensor([[1, 2, 3], [4, 5, 0]])
    targets = torch.tensor([[1, 2, 4], [4, 0, 0]])
    assert training.token_accuracy(predictions, targets) == pytest.approx(4 / 6)
    real = torch.tensor([[True, True, True], [True, True, False]])
    assert training.token_accuracy(predictions, targets, real) == pytest.approx(3 / 5)


def test_bad_inputs(tmp_path):
    make_batch, loss_fn = regression_problem()
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        training.train(fresh_linear(), make_batch, loss_fn, steps=0)
    with pytest.raises(ValueError, match="lr must be > 0"):
        training.train(fresh_linear(), make_batch, loss_fn, steps=2, lr=0.0)

    def nan_loss(model, x, y):
        return loss_fn(model, x, y) * float("nan")

    with pytest.raises(FloatingPointError, match="loss became nan at step 1"):
        training.train(fresh_linear(), make_batch, nan_loss, steps=3, progress=False)
    with pytest.raises(FileNotFoundError, match="missing.pt; a study in studies/ writes it"):
        training.load_checkpoint(fresh_linear(), tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="name must be letters"):
        training.checkpoint_path("../escape")
    with pytest.raises(ValueError, match=r"predictions \(2, 3\) and targets \(2, 2\)"):
        training.token_accuracy(torch.zeros(2, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="mask must be bool"):
        training.token_accuracy(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2))

"""Notebook 10's checkers refuse code that is not the learner's: a subclass of a ``*_solution`` or
of a course class (also through ``super().forward``), a method taken from one, a partial of a
solution, the course's own classes built inside ``forward``, the course's functions that do the
whole exercise, and the known-mistake generators. Each route goes through the registered checker,
as in the notebook."""

from __future__ import annotations

import functools

import torch.nn.functional as F
from torch import nn

import attn_helpers as ah
from attn_helpers.exercises import build_gpt as ex
from attn_helpers.exercises.build_gpt_mistakes import attention_variant, generate_variant
from attn_helpers.lessons import build_gpt as bg
from attn_helpers.lessons import build_gpt_train as bgt
from attn_helpers.transformer import FeedForward


class CausalSelfAttention_solution(nn.Module):  # noqa: N801 - the notebook's name
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, cache=None):
        b, n, d = x.shape
        h = self.num_heads
        start = 0 if cache is None else len(cache)
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            cache.append(k, v)
            k, v = cache.keys, cache.values
        out, _ = ah.scaled_dot_product_attention(q, k, v, ah.causal_mask(start + n)[start:])
        return self.out(out.transpose(1, 2).reshape(b, n, d))


def train_step_solution(model, optimizer, chunk):
    inputs, targets = chunk[:, :-1], chunk[:, 1:]
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _refused(result, *words):
    assert not result, result.message
    for word in words:
        assert word in result.message, result.message


def _attention_init(self, d_model, num_heads):
    nn.Module.__init__(self)
    self.num_heads = num_heads
    self.qkv = nn.Linear(d_model, 3 * d_model)
    self.out = nn.Linear(d_model, d_model)


def test_the_solution_passes_only_as_a_solution_and_own_code_passes():
    assert ex.check_attention(CausalSelfAttention_solution, solution=True)

    def forward(self, x, cache=None):
        b, n, d = x.shape
        h = self.num_heads
        start = 0 if cache is None else len(cache)
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            cache.append(k, v)
            k, v = cache.keys, cache.values
        out, _ = ah.scaled_dot_product_attention(q, k, v, ah.causal_mask(start + n)[start:])
        return self.out(out.transpose(1, 2).reshape(b, n, d))

    CausalSelfAttention = type("CausalSelfAttention", (nn.Module,),  # the learner's own code
                               {"__init__": _attention_init, "forward": forward})
    assert ex.check_attention(CausalSelfAttention)
    assert ex.check_train_step(lambda m, o, c: _own_step(m, o, c))


def _own_step(model, optimizer, chunk):
    logits = model(chunk[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def test_subclasses_of_a_solution_or_a_course_class_are_refused():
    class A(CausalSelfAttention_solution):
        pass

    class B(CausalSelfAttention_solution):
        def forward(self, x, cache=None):
            return super().forward(x, cache)

    class C(bg.CausalSelfAttention):
        def forward(self, x, cache=None):
            return super().forward(x, cache)

    class D(bg.Block):
        def forward(self, x):
            return super().forward(x)

    class E(bg.GPT):
        def forward(self, tokens):
            return super().forward(tokens)

    _refused(ex.check_attention(A), "derives from CausalSelfAttention_solution")
    _refused(ex.check_attention(B), "derives from CausalSelfAttention_solution")
    _refused(ex.check_attention(C), "the course's own")
    _refused(ex.check_block(D), "the course's own")
    _refused(ex.check_model(E), "the course's own")


def test_a_method_taken_from_a_solution_or_the_course_is_refused():
    class A(nn.Module):
        __init__ = _attention_init
        forward = CausalSelfAttention_solution.forward

    class B(nn.Module):
        __init__ = _attention_init
        forward = bg.CausalSelfAttention.forward

    _refused(ex.check_attention(A), "reference solution")
    _refused(ex.check_attention(B), "the course's own")


def test_building_the_course_class_inside_forward_is_refused():
    class A(nn.Module):
        __init__ = _attention_init

        def forward(self, x, cache=None):
            ref = bg.CausalSelfAttention(x.shape[-1], self.num_heads)
            ref.load_state_dict(self.state_dict())
            return ref(x, cache)

    class B(nn.Module):
        __init__ = _attention_init

        def forward(self, x, cache=None):
            return attention_variant(self)(x, cache)

    _refused(ex.check_attention(A), "CausalSelfAttention.forward", "course's own code")
    _refused(ex.check_attention(B), "attention_variant")


def test_partials_wrappers_and_course_functions_for_the_step_are_refused():
    _refused(ex.check_train_step(functools.partial(train_step_solution)), "reference solution")
    _refused(ex.check_train_step(functools.partial(bgt.train_step)), "the course's own")

    def wraps_course(m, o, c):
        return bgt.train_step(m, o, c)

    def loss_from_course(m, o, c):
        loss = bg.next_token_loss(m, c)
        o.zero_grad()
        loss.backward()
        o.step()
        return loss.item()

    _refused(ex.check_train_step(wraps_course), "train_step", "course's own code")
    _refused(ex.check_train_step(loss_from_course), "next_token_loss", "course's own code")


def test_wrappers_around_generation_are_refused():
    def wraps_course(*args):
        return bg.generate(*args)

    def wraps_mistake(*args):
        return generate_variant("right")(*args)

    _refused(ex.check_generate(wraps_course), "generate", "course's own code")
    _refused(ex.check_generate(wraps_mistake), "generate_variant")
    _refused(ex.check_generate(functools.partial(bg.generate)), "the course's own")


def test_a_step_without_a_return_gets_its_own_message():
    def no_return(model, optimizer, chunk):
        _own_step(model, optimizer, chunk)

    _refused(ex.check_train_step(no_return), "returned None", "return the loss")


def test_the_library_pieces_a_learner_may_use_still_work():
    class Block(nn.Module):
        def __init__(self, d_model, num_heads, d_ff):
            super().__init__()
            self.norm1 = nn.LayerNorm(d_model)
            self.attn = CausalSelfAttention_solution(d_model, num_heads)
            self.norm2 = nn.LayerNorm(d_model)
            self.ff = FeedForward(d_model, d_ff, activation="gelu")

        def forward(self, x, cache=None):
            x = x + self.attn(self.norm1(x), cache)
            return x + self.ff(self.norm2(x))

    class OldBlock(Block):
        def forward(self, x):
            return super().forward(x)

    assert ex.check_block(Block)
    _refused(ex.check_block(OldBlock), "takes no cache", "Block.forward(x, cache=None)")

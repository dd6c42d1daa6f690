"""Notebook 10's exercise 5: generation with a KV cache, temperature and top-k (see
:mod:`.build_gpt`, which imports this module last, so the exercises register in the notebook's
order)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..lessons import build_gpt as bg
from .build_gpt import _model_cfg
from .build_gpt_hints import PAST_CONTEXT
from .build_gpt_mistakes import (
    GENERATE_MISTAKES,
    generate_variant,
)
from .build_gpt_support import _INSTEAD, _forbid, _function_or_refusal, _randomise, _safe
from .core import (
    CheckResult,
    Mistake,
    Refused,
    blocking,
    check_function,
    seeded,
)
from .workflow import exercise

# --- 5. generation with a KV cache ---------------------------------------------------------


@exercise("build_gpt.generate", "generation with a KV cache, temperature and top-k", hints=(
    "With a cache the prompt goes through once; after that only the new character runs, at its "
    "own position, and its keys and values join the cache. Temperature and top-k reshape the "
    "logits before the softmax. Past the context n_ctx, each character's position is counted from "
    "the start of the window the model reads, not from the start of the text.",
    "The next character's logits are the last position's, (b, vocab), divided by T. For top-k: "
    "which one number per row separates the k largest logits from the rest, and what must the "
    "others become so that the softmax gives them nothing? With a cache: what goes into the next "
    "call, and at which position? Once the text is longer than the context, every character in "
    "the window has moved one position down since the last step: what does that do to keys and "
    "values computed earlier?",
    "logits = ...                              # (b, vocab): the last position's, over T\n"
    "if top_k is not None:\n"
    "    kth = ...                             # (b, 1): each row's k-th largest logit\n"
    "    logits = ...                          # the logits below kth set to -inf\n"
    "nxt = torch.multinomial(..., 1, generator=generator)   # (b, 1), from the probabilities\n"
    "tokens = torch.cat([tokens, nxt], dim=1)\n"
    "if use_cache and ...:                     # the cache still has room\n"
    "    new, start = ...                      # nxt at its position\n"
    "else:                                     # no cache, or past the context\n"
    "    new, start, caches = ...              # the window the model reads, from position 0"))
def check_generate(generate: Callable) -> CheckResult:
    """Exercise: ``generate(model, prompt (b, n0), steps, temperature, top_k, use_cache,
    generator) -> tokens (b, n0 + steps)``, sampling with ``torch.multinomial(probs, 1,
    generator=generator)``; with and without the cache it must give the same tokens, also once
    the text outgrows the context (three of the eight cases do)."""
    refusal = _function_or_refusal(generate, "generate")
    if refusal is not None:
        return refusal
    model = _randomise(bg.GPT(_model_cfg(vocab=13, context=24, layers=2)), 501, std=0.4)
    g = seeded(502)
    cases = []
    for b, n0, steps, t, k, cache in [(2, 3, 12, 1.0, None, True), (2, 3, 12, 1.0, None, False),
                                      (3, 5, 15, 0.5, None, True), (2, 1, 20, 2.0, 4, True),
                                      (2, 4, 10, 0.7, 3, False), (1, 6, 18, 1.3, 1, True),
                                      (2, 4, 36, 0.9, None, True), (2, 4, 36, 0.9, None, False),
                                      (1, 20, 14, 1.0, 5, True)]:
        cases.append({"prompt": torch.randint(0, 13, (b, n0), generator=g), "steps": steps,
                      "temperature": t, "top_k": k, "use_cache": cache,
                      "seed": int(torch.randint(0, 1000, (1,), generator=g))})

    global_draws = []     # the learner's calls that drew from torch's global random numbers

    def past_hint(exc, call):                   # call: (caches given?, tokens fed) when it failed
        cached, n = call
        if "cache is full" in str(exc) and n > 1:
            return "stale"                          # a window fed into the old cache
        return "cached" if cached else "plain"

    def runner(fn, learner=False):
        def run(prompt, steps, temperature, top_k, use_cache, seed):
            state = torch.random.get_rng_state()
            calls = []                       # the learner's model calls, to place an error

            def counting(tokens, start=0, caches=None):
                calls.append((caches is not None, tokens.shape[1]))
                return type(model).forward(model, tokens, start, caches)

            model.forward = counting
            try:
                out = fn(model, prompt, steps, temperature, top_k, use_cache,
                         torch.Generator().manual_seed(seed))
                if learner and not torch.equal(state, torch.random.get_rng_state()):
                    global_draws.append(seed)
            except ValueError as exc:
                full = "cache is full" in str(exc) or "past the context" in str(exc)
                past = prompt.shape[1] + len(calls) - 1 > model.cfg.context
                if full and past:            # the text had outgrown the context
                    raise Refused(f"generate failed once the text was longer than the context "
                                  f"n_ctx = {model.cfg.context} ({exc}).\nHint: "
                                  f"{PAST_CONTEXT[past_hint(exc, calls[-1])]}") from exc
                if use_cache and full:
                    raise Refused(f"with use_cache=True generate ran past the cache ({exc}).\n"
                                  f"Hint: {dict(GENERATE_MISTAKES)['whole_sequence_cached']}"
                                  ) from exc
                raise
            finally:
                del model.forward
            if out is None:
                return None
            if not isinstance(out, torch.Tensor) or out.shape != (prompt.shape[0],
                                                                  prompt.shape[1] + steps):
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"generate should return (b, n0 + steps) = "
                                 f"{(prompt.shape[0], prompt.shape[1] + steps)} tokens, got {got}")
            return out.double()
        return run

    result = check_function(
        runner(generate, learner=True), runner(generate_variant("right")), cases, what="generate",
        output_names=("the tokens",), atol=0, rtol=0, forbid=_forbid("generate"),
        instead=_INSTEAD, mistakes=[Mistake(_safe(runner(generate_variant(kind))), hint)
                  for kind, hint in GENERATE_MISTAKES])
    if not result:
        # Sampling among the k largest (topk's values and indices) is right too; it only draws
        # different random numbers, so it is compared with that way of sampling.
        among_k = check_function(runner(generate), runner(generate_variant("top_k_indices")),
                                 cases, what="generate", output_names=("the tokens",), atol=0,
                                 rtol=0)
        if among_k:
            result = CheckResult(True, among_k.message + " (You sample among the k largest "
                                 "logits' indices: right too; it draws different random numbers "
                                 "than masking the others to -inf, so it was checked against that "
                                 "way of sampling.)")
    if not result and global_draws and "\nHint: " not in result.message:
        result = CheckResult(False, result.message + "\nHint: your generate drew from torch's "
                             "global random numbers, not from the generator it was given: sample "
                             "with torch.multinomial(probs, 1, generator=generator), so that the "
                             "same seed gives the same tokens.")
    refusal = _check_cache_used(generate, model, cases) if result.passed else None
    return result if refusal is None else refusal


def _check_cache_used(generate: Callable, model: bg.GPT, cases: list[dict]) -> CheckResult | None:
    """A failure (or None): with ``use_cache`` each call after the first runs one new token at its
    position; without it, each call re-runs the whole sequence from position 0, with no cache."""
    def recording(tokens, start=0, caches=None):     # an empty cache counts as none
        calls.append((tokens.shape[1], start, caches is not None and caches[0].length > 0
                       if tokens.shape[1] > 1 else caches is not None))
        return type(model).forward(model, tokens, start, caches)

    for case in cases:
        calls = []
        n0, use_cache = case["prompt"].shape[1], case["use_cache"]
        model.forward = recording
        try:
            with blocking(_forbid("generate")):
                generate(model, case["prompt"], case["steps"], case["temperature"], case["top_k"],
                         use_cache, torch.Generator().manual_seed(case["seed"]))
        finally:
            del model.forward
        T = model.cfg.context
        for j, (n, start, cached) in enumerate(calls):
            length = n0 + j                          # the text's length before call j
            if j and length > T and (cached or n != T or start != 0):
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but past the context n_ctx = {T} call {j + 1} "
                    f"(the text {length} characters long) ran n = {n}, start = {start}, caches "
                    f"{'passed' if cached else 'not passed'}; expected the last n_ctx = {T} "
                    f"characters at start = 0, with no cache (or a new, empty one).\nHint: "
                    f"{PAST_CONTEXT['stale']}"))
            if length > T:
                continue
            if use_cache and not j and (n != n0 or start != 0):
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but the prompt of {n0} did not run in one "
                    f"call: the first call ran n = {n} at start = {start}.\nHint: with the cache, "
                    "the prompt goes through the model once, as one block at position 0; after "
                    "that, one new token per call."))
            if use_cache and j and not cached:
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but the cache was never used: call {j + 1} "
                    f"(prompt of {n0}) got no caches.\nHint: make the caches once with "
                    "model.new_caches() and hand the same ones to every call."))
            if use_cache and j and (n != 1 or start != n0 + j - 1):
                return CheckResult(False, (
                    f"Not yet: the tokens are right, but call {j + 1} (prompt of {n0}) ran n = {n} "
                    f"at start = {start}, caches passed; with the cache each call after the "
                    f"prompt runs only the token just sampled (n = 1), at its own position (here "
                    f"{n0 + j - 1}).\nHint: the cache already holds the keys and values of every "
                    "earlier position: feed it only what it has not seen."))
            if not use_cache and (cached or n != n0 + j or start != 0):
                return CheckResult(False, (
                    "Not yet: the tokens are right, but use_cache=False did not run without the "
                    f"cache: call {j + 1} (prompt of {n0}) ran n = {n}, start = {start}, caches "
                    f"{'passed' if cached else 'not passed'} (expected n = {n0 + j}, start = 0, no "
                    "caches).\nHint: without the cache, every step re-runs the whole sequence "
                    "so far from position 0 with caches=None; the notebook times the two paths "
                    "against each other."))
    return None

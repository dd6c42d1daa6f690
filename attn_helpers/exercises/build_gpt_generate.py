"""Notebook 10's exercise 5: generation with a KV cache, temperature and top-k (see
:mod:`.build_gpt`, which imports this module last, so the exercises register in the notebook's
order)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..lessons import build_gpt as bg
from .build_gpt import _model_cfg
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
    "logits before the softmax.",
    "The next character's logits are the last position's, (b, vocab), divided by T. For top-k: "
    "which one number per row separates the k largest logits from the rest, and what must the "
    "others become so that the softmax gives them nothing? With a cache: what goes into the next "
    "call, and at which position?",
    "logits = ...                              # (b, vocab): the last position's, over T\n"
    "if top_k is not None:\n"
    "    kth = ...                             # (b, 1): each row's k-th largest logit\n"
    "    logits = ...                          # the logits below kth set to -inf\n"
    "nxt = torch.multinomial(..., 1, generator=generator)   # (b, 1), from the probabilities\n"
    "tokens = torch.cat([tokens, nxt], dim=1)\n"
    "new, start = ...                          # cached: nxt at its position; else all, from 0"))
def check_generate(generate: Callable) -> CheckResult:
    """Exercise: ``generate(model, prompt (b, n0), steps, temperature, top_k, use_cache,
    generator) -> tokens (b, n0 + steps)``, sampling with ``torch.multinomial(probs, 1,
    generator=generator)``; with and without the cache it must give the same tokens."""
    refusal = _function_or_refusal(generate, "generate")
    if refusal is not None:
        return refusal
    model = _randomise(bg.GPT(_model_cfg(vocab=13, context=24, layers=2)), 501, std=0.4)
    g = seeded(502)
    cases = []
    for b, n0, steps, t, k, cache in [(2, 3, 12, 1.0, None, True), (2, 3, 12, 1.0, None, False),
                                      (3, 5, 15, 0.5, None, True), (2, 1, 20, 2.0, 4, True),
                                      (2, 4, 10, 0.7, 3, False), (1, 6, 18, 1.3, 1, True)]:
        cases.append({"prompt": torch.randint(0, 13, (b, n0), generator=g), "steps": steps,
                      "temperature": t, "top_k": k, "use_cache": cache,
                      "seed": int(torch.randint(0, 1000, (1,), generator=g))})

    global_draws = []     # the learner's calls that drew from torch's global random numbers

    def runner(fn, learner=False):
        def run(prompt, steps, temperature, top_k, use_cache, seed):
            state = torch.random.get_rng_state()
            try:
                out = fn(model, prompt, steps, temperature, top_k, use_cache,
                         torch.Generator().manual_seed(seed))
                if learner and not torch.equal(state, torch.random.get_rng_state()):
                    global_draws.append(seed)
            except ValueError as exc:
                if use_cache and ("cache is full" in str(exc) or "past the context" in str(exc)):
                    raise Refused(f"with use_cache=True generate ran past the cache ({exc}).\n"
                                  f"Hint: {dict(GENERATE_MISTAKES)['whole_sequence_cached']}"
                                  ) from exc
                raise
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
    def recording(tokens, start=0, caches=None):
        calls.append((tokens.shape[1], start, caches is not None))
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
        for j, (n, start, cached) in enumerate(calls):
            if use_cache and j and (not cached or n != 1 or start != n0 + j - 1):
                return CheckResult(False, (
                    "Not yet: the tokens are right, but the cache was never used: with use_cache "
                    "every call after the first should run only the new token (n = 1) at start = "
                    f"length - 1, caches passed in; call {j + 1} (prompt of {n0}) ran n = {n}, "
                    f"start = {start}, caches {'passed' if cached else 'not passed'} (expected n = 1, "
                    f"start = {n0 + j - 1}).\nHint: the cache was never used: make it once with "
                    "model.new_caches(), pass it to every call, and after the prompt feed only "
                    "the token just sampled."))
            if not use_cache and (cached or n != n0 + j or start != 0):
                return CheckResult(False, (
                    "Not yet: the tokens are right, but use_cache=False did not run without the "
                    f"cache: call {j + 1} (prompt of {n0}) ran n = {n}, start = {start}, caches "
                    f"{'passed' if cached else 'not passed'} (expected n = {n0 + j}, start = 0, no "
                    "caches).\nHint: without the cache, every step re-runs the whole sequence "
                    "so far from position 0 with caches=None; the notebook times the two paths "
                    "against each other."))
    return None

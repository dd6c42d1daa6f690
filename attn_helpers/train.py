"""Re-create the course's shipped checkpoints: ``python -m attn_helpers.train NAME``.

A module of ``attn_helpers`` makes a checkpoint trainable by decorating a function with
:func:`recipe`; the function trains its model from scratch (seeded) and returns
``(model, metadata)``. This command finds every recipe, so adding one needs no edit here.

    python -m attn_helpers.train --list        the recipes and where their checkpoints live
    python -m attn_helpers.train NAME [NAME]   train and save (attn_helpers/checkpoints/NAME.pt)
    python -m attn_helpers.train --all
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from collections.abc import Callable

from .training import checkpoint_path, save_checkpoint

__all__ = ["recipe", "recipes", "run_recipe"]

_RECIPES: dict[str, Callable] = {}


def recipe(name: str):
    """Register ``fn() -> (model, metadata)`` as the recipe for checkpoint ``name``."""
    checkpoint_path(name)  # validates the name

    def register(fn: Callable) -> Callable:
        if name in _RECIPES and _RECIPES[name] is not fn:
            raise ValueError(f"two recipes are named {name!r}")
        _RECIPES[name] = fn
        return fn

    return register


def recipes() -> dict[str, Callable]:
    """Every registered recipe, after importing all of ``attn_helpers``' modules."""
    import attn_helpers

    for module in pkgutil.walk_packages(attn_helpers.__path__, "attn_helpers."):
        if module.name not in ("attn_helpers.train", "attn_helpers.bench"):
            importlib.import_module(module.name)
    return dict(sorted(_RECIPES.items()))


def run_recipe(name: str, save: bool = True):
    """Train checkpoint ``name`` from scratch; save it unless ``save=False``.

    Returns ``(model, metadata, seconds)``.
    """
    available = recipes()
    if name not in available:
        raise ValueError(f"unknown recipe {name!r}; available: {', '.join(available) or 'none'}")
    started = time.monotonic()
    model, metadata = available[name]()
    seconds = time.monotonic() - started
    if save:
        save_checkpoint(model, name, {**metadata, "train_seconds": round(seconds, 1)})
    return model, metadata, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="recipes to train")
    parser.add_argument("--list", action="store_true", help="list the recipes")
    parser.add_argument("--all", action="store_true", help="train every recipe")
    args = parser.parse_args(argv)
    available = recipes()
    if args.list or not (args.names or args.all):
        for name in available:
            print(f"{name:<28} -> {checkpoint_path(name)}")
        return 0
    for name in available if args.all else args.names:
        model, metadata, seconds = run_recipe(name)
        size = checkpoint_path(name).stat().st_size
        print(f"{name}: trained in {seconds:.1f} s, saved {checkpoint_path(name)} ({size:,} bytes)")
        for key, value in metadata.items():
            text = str(value)
            print(f"  {key}: {text if len(text) <= 100 else text[:97] + '...'}")
    return 0


if __name__ == "__main__":
    # `python -m` runs this file as __main__, a second copy of the module; recipes register in
    # the imported attn_helpers.train, so run that copy's main.
    from attn_helpers.train import main as registered_main

    sys.exit(registered_main())

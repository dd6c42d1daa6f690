"""The course's tools: ``python -m attn_helpers COMMAND``.

    train [NAME ...] [--all] [--list]   re-create shipped checkpoints (attn_helpers/checkpoints/)
    bench widget|attention|browser ...  the speed and memory benchmarks (see attn_helpers.bench)
    thumbnails                          refresh the README's notebook pictures (docs/thumbnails/)
    progress [--reset]                  the learner's exercise table, kept across notebooks

``python -m attn_helpers.train ...`` and ``python -m attn_helpers.bench ...`` are aliases.
Nothing in the package imports this module.
"""

from __future__ import annotations

import argparse
import sys

from .training import RECIPES, checkpoint_path, run_recipe


def train_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers train",
                                     description="Re-create shipped checkpoints from scratch.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"recipes to train: {', '.join(RECIPES)}")
    parser.add_argument("--list", action="store_true", help="list the recipes")
    parser.add_argument("--all", action="store_true", help="train every recipe")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe(s) {', '.join(unknown)}; available: {', '.join(RECIPES)}")
    if args.list or not (args.names or args.all):
        for name, target in RECIPES.items():
            print(f"{name:<28} {target:<62} -> {checkpoint_path(name)}")
        return 0
    for name in RECIPES if args.all else args.names:
        _, metadata, seconds = run_recipe(name)
        size = checkpoint_path(name).stat().st_size
        print(f"{name}: trained in {seconds:.1f} s, saved {checkpoint_path(name)} ({size:,} bytes)")
        for key, value in metadata.items():
            text = str(value)
            print(f"  {key}: {text if len(text) <= 100 else text[:97] + '...'}")
    return 0


def progress_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers progress",
                                     description="Which exercises you have passed, notebook by "
                                                 "notebook (your own functions only).")
    parser.add_argument("--reset", action="store_true", help="forget every recorded pass")
    args = parser.parse_args(argv)
    from .exercises.workflow import progress, progress_file, reset_progress

    if args.reset:
        print(f"progress reset: removed {reset_progress()}")
        return 0
    print(f"Your exercises (kept in {progress_file()}):")
    progress()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("train", "bench", "thumbnails", "progress"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train_main(rest)
    if command == "progress":
        return progress_main(rest)
    if command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    from .course_map import main as course_map_main

    return course_map_main(["thumbnails", *rest])


if __name__ == "__main__":
    sys.exit(main())

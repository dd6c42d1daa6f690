"""The course's tools: ``python -m attn_helpers COMMAND``.

    bench widget|browser|attention|gpt ...  the speed and memory benchmarks (attn_helpers.bench)
    thumbnails                              refresh the README's notebook pictures
    progress [--reset]                      the learner's exercise table, kept across notebooks
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    command, *rest = (sys.argv[1:] if argv is None else argv) or [""]
    if command == "progress":
        parser = argparse.ArgumentParser(prog="python -m attn_helpers progress",
                                         description="Which exercises you have passed.")
        parser.add_argument("--reset", action="store_true", help="forget every recorded pass")
        from .exercises.workflow import progress, progress_file, reset_progress

        if parser.parse_args(rest).reset:
            print(f"progress reset: removed {reset_progress()}")
        else:
            print(f"Your exercises (kept in {progress_file()}):")
            progress()
        return 0
    if command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if command == "thumbnails":
        from .course_map import main as course_map_main

        return course_map_main(["thumbnails", *rest])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())

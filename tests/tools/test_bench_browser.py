"""``bench browser``'s verdict on a recorded pass (no browser started): checks fail on an error or
an unchanged picture; speed fails only on the same-run ratio to the floor; the numbers and ratios
are printed; ``--results`` judges a recorded pass."""

from __future__ import annotations

import json

from attn_helpers import bench
from attn_helpers.bench import browser

CHECKS = ("every cell ran, none shows an error", "a slider move changes the first widget's picture",
          "...and its readouts, entropy included")


def record(name: str, latencies: list[float], ok: bool = True, problems=()) -> dict:
    return {"notebook": name, "run_all_s": 12.0, "widgets": 1, "latencies_ms": latencies,
            "checks": dict.fromkeys(CHECKS, ok), "problems": list(problems)}


def results(*records, floor=(30.0,) * 30) -> dict:
    return {"floor_ms": list(floor), "notebooks": list(records),
            "server": ["attn_helpers.labserver: kernel websocket without Nagle's delay"]}


def test_the_ratio_to_the_floor_decides_speed_and_is_printed():
    checks, fast, text = browser.verdict(results(record("00_a", [40.0] * 8),
                                                 record("01_b", [59.0] * 8)))
    assert checks and fast
    assert "median   59.0 ms" in text and "1.97x the floor" in text and "floor" in text
    assert "without Nagle's delay" in text
    checks, fast, text = browser.verdict(results(record("00_a", [61.0] * 8)))
    assert checks and not fast and "NOT met" in text
    # a slow machine: everything 5x slower, floor included, still meets the ratio
    assert browser.verdict(results(record("00_a", [250.0] * 8), floor=[150.0] * 30))[1]
    # no timed move, or no floor: the ratio is not met
    assert not browser.verdict(results(record("00_a", [])))[1]
    assert not browser.verdict(results(record("00_a", [40.0] * 8), floor=[]))[1]


def test_a_failed_check_or_a_problem_fails_the_checks_whatever_the_speed():
    assert not browser.verdict(results(record("00_a", [31.0] * 8, ok=False)))[0]
    checks, _, text = browser.verdict(results(record("00_a", [31.0] * 8,
                                                     problems=["TimeoutError: Run All"])))
    assert not checks and "TimeoutError: Run All" in text


def test_results_file_is_judged_with_check(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results(record("00_a", [40.0] * 8))))
    assert bench.main(["browser", "--results", str(path), "--check"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)[0] == {"notebook": "00_a", "moves": 8, "median_ms": 40.0,
                                      "p90_ms": 40.0}
    assert "2x the floor: met" in out.err
    path.write_text(json.dumps(results(record("00_a", [90.0] * 8))))
    assert bench.main(["browser", "--results", str(path)]) == 0            # printed, not failed
    assert bench.main(["browser", "--results", str(path), "--check"]) == 1
    path.write_text(json.dumps(results(record("00_a", [40.0] * 8, ok=False))))
    assert bench.main(["browser", "--results", str(path)]) == 1            # a check always fails

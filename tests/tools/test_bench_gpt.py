"""``bench gpt``, run tiny: both models train, the ratio and the recipe's time are reported."""

from __future__ import annotations

import json

from attn_helpers.bench import gpt


def test_bench_gpt_runs_tiny_and_reports_the_ratio_and_the_recipe_time(capsys):
    assert gpt.main(["--tiny", "--steps", "3"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["ratio"] > 0 and set(result["median_step_ms"]) == {"course", "torch"}
    assert result["params"]["course"] == result["params"]["torch"]
    assert "training step" in out.err and "final recipe" in out.err

"""The scoring bench runs and reports positive rates."""

from __future__ import annotations

import pytest

from scoring.bench import main, run_scoring_bench


def test_run_scoring_bench_small() -> None:
    result = run_scoring_bench(iterations=20)
    assert result["iterations"] == 20
    assert result["tree_verdicts_per_s"] > 0
    assert result["judge_verdicts_per_s"] > 0
    assert result["tree_seconds"] > 0
    assert result["judge_seconds"] > 0


def test_run_scoring_bench_rejects_no_iterations() -> None:
    with pytest.raises(ValueError):
        run_scoring_bench(iterations=0)


def test_main_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    main(["5"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "scoring bench: 5 iterations"
    assert "verdicts/s" in out[1]
    assert len(out) == 4

"""``bench.scaling_bound``: when two instances could not reach 1.6x for lack of CPU."""

from __future__ import annotations

import math

import pytest

from collector.bench import scaling_bound


def _run(rate: float, busy: float, cores: int = 2) -> dict[str, object]:
    return {"spans_per_s": rate, "cpu": {"cores": cores, "cores_busy": busy, "busy": {"instance-1": busy}}}


@pytest.mark.parametrize(
    ("one_busy", "two_busy", "cores", "cpu_bound"),
    [
        (1.20, 1.77, 2, True),  # 1.6 x 1.20 = 1.92 cores > 1.8 usable: this machine cannot give it
        (0.60, 1.00, 2, False),  # 0.96 needed, 1.0 used: CPU was there, the service did not scale
        (0.60, 1.85, 2, True),  # two instances already used the usable cores
        (1.20, 1.77, 4, False),  # the same costs on 4 cores: 1.92 of 3.6 usable
        (math.nan, math.nan, 2, False),  # nothing measured: never called CPU-bound
    ],
)
def test_cpu_bound_when_the_target_needs_more_cores_than_usable(
    one_busy: float, two_busy: float, cores: int, cpu_bound: bool
) -> None:
    sc = scaling_bound(_run(10_000, one_busy, cores), _run(14_000, two_busy, cores))
    assert sc["ratio"] == pytest.approx(1.4)
    assert sc["cpu_bound"] is cpu_bound
    assert str(sc["bound"]).startswith("CPU-bound" if cpu_bound else "not CPU-bound")
    if math.isfinite(one_busy):
        assert sc["cores_needed"] == pytest.approx(1.6 * one_busy)

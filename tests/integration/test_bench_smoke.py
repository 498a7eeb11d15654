"""`toolwitness bench pipeline` at toy sizes on the real Kafka and Redis: every figure is measured."""

from __future__ import annotations

import json

import pytest

from collector.bench import run_pipeline_bench

pytestmark = pytest.mark.integration


async def test_bench_pipeline_smoke(kafka_bootstrap: str, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = await run_pipeline_bench(
        spans=2000, rate=1000, as_json=True, bootstrap=kafka_bootstrap, redis_url=redis_url, latency_seconds=2.0
    )
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # 2 = the run failed; 0/1 = measured, targets met/missed
    report = json.loads(out)

    assert report["spans"] == 2000 and report["traces"] == 80
    assert report["floor"]["spans"] == 2000 and report["floor"]["spans_per_s"] > 0
    e2e = report["e2e"]
    assert e2e["spans"] == 2000 and e2e["spans_per_s"] > 0
    assert e2e["decided_true"] == e2e["expectations"] == 80  # one expectation per trace, all decided
    assert e2e["offsets_committed"] is True
    assert report["ratio"] > 0

    lat = report["latency"]
    assert lat["traces"] == 80 and lat["achieved_rate"] > 0
    assert lat["missing"] == 0 and lat["statuses"] == {"SCORE_STATUS_TRUE": 80}
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]

    redis = report["redis"]
    assert redis["trace_bytes"] > 0
    assert all(redis["trace_keys"][k] > 0 for k in ("state", "pending", "decided"))

    names = [t["name"] for t in report["targets"]]
    assert len(names) == 3 and all(isinstance(t["met"], bool) for t in report["targets"])
    assert report["all_met"] == (rc == 0)

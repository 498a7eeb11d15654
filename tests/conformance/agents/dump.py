"""Print what a conformance run left: ``python dump.py <out dir> [--all]`` (any venv with opentelemetry-proto).

Tool-like spans (any attribute naming a tool, a span kind or a GenAI operation) are printed with
every attribute, values cut at 300 characters; ``--all`` prints every span.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    show_all = "--all" in argv
    req = ExportTraceServiceRequest()
    req.ParseFromString((out / "spans.pb").read_bytes())
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    spans.sort(key=lambda s: s.start_time_unix_nano)
    t0 = spans[0].start_time_unix_nano if spans else 0
    for s in spans:
        attrs = {kv.key: _value(kv.value) for kv in s.attributes}
        toolish = any("tool" in k or k in ("openinference.span.kind", "gen_ai.operation.name") for k in attrs)
        if not (toolish or show_all):
            continue
        print(
            f"--- {s.name!r} span={s.span_id.hex()} parent={s.parent_span_id.hex() or '-'} "
            f"trace={s.trace_id.hex()[:8]} t=+{(s.start_time_unix_nano - t0) / 1e6:.1f}ms "
            f"dur={(s.end_time_unix_nano - s.start_time_unix_nano) / 1e6:.1f}ms "
            f"status={s.status.code} {s.status.message!r}"
        )
        for k in sorted(attrs):
            text = json.dumps(attrs[k]) if not isinstance(attrs[k], str) else attrs[k]
            print(f"    {k} = {text[:300]}")
    truth = json.loads((out / "truth.json").read_text())
    print("--- truth:", json.dumps({k: truth[k] for k in ("calls", "notes", "span_count", "error")})[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

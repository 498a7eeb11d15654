"""The checked-in wire modules must match what the pinned generator makes from proto/."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_not_stale() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generated_modules_round_trip() -> None:
    from collector.wire.gen import common_pb2, control_pb2, score_pb2

    msg = control_pb2.ControlMessage(
        expectation=control_pb2.Expectation(
            expectation_id="e1",
            tenant="t",
            scope=common_pb2.Scope(traces=common_pb2.TraceScope(trace_ids=["0" * 32])),
            conditions=[control_pb2.Condition(tools_called=control_pb2.ToolsCalled(
                tools=[control_pb2.ToolCallRequirement(name="my_tool_call")]))],
        )
    )
    back = control_pb2.ControlMessage.FromString(msg.SerializeToString())
    assert back.WhichOneof("message") == "expectation"
    assert back.expectation.conditions[0].tools_called.tools[0].name == "my_tool_call"
    ev = score_pb2.ScoreEvent(score_id="s", status=common_pb2.SCORE_STATUS_FALSE)
    assert score_pb2.ScoreEvent.FromString(ev.SerializeToString()).status == common_pb2.SCORE_STATUS_FALSE

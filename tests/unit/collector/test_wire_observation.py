"""An observation's protobuf record holds every execution as ``execution_to_proto`` writes it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.wire.convert import execution_to_proto, observation_to_proto
from scoring.models import Acquisition, Coverage, Observation, ToolExecution
from tests.unit.scoring.test_observation_id import _coverage, _execution, _scope, _trusted


@settings(max_examples=300)
@given(
    scope=_scope,
    executions=st.lists(_execution | _trusted, max_size=6),
    coverage=_coverage,
    acquisition=st.sampled_from(list(Acquisition)),
)
def test_observation_record_holds_every_execution_as_execution_to_proto_writes_it(
    scope: Any, executions: list[ToolExecution], coverage: Coverage, acquisition: Acquisition
) -> None:
    o = Observation(scorable=scope, tool_executions=tuple(executions), coverage=coverage, acquisition=acquisition)
    msg = observation_to_proto(o)
    assert list(msg.tool_executions) == [execution_to_proto(e) for e in o.tool_executions]
    assert msg.observation_id == o.observation_id

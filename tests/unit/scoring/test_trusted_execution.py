"""``ToolExecution.trusted``: the unvalidated rebuild the service uses equals the validated model."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scoring.models.evidence import CaptureState, ToolExecution

_text = st.text(max_size=20)
_fields = st.fixed_dictionaries(
    {
        "name": st.text(min_size=1, max_size=20),
        "trace_id": _text,
        "span_id": _text,
        "call_id": st.none() | _text,
        "status": st.sampled_from(["ok", "error", "unset"]),
        "start_time_unix_nano": st.integers(min_value=0, max_value=2**63 - 1),
        "end_time_unix_nano": st.integers(min_value=0, max_value=2**63 - 1),
        "arguments": st.none() | st.text(max_size=60),
        "arguments_state": st.sampled_from(list(CaptureState)),
        "convention": st.sampled_from(["gen_ai", "openinference"]),
        "delivered_canary": st.none() | _text,
        "recorder": st.none() | _text,
    }
)


def test_trusted_sets_every_field() -> None:
    # A field added to ToolExecution must be added to trusted() too (it sets no defaults).
    e = ToolExecution.trusted("t", "a", "b", None, "ok", 1, 2, None, CaptureState.ABSENT, "gen_ai")
    assert set(e.__dict__) == set(ToolExecution.model_fields)


@given(_fields)
def test_trusted_equals_validated(values: dict[str, object]) -> None:
    validated = ToolExecution.model_validate(values)
    trusted = ToolExecution.trusted(**values)  # type: ignore[arg-type]
    assert trusted == validated
    assert hash(trusted) == hash(validated)
    assert trusted.model_dump() == validated.model_dump()
    assert trusted.model_dump_json() == validated.model_dump_json()
    assert trusted.model_fields_set == validated.model_fields_set


def test_trusted_is_frozen() -> None:
    e = ToolExecution.trusted("t", "a", "b", None, "ok", 1, 2, None, CaptureState.ABSENT, "gen_ai")
    with pytest.raises(pydantic.ValidationError):
        e.name = "other"  # type: ignore[misc]

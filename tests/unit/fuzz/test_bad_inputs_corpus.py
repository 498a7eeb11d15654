"""The bad-input corpus (tests/data/bad_inputs): README, manifest and files agree, and every file
decodes to its documented DLQ reason -- the same steps the service's checkpoint runs on a record
(the integration twin, tests/integration/test_faults_bad_inputs.py, sends them through Kafka)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.config import ServiceConfig
from collector.receivers.decode import RecordDecodeError, decode_span_record
from collector.wire.convert import ControlDecodeError, check_marker, decode_control, expectation_from_proto

CORPUS = Path(__file__).resolve().parents[2] / "data" / "bad_inputs"
MANIFEST: dict[str, Any] = json.loads((CORPUS / "manifest.json").read_text())
ENTRIES: list[dict[str, Any]] = MANIFEST["entries"]


def corpus_config(encoding: str = "otlp_proto") -> ServiceConfig:
    cfg: dict[str, Any] = json.loads(json.dumps(MANIFEST["config"]))
    cfg["kafka"]["encoding"] = encoding
    return ServiceConfig.model_validate(cfg)


def reason_of(entry: dict[str, Any]) -> str | None:
    """The DLQ reason the service gives this record (None: it would be accepted)."""
    value = (CORPUS / entry["file"]).read_bytes()
    if entry["topic"] == "spans":
        cfg = corpus_config(entry["encoding"])
        headers = [(k, v.encode()) for k, v in (entry.get("headers") or {}).items()]
        try:
            out = decode_span_record(value, headers, cfg)
        except RecordDecodeError as exc:
            return exc.reason
        return out.rejected[0][2] if out.rejected else None
    cfg = corpus_config()
    try:  # collector/pipeline/checkpoint.py: Checkpoint.process + _control
        msg = decode_control(value)
        kind = msg.WhichOneof("message")
        if kind == "expectation":
            exp = expectation_from_proto(msg.expectation, default_tenant=cfg.tenant.default,
                                         default_deadline_s=60, now_ms=0)
            if exp.scorer not in cfg.scorers:
                return "unknown_scorer"
        elif kind == "completion":
            check_marker(msg.completion)
    except ControlDecodeError as exc:
        return exc.reason
    return None


def test_manifest_readme_and_files_agree() -> None:
    files = {p.name for p in CORPUS.iterdir()} - {"README.md", "manifest.json", "generate.py"}
    assert files == {e["file"] for e in ENTRIES}
    readme = (CORPUS / "README.md").read_text()
    for e in ENTRIES:
        row = next((line for line in readme.splitlines() if f"`{e['file']}`" in line), None)
        assert row is not None, f"{e['file']} is not described in README.md"
        assert f"`{e['reason']}`" in row, f"README.md gives another reason for {e['file']}"
    assert len(ENTRIES) >= 50


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_each_file_decodes_to_its_documented_reason(entry: dict[str, Any]) -> None:
    assert reason_of(entry) == entry["reason"]

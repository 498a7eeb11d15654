"""What deploy/README.md says about the topics holds: the partition count the service creates a
missing topic with, and that the rendered ACLs give the scorer no Create (so with them applied the
topics must exist before the pods start)."""

from __future__ import annotations

from typing import Any

import yaml

from collector.client import DEFAULT_PARTITIONS
from tests.unit.deploy.helpers import RELEASE, ROOT, Helm


def test_deploy_readme_says_topics_are_created_with_the_services_partition_count() -> None:
    text = " ".join((ROOT / "deploy" / "README.md").read_text().split())
    assert f"creates a missing topic at start with {DEFAULT_PARTITIONS} partitions" in text
    assert "create the five `config.kafka.topics` beforehand" in text


def test_the_scorers_acls_hold_no_create_so_the_topics_must_exist(helm: Helm) -> None:
    docs = helm.render_docs()
    (cm,) = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == f"{RELEASE}-kafka-acls"]
    acls: list[dict[str, Any]] = yaml.safe_load(cm["data"]["acls.yaml"])
    service = [a for a in acls if a["principal"] == "User:toolwitness"]
    assert service, acls
    assert not [a for a in service if "Create" in a["operations"] or a["resourceType"] == "cluster"]

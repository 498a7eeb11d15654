"""Scorer identity: class, parameters and children, hashed as SHA-256 of canonical JSON.

Equal configurations get equal hashes, so metrics and score events can be keyed by it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue, computed_field, model_validator

from scoring.models.evidence import canonical_json


class ScorerIdentifier(BaseModel):
    """The identity of a scorer (or of a component such as a chat target)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    class_name: str
    class_module: str
    params: dict[str, JsonValue] = {}
    children: dict[str, tuple[ScorerIdentifier, ...]] = {}

    @model_validator(mode="wrap")
    @classmethod
    def _dumped_hash(cls, data: Any, handler: Any) -> ScorerIdentifier:
        """Read back what ``model_dump`` writes: ``hash`` is computed, so a dumped one is checked
        against the content instead of being refused as an unknown field."""
        stated = None
        if isinstance(data, str | bytes | bytearray):  # model_validate_json hands over the text
            data = json.loads(data)
        if isinstance(data, dict) and "hash" in data:
            data = dict(data)
            stated = data.pop("hash")
        ident: ScorerIdentifier = handler(data)
        if stated is not None and stated != ident.hash:
            raise ValueError(f"hash {stated!r} does not match the identity's content ({ident.hash})")
        return ident

    def _body(self) -> dict[str, Any]:
        return {
            "class_name": self.class_name,
            "class_module": self.class_module,
            "params": self.params,
            "children": {k: [c.hash for c in v] for k, v in self.children.items()},
        }

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hash(self) -> str:
        return hashlib.sha256(canonical_json(self._body()).encode()).hexdigest()

    def get_child(self, name: str) -> ScorerIdentifier | None:
        found = self.children.get(name)
        return found[0] if found else None

    def get_children(self, name: str) -> tuple[ScorerIdentifier, ...]:
        return self.children.get(name, ())

    def get_child_list(self, name: str) -> list[ScorerIdentifier]:
        """``get_children`` under PyRIT's name (a list, empty when there is no such child)."""
        return list(self.get_children(name))

    @property
    def short_hash(self) -> str:
        """The first 8 hex digits of ``hash``, for logs and display."""
        return self.hash[:8]

    @property
    def unique_name(self) -> str:
        """``class_name::short_hash``, the display name ``str()`` gives."""
        return f"{self.class_name}::{self.short_hash}"

    @property
    def eval_hash(self) -> str:
        """The evaluation hash that keys this configuration's stored metrics (PyRIT's name).

        Computed by :func:`scoring.evaluation.evaluation_hash`; reading it loads the
        evaluation package (numpy, scipy), which scoring alone never needs.
        """
        from scoring.evaluation.identity import evaluation_hash

        return evaluation_hash(self)

    def __str__(self) -> str:
        return self.unique_name

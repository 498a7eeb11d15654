"""Scorer identity as evaluation sees it: serialization and the evaluation hash.

The *evaluation hash* keys the metrics registry. Like PyRIT's eval hash it is the
scorer's identity with operational details removed: for child components that are
model targets (``prompt_target``, ``converter_target``, ``chat_target``) only the
behavioural parameters ``model_name``, ``temperature`` and ``top_p`` count, so the same
judge configuration served from two endpoints shares its metrics. Everything else —
class name, every non-None parameter, every other child, recursively — is part of it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import PurePath
from typing import Any

from scoring.evaluation.protocols import ScorerIdentifierLike

TARGET_CHILD_KEYS = frozenset({"prompt_target", "converter_target", "chat_target"})
BEHAVIORAL_TARGET_PARAMS = frozenset({"model_name", "temperature", "top_p"})


def _json_default(value: object) -> object:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, tuple):
        return list(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(
        f"identity parameter of type {type(value).__name__} has no stable JSON form; "
        "use str/int/float/bool/None, lists or mappings"
    )


def canonical_json(value: object) -> str:
    """Deterministic JSON (sorted keys, no whitespace, NaN rejected) used for hashing."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default
    )


def sha256_hex(value: object) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def _children_list(value: object) -> list[ScorerIdentifierLike] | None:
    """A child entry as a list of identifiers, or None when it is not identifier-shaped."""
    if isinstance(value, ScorerIdentifierLike):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items = list(value)
        if items and all(isinstance(item, ScorerIdentifierLike) for item in items):
            return items
    return None


def _identity_body(identifier: ScorerIdentifierLike) -> dict[str, Any]:
    children: dict[str, Any] = {}
    for name in sorted(identifier.children):
        value = identifier.children[name]
        listed = _children_list(value)
        if listed is None:
            children[name] = value
        elif isinstance(value, ScorerIdentifierLike):
            children[name] = identity_to_dict(value)
        else:
            children[name] = [identity_to_dict(child) for child in listed]
    return {"class_name": identifier.class_name, "params": dict(identifier.params), "children": children}


def identity_to_dict(identifier: ScorerIdentifierLike) -> dict[str, Any]:
    """The identity as plain JSON-ready data: class_name, params, children, hash."""
    return {**_identity_body(identifier), "hash": identifier.hash}


def _behavioural_view(identifier: ScorerIdentifierLike, *, allow: frozenset[str] | None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "class_name": identifier.class_name,
        "params": {
            key: value
            for key, value in identifier.params.items()
            if value is not None and (allow is None or key in allow)
        },
    }
    children: dict[str, Any] = {}
    for name in sorted(identifier.children):
        value = identifier.children[name]
        listed = _children_list(value)
        child_allow = BEHAVIORAL_TARGET_PARAMS if name in TARGET_CHILD_KEYS else None
        if listed is None:
            children[name] = value
        else:
            hashes = [sha256_hex(_behavioural_view(child, allow=child_allow)) for child in listed]
            children[name] = hashes[0] if isinstance(value, ScorerIdentifierLike) else hashes
    if children:
        view["children"] = children
    return view


def evaluation_hash(identifier: ScorerIdentifierLike) -> str:
    """SHA-256 hex of the behavioural view of ``identifier`` (see the module docstring)."""
    return sha256_hex(_behavioural_view(identifier, allow=None))


@dataclass(frozen=True)
class SimpleScorerIdentifier:
    """A concrete identity satisfying :class:`ScorerIdentifierLike`.

    Used by the self-ask judges and for identities read back from the registry (where
    ``stored_hash`` keeps the hash the scorer reported when it was evaluated).
    """

    class_name: str
    params: Mapping[str, object] = field(default_factory=dict)
    children: Mapping[str, object] = field(default_factory=dict)
    stored_hash: str | None = None

    @property
    def hash(self) -> str:
        if self.stored_hash is not None:
            return self.stored_hash
        return sha256_hex(_identity_body(self))

    def get_child(self, name: str) -> object:
        return self.children.get(name)

    def get_child_list(self, name: str) -> list[object]:
        """The child identities under ``name`` as a list (PyRIT's name); empty when absent."""
        value = self.children.get(name)
        if value is None:
            return []
        listed = _children_list(value)
        return list(listed) if listed is not None else [value]

    @property
    def short_hash(self) -> str:
        """The first 8 hex digits of ``hash``, for logs and display."""
        return self.hash[:8]

    @property
    def unique_name(self) -> str:
        """``class_name::short_hash``."""
        return f"{self.class_name}::{self.short_hash}"

    def __str__(self) -> str:
        """``unique_name``: ``ClassName::<first 8 hash digits>``, as ``scoring.score.ScorerIdentifier`` prints."""
        return self.unique_name

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SimpleScorerIdentifier:
        """Rebuild an identity written by :func:`identity_to_dict`."""
        children: dict[str, object] = {}
        for name, value in dict(data.get("children") or {}).items():
            if isinstance(value, Mapping) and "class_name" in value:
                children[name] = cls.from_dict(value)
            elif isinstance(value, list) and value and all(isinstance(v, Mapping) and "class_name" in v for v in value):
                children[name] = tuple(cls.from_dict(v) for v in value)
            else:
                children[name] = value
        stored = data.get("hash")
        return cls(
            class_name=str(data.get("class_name", "")),
            params=dict(data.get("params") or {}),
            children=children,
            stored_hash=str(stored) if stored is not None else None,
        )

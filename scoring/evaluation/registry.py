"""The metrics registry: a JSONL file of evaluation results keyed by evaluation hash.

One line per (evaluation hash, metrics type[, harm category]); a new result for the same
key replaces the old line. Writers are serialised by an ``fcntl`` lock on
``<registry>.lock`` and every write is "read, rewrite to a temporary file in the same
directory, fsync, ``os.replace``", so readers (which take no lock) always see a whole
file and concurrent writers — threads or processes — never lose each other's lines.
Lines that do not parse are kept verbatim: a rewrite must never delete data it cannot
read.

Skip rules (PyRIT's, applied with :attr:`RegistryUpdateBehavior.SKIP_IF_EXISTS`):
no entry → run; stored for another dataset (its name) → run and replace; dataset version
differs → run and replace; harm definition version differs → run and replace; existing
``num_scorer_trials`` ≥ requested → skip and return the stored metrics; fewer trials → run
and replace.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, TypeVar

from scoring.evaluation.dataset import MetricsType
from scoring.evaluation.identity import SimpleScorerIdentifier, identity_to_dict
from scoring.evaluation.metrics import HarmScorerMetrics, ObjectiveScorerMetrics, ScorerMetrics, metrics_from_dict
from scoring.evaluation.protocols import ScorerIdentifierLike

logger = logging.getLogger(__name__)

REGISTRY_ENV = "TOOLWITNESS_EVAL_REGISTRY"

M = TypeVar("M", bound=ScorerMetrics)


class RegistryUpdateBehavior(StrEnum):
    """How an evaluation uses the registry (PyRIT's members)."""

    SKIP_IF_EXISTS = "skip_if_exists"  # reuse a sufficient stored result, else run and store
    ALWAYS_UPDATE = "always_update"  # always run and replace the stored result
    NEVER_UPDATE = "never_update"  # always run, never read or write the registry


def default_registry_path() -> Path:
    """``$TOOLWITNESS_EVAL_REGISTRY``, else ``~/.toolwitness/scorer_evals/metrics.jsonl``."""
    env = os.environ.get(REGISTRY_ENV)
    if env:
        return Path(env)
    return Path.home() / ".toolwitness" / "scorer_evals" / "metrics.jsonl"


@dataclass(frozen=True)
class ScorerMetricsWithIdentity(Generic[M]):
    """A stored result: the scorer's identity (as recorded) and its metrics."""

    scorer_identifier: SimpleScorerIdentifier
    metrics: M
    eval_hash: str
    recorded_at: str | None = None


@dataclass(frozen=True)
class SkipDecision:
    skip: bool
    reason: str
    existing: ScorerMetrics | None = None


def decide_skip(
    existing: ScorerMetrics | None,
    *,
    dataset_version: str,
    harm_definition_version: str | None,
    num_scorer_trials: int,
    dataset_name: str | None = None,
) -> SkipDecision:
    """PyRIT's skip rules (see the module docstring), and ``dataset_name``: a result stored for
    another dataset (same scorer, same version string) is not this one's."""
    if existing is None:
        return SkipDecision(False, "no stored result")
    if dataset_name is not None and existing.dataset_name is not None and existing.dataset_name != dataset_name:
        return SkipDecision(False, f"stored result is for another dataset ({existing.dataset_name} -> {dataset_name})")
    if existing.dataset_version != dataset_version:
        return SkipDecision(False, f"dataset version changed ({existing.dataset_version} -> {dataset_version})")
    if (
        harm_definition_version is not None
        and isinstance(existing, HarmScorerMetrics)
        and existing.harm_definition_version != harm_definition_version
    ):
        return SkipDecision(
            False,
            f"harm definition version changed ({existing.harm_definition_version} -> {harm_definition_version})",
        )
    if existing.num_scorer_trials >= num_scorer_trials:
        return SkipDecision(
            True, f"stored result has {existing.num_scorer_trials} trial(s) >= {num_scorer_trials}", existing
        )
    return SkipDecision(False, f"stored result has fewer trials ({existing.num_scorer_trials} < {num_scorer_trials})")


def _metrics_type_of(metrics: ScorerMetrics) -> MetricsType:
    return MetricsType.HARM if isinstance(metrics, HarmScorerMetrics) else MetricsType.OBJECTIVE


def _same_category(a: object, b: str | None) -> bool:
    return str(a or "").casefold() == str(b or "").casefold()


class MetricsRegistry:
    """A JSONL metrics registry at ``path`` (see the module docstring)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_registry_path()
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    # -- reading ---------------------------------------------------------------------
    def _raw_lines(self) -> list[str]:
        try:
            with self.path.open(encoding="utf-8", newline="") as fh:
                return fh.readlines()
        except FileNotFoundError:
            return []

    @staticmethod
    def _parse(line: str) -> dict[str, Any] | None:
        text = line.strip()
        if not text:
            return None
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def entries(self) -> list[dict[str, Any]]:
        """Every parseable entry, in file order (unparseable lines are logged and skipped)."""
        result = []
        for number, line in enumerate(self._raw_lines(), 1):
            parsed = self._parse(line)
            if parsed is None:
                if line.strip():
                    logger.warning("%s:%d: not a JSON object, ignored", self.path, number)
                continue
            result.append(parsed)
        return result

    @staticmethod
    def _matches(entry: dict[str, Any], eval_hash: str, metrics_type: MetricsType, harm_category: str | None) -> bool:
        if entry.get("eval_hash") != eval_hash or entry.get("metrics_type") != metrics_type.value:
            return False
        if metrics_type is MetricsType.HARM:
            return _same_category((entry.get("metrics") or {}).get("harm_category"), harm_category)
        return True

    def _load(self, entry: dict[str, Any], cls: type[M]) -> ScorerMetricsWithIdentity[M] | None:
        try:
            metrics = metrics_from_dict(cls, dict(entry.get("metrics") or {}))
            identity = SimpleScorerIdentifier.from_dict(entry.get("scorer") or {})
        except (AttributeError, TypeError, ValueError) as exc:  # a hand-edited entry of the wrong shape
            logger.warning("%s: unreadable entry for eval_hash %s: %s", self.path, entry.get("eval_hash"), exc)
            return None
        return ScorerMetricsWithIdentity(
            scorer_identifier=identity,
            metrics=metrics,
            eval_hash=str(entry.get("eval_hash")),
            recorded_at=entry.get("recorded_at"),
        )

    def find(
        self, eval_hash: str, metrics_type: MetricsType, *, harm_category: str | None = None
    ) -> ObjectiveScorerMetrics | HarmScorerMetrics | None:
        """The stored metrics for this key, or None."""
        cls: type[ObjectiveScorerMetrics] | type[HarmScorerMetrics] = (
            HarmScorerMetrics if metrics_type is MetricsType.HARM else ObjectiveScorerMetrics
        )
        for entry in self.entries():
            if self._matches(entry, eval_hash, metrics_type, harm_category):
                loaded = self._load(entry, cls)
                return loaded.metrics if loaded else None
        return None

    def all_objective(self) -> list[ScorerMetricsWithIdentity[ObjectiveScorerMetrics]]:
        loaded = (
            self._load(e, ObjectiveScorerMetrics)
            for e in self.entries()
            if e.get("metrics_type") == MetricsType.OBJECTIVE.value
        )
        return [x for x in loaded if x is not None]

    def all_harm(self, harm_category: str | None = None) -> list[ScorerMetricsWithIdentity[HarmScorerMetrics]]:
        loaded = (
            self._load(e, HarmScorerMetrics)
            for e in self.entries()
            if e.get("metrics_type") == MetricsType.HARM.value
            and (harm_category is None or _same_category((e.get("metrics") or {}).get("harm_category"), harm_category))
        )
        return [x for x in loaded if x is not None]

    # -- writing ---------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _rewrite(self, lines: list[str]) -> None:
        mode: int | None
        try:
            mode = self.path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = None
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.writelines(lines)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode if mode is not None else 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def replace(self, identifier: ScorerIdentifierLike, eval_hash: str, metrics: ScorerMetrics) -> None:
        """Store ``metrics`` for ``eval_hash``, replacing an entry with the same key."""
        metrics_type = _metrics_type_of(metrics)
        harm_category = metrics.harm_category if isinstance(metrics, HarmScorerMetrics) else None
        entry = {
            "eval_hash": eval_hash,
            "metrics_type": metrics_type.value,
            "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "scorer": identity_to_dict(identifier),
            "metrics": metrics.to_dict(),
        }
        new_line = json.dumps(entry, allow_nan=False, ensure_ascii=False) + "\n"
        with self._locked():
            kept: list[str] = []
            for line in self._raw_lines():
                parsed = self._parse(line)
                if parsed is not None and self._matches(parsed, eval_hash, metrics_type, harm_category):
                    continue
                kept.append(line if line.endswith("\n") else line + "\n")
            kept.append(new_line)
            self._rewrite(kept)


def get_all_objective_metrics(
    registry_path: Path | str | None = None,
) -> list[ScorerMetricsWithIdentity[ObjectiveScorerMetrics]]:
    """Every stored objective result, with the scorer identity it was recorded for."""
    return MetricsRegistry(registry_path).all_objective()


def get_all_harm_metrics(
    harm_category: str, registry_path: Path | str | None = None
) -> list[ScorerMetricsWithIdentity[HarmScorerMetrics]]:
    """Every stored harm result for ``harm_category`` (compared case-insensitively)."""
    return MetricsRegistry(registry_path).all_harm(harm_category)

"""Likert scales for :class:`~scoring.evaluation.judges.SelfAskLikertScorer`, and the bundled ones.

A scale is a harm category and its levels, lowest first, kept as YAML (``category``,
``version``, ``description``, ``levels``). :class:`LikertScalePaths` names the scales that
ship with toolwitness (PyRIT's enum name); ``.load()`` reads one and attaches the
evaluation datasets bundled for its category, if any, so a judge built with
``SelfAskLikertScorer.from_likert_scale`` can be evaluated without naming files.
The wordings and datasets are toolwitness's own, small, and meant as a starting point.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from scoring.score.evaluable import ScorerEvalDatasetFiles

#: The directory of the bundled scale files.
LIKERT_SCALES_PATH = Path(__file__).resolve().parents[1] / "datasets" / "likert_scales"


@dataclass(frozen=True)
class LikertScale:
    """A harm category and its levels (at least two, lowest harm first)."""

    category: str
    levels: tuple[str, ...]
    version: str = "1.0"
    description: str = ""
    #: the human-labeled datasets this scale is evaluated on (None: none bundled).
    evaluation_files: ScorerEvalDatasetFiles | None = None

    def __post_init__(self) -> None:
        if not self.category.strip():
            raise ValueError("a Likert scale needs a category")
        if len(self.levels) < 2 or not all(isinstance(lv, str) and lv.strip() for lv in self.levels):
            raise ValueError(f"Likert scale {self.category!r}: give at least two non-empty levels")

    @classmethod
    def from_yaml(cls, path: str | Path, *, evaluation_files: ScorerEvalDatasetFiles | None = None) -> LikertScale:
        """Read a scale file.

        Raises:
            ValueError: the file is not a mapping with ``category`` and a list of ``levels``.
        """
        path = Path(path)
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a Likert scale file is a mapping with 'category' and 'levels'")
        category, levels = data.get("category"), data.get("levels")
        if not isinstance(category, str) or not isinstance(levels, list):
            raise ValueError(f"{path}: 'category' must be a string and 'levels' a list of strings")
        try:
            return cls(
                category=category,
                levels=tuple(levels),
                version=str(data.get("version", "1.0")),
                description=str(data.get("description", "")),
                evaluation_files=evaluation_files,
            )
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def _harm_files(category: str) -> ScorerEvalDatasetFiles:
    # result_file None: metrics go to the shared registry, never into the installed package.
    return ScorerEvalDatasetFiles(human_labeled_datasets_files=(f"harm/{category}.csv",), harm_category=category)


class LikertScalePaths(enum.Enum):
    """The bundled scales: ``(scale file, evaluation files or None)``."""

    EXPLOITS_SCALE = ("exploits.yaml", _harm_files("exploits"))
    HATE_SPEECH_SCALE = ("hate_speech.yaml", _harm_files("hate_speech"))
    VIOLENCE_SCALE = ("violence.yaml", _harm_files("violence"))
    HARM_SCALE = ("harm.yaml", None)

    @property
    def path(self) -> Path:
        name: str = self.value[0]
        return LIKERT_SCALES_PATH / name

    @property
    def evaluation_files(self) -> ScorerEvalDatasetFiles | None:
        files: ScorerEvalDatasetFiles | None = self.value[1]
        return files

    def load(self) -> LikertScale:
        """The scale, with its bundled evaluation files attached."""
        return LikertScale.from_yaml(self.path, evaluation_files=self.evaluation_files)

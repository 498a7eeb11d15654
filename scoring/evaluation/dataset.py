"""Human-labeled datasets in PyRIT's CSV format: loading, validation, combining.

File format (one file)::

    # dataset_version=1.0, harm_definition=violence.yaml, harm_definition_version=1.0
    harm_category,objective,assistant_response,human_score_1,human_score_2,data_type
    violence,rob a bank,"Wear masks and …",0.75,0.5,text

* line 1: ``# key=value, …`` — ``dataset_version`` is required; harm datasets also need
  ``harm_definition_version`` (``harm_definition`` defaults to ``<harm_category>.yaml``);
* columns: ``assistant_response``; ``objective`` (objective datasets) or ``harm_category``
  (harm datasets); one or more ``human_score*`` columns (one per rater); optional
  ``data_type`` (default ``text``). Other columns are ignored;
* objective labels are 0/1; harm labels are floats in [0, 1]. An empty/NaN label is an
  error, never a silent zero.

Several files are combined as PyRIT combines them: sorted by path, entries concatenated,
``dataset_version`` = the per-file versions joined with ``_`` (duplicates kept, e.g.
``1.0_1.0``), dataset name = the sorted file names joined with ``_``; all files must agree
on ``harm_definition_version`` and ``harm_definition``, and a harm dataset must hold a
single harm category.
"""

from __future__ import annotations

import csv
import glob
import io
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path

import numpy as np
import numpy.typing as npt

log = logging.getLogger("toolwitness.evaluation")

HUMAN_SCORE_PREFIX = "human_score"
ASSISTANT_RESPONSE_COL = "assistant_response"
OBJECTIVE_COL = "objective"
HARM_CATEGORY_COL = "harm_category"
DATA_TYPE_COL = "data_type"

# Cell spellings that pandas (and so PyRIT) reads as NaN.
_MISSING_TOKENS = frozenset({"", "nan", "na", "n/a", "#n/a", "null", "none", "<na>", "-nan", "1.#ind", "1.#qnan"})


class MetricsType(StrEnum):
    """Which metrics a dataset supports (PyRIT's names)."""

    HARM = "harm"
    OBJECTIVE = "objective"


class DatasetError(ValueError):
    """A dataset problem, located by file, line and column where they are known."""

    def __init__(
        self, message: str, *, path: Path | str | None = None, line: int | None = None, column: str | None = None
    ) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.line = line
        self.column = column
        where = ""
        if self.path is not None:
            where = self.path + (f":{line}" if line is not None else "") + ": "
        col = f"column {column!r}: " if column is not None else ""
        super().__init__(f"{where}{col}{message}")


@dataclass(frozen=True)
class LabeledEntry:
    """One labeled response. ``human_scores`` has one value per rater (0.0/1.0 for objective)."""

    assistant_response: str
    human_scores: tuple[float, ...]
    objective: str | None = None
    harm_category: str | None = None
    data_type: str = "text"
    source: str = ""  # "<file>:<line>" of the row, for error messages and per-item reports


@dataclass(frozen=True)
class HumanLabeledDataset:
    """A (possibly combined) human-labeled dataset."""

    name: str
    metrics_type: MetricsType
    version: str
    entries: tuple[LabeledEntry, ...]
    harm_definition: str | None = None
    harm_definition_version: str | None = None
    files: tuple[Path, ...] = ()

    @property
    def num_human_raters(self) -> int:
        return max((len(e.human_scores) for e in self.entries), default=0)

    @property
    def harm_category(self) -> str | None:
        return self.entries[0].harm_category if self.entries else None

    def human_matrix(self) -> npt.NDArray[np.float64]:
        """Raters × items matrix of human scores; NaN where a file had fewer raters."""
        matrix = np.full((self.num_human_raters, len(self.entries)), np.nan)
        for item, entry in enumerate(self.entries):
            matrix[: len(entry.human_scores), item] = entry.human_scores
        return matrix


def parse_header(line: str) -> dict[str, str]:
    """Parse ``# key=value, key=value`` (trailing empty parts such as ``,,,`` are ignored)."""
    content = line.strip()
    if not content.startswith("#"):
        return {}
    result: dict[str, str] = {}
    for part in content[1:].split(","):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            result[key.strip()] = value.strip()
    return result


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        # Read anyway (an old spreadsheet export), but say so: a cp1252 file's curly quotes come
        # out as control characters, and the scorer is then judged on text no rater saw.
        log.warning(
            "%s is not UTF-8 (byte 0x%02x at offset %d); read as Latin-1: save it as UTF-8 if its "
            "responses have characters beyond ASCII",
            path,
            exc.object[exc.start],
            exc.start,
        )
        return path.read_text(encoding="latin-1")
    except OSError as exc:
        raise DatasetError(f"cannot read dataset: {exc.strerror or exc}", path=path) from exc


def _parse_label(raw: str, *, metrics_type: MetricsType, path: Path, line: int, column: str) -> float:
    text = raw.strip()
    if text.lower() in _MISSING_TOKENS:
        raise DatasetError(
            "human score is missing (empty/NaN); every human_score cell must be filled",
            path=path,
            line=line,
            column=column,
        )
    try:
        value = float(text)
    except ValueError:
        raise DatasetError(f"human score {text!r} is not a number", path=path, line=line, column=column) from None
    if math.isnan(value):
        raise DatasetError(
            "human score is NaN; every human_score cell must be filled", path=path, line=line, column=column
        )
    if metrics_type is MetricsType.OBJECTIVE:
        if value not in (0.0, 1.0):
            raise DatasetError(
                f"objective human score must be 0 or 1, got {text!r}", path=path, line=line, column=column
            )
    elif not 0.0 <= value <= 1.0:
        raise DatasetError(f"harm human score must be in [0, 1], got {text!r}", path=path, line=line, column=column)
    return value


def load_csv(path: Path | str, metrics_type: MetricsType) -> HumanLabeledDataset:
    """Load one PyRIT-format CSV file (see the module docstring).

    Raises:
        DatasetError: naming the file, line and column of the first problem found.
    """
    path = Path(path)
    text = _read_text(path)
    first_line, _, body = text.partition("\n")
    header = parse_header(first_line)
    if not first_line.lstrip().startswith("#"):
        raise DatasetError(
            "missing '# dataset_version=…' header line; the first line must be '# dataset_version=<v>[, …]'",
            path=path,
            line=1,
        )
    version = header.get("dataset_version", "")
    if not version:
        raise DatasetError("header line has no dataset_version=<v>", path=path, line=1)
    harm_definition = header.get("harm_definition") or None
    harm_definition_version = header.get("harm_definition_version") or None

    # The csv module refuses a field over 128 KiB by default; a long assistant response is good
    # data (pandas, so PyRIT, has no cap), and no field can be longer than the text it is in.
    if csv.field_size_limit() < len(body):
        csv.field_size_limit(len(body))
    # strict: a quote left open is an error, not the rest of the file read into one cell
    reader = csv.reader(io.StringIO(body), strict=True)
    line_offset = 1  # the header comment line
    try:
        columns = [c.strip() for c in next(reader)]
    except StopIteration:
        raise DatasetError("no column header row after the version line", path=path, line=2) from None
    except csv.Error as exc:
        raise DatasetError(f"malformed CSV column header row: {exc}", path=path, line=2) from None
    header_line = line_offset + reader.line_num
    if metrics_type is MetricsType.HARM and not harm_definition_version:
        hint = ""
        if OBJECTIVE_COL in columns and HARM_CATEGORY_COL not in columns:
            hint = (
                f" (its {OBJECTIVE_COL!r} column makes it an objective dataset: a float-scale scorer is "
                "evaluated on harm datasets, a true/false scorer on objective ones)"
            )
        raise DatasetError(f"harm dataset header has no harm_definition_version=<v>{hint}", path=path, line=1)
    # Unnamed (empty) columns, e.g. trailing commas a spreadsheet left, are ignored like other extras.
    duplicates = sorted({c for c in columns if c and columns.count(c) > 1})
    if duplicates:
        raise DatasetError(f"duplicate column name(s) {duplicates}", path=path, line=header_line)
    key_col = HARM_CATEGORY_COL if metrics_type is MetricsType.HARM else OBJECTIVE_COL
    for required in (ASSISTANT_RESPONSE_COL, key_col):
        if required not in columns:
            raise DatasetError(
                f"required column {required!r} is missing (found {columns}); "
                f"{metrics_type.value} datasets need {ASSISTANT_RESPONSE_COL!r} and {key_col!r}",
                path=path,
                line=header_line,
            )
    label_cols = [c for c in columns if c.startswith(HUMAN_SCORE_PREFIX)]
    if not label_cols:
        raise DatasetError(f"no {HUMAN_SCORE_PREFIX}* column", path=path, line=header_line)
    index = {name: i for i, name in enumerate(columns)}

    entries: list[LabeledEntry] = []
    while True:
        start = line_offset + reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DatasetError(f"malformed CSV: {exc}", path=path, line=start) from None
        if not any(cell.strip() for cell in row):
            continue  # blank line (PyRIT drops all-empty rows)
        if len(row) < len(columns):
            raise DatasetError(f"row has {len(row)} cells, header has {len(columns)}", path=path, line=start)
        if any(cell.strip() for cell in row[len(columns) :]):
            raise DatasetError(f"row has {len(row)} cells, header has {len(columns)}", path=path, line=start)

        def cell(name: str, row: list[str] = row) -> str:
            return row[index[name]].strip()

        for required in (ASSISTANT_RESPONSE_COL, key_col):
            if cell(required).lower() in _MISSING_TOKENS:
                raise DatasetError("value is missing (empty/NaN)", path=path, line=start, column=required)
        scores = tuple(
            _parse_label(row[index[c]], metrics_type=metrics_type, path=path, line=start, column=c) for c in label_cols
        )
        data_type = cell(DATA_TYPE_COL) if DATA_TYPE_COL in index and cell(DATA_TYPE_COL) else "text"
        entries.append(
            LabeledEntry(
                assistant_response=cell(ASSISTANT_RESPONSE_COL),
                human_scores=scores,
                objective=cell(OBJECTIVE_COL) if metrics_type is MetricsType.OBJECTIVE else None,
                harm_category=cell(HARM_CATEGORY_COL) if metrics_type is MetricsType.HARM else None,
                data_type=data_type,
                source=f"{path}:{start}",
            )
        )
    if not entries:
        raise DatasetError("dataset has no rows", path=path)
    return HumanLabeledDataset(
        name=path.name,
        metrics_type=metrics_type,
        version=version,
        entries=tuple(entries),
        harm_definition=harm_definition,
        harm_definition_version=harm_definition_version,
        files=(path,),
    )


def combine_datasets(datasets: Sequence[HumanLabeledDataset]) -> HumanLabeledDataset:
    """Combine per-file datasets as PyRIT does (see the module docstring).

    Raises:
        DatasetError: for mixed metrics types, harm definition versions, harm definitions
            or harm categories.
    """
    if not datasets:
        raise DatasetError("no datasets to combine")
    ordered = sorted(datasets, key=lambda d: [str(f) for f in d.files])
    types = {d.metrics_type for d in ordered}
    if len(types) > 1:
        raise DatasetError(f"cannot combine objective and harm datasets: {_by_file(ordered, 'metrics_type')}")
    metrics_type = ordered[0].metrics_type

    def_versions = {d.harm_definition_version for d in ordered if d.harm_definition_version}
    if len(def_versions) > 1:
        raise DatasetError(
            "all files of a harm evaluation must use the same harm_definition_version, found "
            + _by_file(ordered, "harm_definition_version")
        )
    definitions = {d.harm_definition for d in ordered if d.harm_definition}
    if len(definitions) > 1:
        raise DatasetError(
            "all files of a harm evaluation must reference the same harm_definition, found "
            + _by_file(ordered, "harm_definition")
        )

    entries = [e for d in ordered for e in d.entries]
    if metrics_type is MetricsType.HARM:
        first = entries[0]
        for entry in entries[1:]:
            if (entry.harm_category or "").casefold() != (first.harm_category or "").casefold():
                file, _, line = entry.source.rpartition(":")
                raise DatasetError(
                    f"mixed harm categories: {entry.harm_category!r} here, {first.harm_category!r} at "
                    f"{first.source}; a harm evaluation covers one category",
                    path=file or None,
                    line=int(line) if line.isdigit() else None,
                    column=HARM_CATEGORY_COL,
                )

    harm_category = entries[0].harm_category
    harm_definition = next(iter(definitions), None)
    if metrics_type is MetricsType.HARM and harm_definition is None and harm_category:
        harm_definition = f"{harm_category}.yaml"
    files = tuple(f for d in ordered for f in d.files)
    return HumanLabeledDataset(
        name="_".join(sorted(f.name for f in files)) or "_".join(d.name for d in ordered),
        metrics_type=metrics_type,
        version="_".join(d.version for d in ordered),
        entries=tuple(entries),
        harm_definition=harm_definition,
        harm_definition_version=next(iter(def_versions), None),
        files=files,
    )


def _by_file(datasets: Iterable[HumanLabeledDataset], attr: str) -> str:
    parts = []
    for d in datasets:
        value = getattr(d, attr)
        value = value.value if isinstance(value, Enum) else value
        parts.append(f"{', '.join(str(f) for f in d.files)}: {value}")
    return "; ".join(parts)


def resolve_dataset_files(patterns: str | Sequence[str], *, root: Path | None = None) -> list[Path]:
    """Expand glob pattern(s) (``**`` allowed), relative to ``root`` or the working directory.

    Raises:
        DatasetError: when nothing matches.
    """
    pattern_list = [patterns] if isinstance(patterns, str) else list(patterns)
    found: set[Path] = set()
    for pattern in pattern_list:
        full = pattern if root is None or Path(pattern).is_absolute() else str(root / pattern)
        found.update(Path(p) for p in glob.glob(full, recursive=True) if Path(p).is_file())
    if not found:
        raise DatasetError(f"no dataset file matches {pattern_list}")
    return sorted(found)


def load_human_labeled_dataset(
    patterns: str | Sequence[str], metrics_type: MetricsType, *, root: Path | None = None
) -> HumanLabeledDataset:
    """Load every CSV matching ``patterns`` and combine them (PyRIT's rules)."""
    files = resolve_dataset_files(patterns, root=root)
    return combine_datasets([load_csv(f, metrics_type) for f in files])

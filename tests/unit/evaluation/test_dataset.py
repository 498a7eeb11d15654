"""PyRIT-format CSV loading, combining, and located errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scoring.evaluation import (
    DatasetError,
    MetricsType,
    combine_datasets,
    load_csv,
    load_human_labeled_dataset,
    resolve_dataset_files,
)
from scoring.evaluation.dataset import parse_header

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_parse_header_ignores_trailing_empty_parts() -> None:
    assert parse_header("# dataset_version=1.0, harm_definition=violence.yaml, harm_definition_version=1.0,,,,") == {
        "dataset_version": "1.0",
        "harm_definition": "violence.yaml",
        "harm_definition_version": "1.0",
    }
    assert parse_header("objective,assistant_response") == {}


def test_sample_objective_dataset() -> None:
    ds = load_csv(DATA / "refusal_objective.csv", MetricsType.OBJECTIVE)
    assert ds.version == "1.0" and ds.metrics_type is MetricsType.OBJECTIVE
    assert len(ds.entries) == 10 and ds.num_human_raters == 3
    poem = ds.entries[3]
    assert poem.assistant_response.startswith("Here is a short poem") and "\n" in poem.assistant_response
    assert poem.source.endswith("refusal_objective.csv:6")  # a multi-line cell starts on line 6
    assert ds.entries[4].source.endswith(":9")
    assert ds.entries[0].objective == "Did the response refuse the request?"
    assert ds.entries[0].human_scores == (1.0, 1.0, 1.0)


def test_sample_harm_dataset() -> None:
    ds = load_csv(DATA / "violence_multi_rater.csv", MetricsType.HARM)
    assert ds.harm_category == "violence"
    assert ds.harm_definition == "violence.yaml" and ds.harm_definition_version == "1.0"
    assert ds.human_matrix().shape == (3, 8)
    assert ds.entries[1].human_scores == (0.75, 0.5, 0.25)


def test_combining_follows_pyrit(tmp_path: Path) -> None:
    header = "harm_category,assistant_response,human_score_1,human_score_2\n"
    write(tmp_path, "b.csv", "# dataset_version=1.1, harm_definition_version=2\n" + header + "hate,x,0.5,0.25\n")
    write(tmp_path, "a.csv", "# dataset_version=1.0, harm_definition_version=2\n" + header + "Hate,y,1,1\n")
    write(
        tmp_path,
        "c.csv",
        "# dataset_version=1.0, harm_definition_version=2\nharm_category,assistant_response,human_score\nhate,z,0\n",
    )
    ds = load_human_labeled_dataset("*.csv", MetricsType.HARM, root=tmp_path)
    assert ds.version == "1.0_1.1_1.0"  # sorted by path, duplicates kept
    assert ds.name == "a.csv_b.csv_c.csv"
    assert [e.assistant_response for e in ds.entries] == ["y", "x", "z"]
    assert ds.harm_definition == "Hate.yaml"  # no harm_definition in the headers: <category>.yaml
    assert ds.harm_definition_version == "2"
    assert ds.num_human_raters == 2
    matrix = ds.human_matrix()
    assert matrix.shape == (2, 3) and np.isnan(matrix[1, 2])  # c.csv has one rater


def test_mixed_harm_definition_versions(tmp_path: Path) -> None:
    body = "harm_category,assistant_response,human_score\nhate,x,0\n"
    a = write(tmp_path, "a.csv", "# dataset_version=1, harm_definition_version=1.0\n" + body)
    b = write(tmp_path, "b.csv", "# dataset_version=1, harm_definition_version=1.1\n" + body)
    with pytest.raises(DatasetError, match="same harm_definition_version") as err:
        combine_datasets([load_csv(a, MetricsType.HARM), load_csv(b, MetricsType.HARM)])
    assert "a.csv: 1.0" in str(err.value) and "b.csv: 1.1" in str(err.value)


def test_mixed_harm_definitions(tmp_path: Path) -> None:
    body = "harm_category,assistant_response,human_score\nhate,x,0\n"
    a = write(tmp_path, "a.csv", "# dataset_version=1, harm_definition=hate.yaml, harm_definition_version=1\n" + body)
    b = write(tmp_path, "b.csv", "# dataset_version=1, harm_definition=bias.yaml, harm_definition_version=1\n" + body)
    with pytest.raises(DatasetError, match="same harm_definition") as err:
        combine_datasets([load_csv(a, MetricsType.HARM), load_csv(b, MetricsType.HARM)])
    assert "a.csv: hate.yaml" in str(err.value) and "b.csv: bias.yaml" in str(err.value)


def test_mixed_harm_categories_are_located(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "h.csv",
        "# dataset_version=1, harm_definition_version=1\nharm_category,assistant_response,human_score\n"
        "hate,x,0\nhate,y,1\nviolence,z,1\n",
    )
    with pytest.raises(DatasetError, match="mixed harm categories") as err:
        load_human_labeled_dataset(str(path), MetricsType.HARM)
    assert err.value.line == 5 and err.value.column == "harm_category" and err.value.path == str(path)


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("objective,assistant_response,human_score\nq,a,1\n", 1, None, "missing '# dataset_version"),
        ("# harm_definition=x.yaml\nobjective,assistant_response,human_score\nq,a,1\n", 1, None, "no dataset_version"),
        ("# dataset_version=1\nobjective,assistant_response,human_score\nq,a,1\nq,b,\n", 4, "human_score", "missing"),
        (
            '# dataset_version=1\nobjective,assistant_response,human_score_2\nq,"a\nb",NaN\n',
            3,
            "human_score_2",
            "missing",
        ),
        ("# dataset_version=1\nobjective,assistant_response,human_score\nq,a,yes\n", 3, "human_score", "not a number"),
        ("# dataset_version=1\nobjective,assistant_response,human_score\nq,a,0.5\n", 3, "human_score", "0 or 1"),
        ("# dataset_version=1\nobjective,assistant_response,human_score\n,a,1\n", 3, "objective", "missing"),
        ("# dataset_version=1\nassistant_response,human_score\na,1\n", 2, None, "'objective' is missing"),
        ("# dataset_version=1\nobjective,assistant_response\nq,a\n", 2, None, "no human_score"),
        ("# dataset_version=1\nobjective,objective,assistant_response,human_score\n", 2, None, "duplicate"),
        ("# dataset_version=1\nobjective,assistant_response,human_score\nq,a\n", 3, None, "2 cells"),
        ("# dataset_version=1\nobjective,assistant_response,human_score\n\n\n", None, None, "no rows"),
    ],
)
def test_objective_errors_name_file_line_column(
    tmp_path: Path, text: str, line: int | None, column: str | None, message: str
) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(DatasetError, match=message) as err:
        load_csv(path, MetricsType.OBJECTIVE)
    assert err.value.path == str(path)
    assert (err.value.line, err.value.column) == (line, column)
    assert str(err.value).startswith(str(path))


def test_harm_errors(tmp_path: Path) -> None:
    no_def_version = write(
        tmp_path, "a.csv", "# dataset_version=1\nharm_category,assistant_response,human_score\nh,a,0\n"
    )
    with pytest.raises(DatasetError, match="harm_definition_version") as err:
        load_csv(no_def_version, MetricsType.HARM)
    assert err.value.line == 1
    out_of_range = write(
        tmp_path,
        "b.csv",
        "# dataset_version=1, harm_definition_version=1\nharm_category,assistant_response,"
        "human_score_1,human_score_2\nh,a,0.5,1.5\n",
    )
    with pytest.raises(DatasetError, match=r"in \[0, 1\]") as err:
        load_csv(out_of_range, MetricsType.HARM)
    assert (err.value.line, err.value.column) == (3, "human_score_2")


def test_blank_lines_skipped_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "crlf.csv"
    path.write_bytes(b"# dataset_version=3\r\nobjective,assistant_response,human_score\r\nq,a,1\r\n\r\nq,b,0\r\n")
    ds = load_csv(path, MetricsType.OBJECTIVE)
    assert [e.assistant_response for e in ds.entries] == ["a", "b"]
    assert ds.entries[1].source.endswith(":5")


def test_no_files_match(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no dataset file matches"):
        resolve_dataset_files("nothing/*.csv", root=tmp_path)


def test_cannot_combine_objective_with_harm() -> None:
    objective = load_csv(DATA / "refusal_objective.csv", MetricsType.OBJECTIVE)
    harm = load_csv(DATA / "violence_multi_rater.csv", MetricsType.HARM)
    with pytest.raises(DatasetError, match="cannot combine"):
        combine_datasets([objective, harm])


def test_a_quote_left_open_is_an_error_not_the_rest_of_the_file_in_one_cell(tmp_path: Path) -> None:
    # The quoted cell is the last column: without strict parsing the next rows became its text.
    path = write(
        tmp_path,
        "open.csv",
        "# dataset_version=1.0\nobjective,human_score,assistant_response\n"
        'q,1,"I can\'t help\nq,0,Sure here you go\nq,1,No way\n',
    )
    with pytest.raises(DatasetError, match=r"open.csv:3: malformed CSV"):
        load_csv(path, MetricsType.OBJECTIVE)


def test_an_objective_file_loaded_as_harm_says_which_kind_it_is(tmp_path: Path) -> None:
    path = write(tmp_path, "obj.csv", "# dataset_version=1.0\nobjective,human_score,assistant_response\nq,1,no\n")
    with pytest.raises(DatasetError, match="makes it an objective dataset: a float-scale scorer is evaluated on harm"):
        load_csv(path, MetricsType.HARM)


def test_a_malformed_column_header_row_is_a_dataset_error(tmp_path: Path) -> None:
    path = write(tmp_path, "hdr.csv", '# dataset_version=1\nobjective,assistant_response,"human_score\nobj,resp,1\n')
    with pytest.raises(DatasetError, match=r"hdr.csv:2: malformed CSV column header row"):
        load_csv(path, MetricsType.OBJECTIVE)


def test_a_response_longer_than_the_csv_modules_default_field_limit_loads(tmp_path: Path) -> None:
    long_response = "word " * 40_000  # 200 000 characters; csv's default limit is 131 072
    path = write(
        tmp_path,
        "long.csv",
        f'# dataset_version=1.0\nobjective,assistant_response,human_score_1\nq,"{long_response}",1\nq,short,0\n',
    )
    ds = load_csv(path, MetricsType.OBJECTIVE)
    assert [len(e.assistant_response) for e in ds.entries] == [len(long_response.strip()), 5]


def test_unnamed_trailing_columns_from_a_spreadsheet_are_ignored(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "excel.csv",
        "# dataset_version=1.0,,,\nobjective,assistant_response,human_score_1,,\nq,no,1,,\nq,yes,0,,\n",
    )
    ds = load_csv(path, MetricsType.OBJECTIVE)
    assert [(e.assistant_response, e.human_scores) for e in ds.entries] == [("no", (1.0,)), ("yes", (0.0,))]
    named_twice = write(
        tmp_path, "dup.csv", "# dataset_version=1.0\nobjective,assistant_response,human_score,human_score\n"
    )
    with pytest.raises(DatasetError, match=r"duplicate column name\(s\) \['human_score'\]"):
        load_csv(named_twice, MetricsType.OBJECTIVE)


def test_a_file_that_is_not_utf8_is_read_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A cp1252 export (curly quotes) is read as Latin-1, as before, but no longer silently: its
    quotes become control characters, and the scorer would be judged on text no rater saw."""
    text = "# dataset_version=1.0\nobjective,assistant_response,human_score\nx,\u201cno\u201d,0\n"
    path = tmp_path / "legacy.csv"
    path.write_bytes(text.encode("cp1252"))
    with caplog.at_level("WARNING", logger="toolwitness.evaluation"):
        ds = load_csv(path, MetricsType.OBJECTIVE)
    assert ds.entries[0].assistant_response == "\x93no\x94"
    [record] = [r for r in caplog.records if "not UTF-8" in r.getMessage()]
    assert "legacy.csv" in record.getMessage() and "0x93" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="toolwitness.evaluation"):
        load_csv(write(tmp_path, "good.csv", text), MetricsType.OBJECTIVE)
    assert not caplog.records

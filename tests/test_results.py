"""The run directory's files: rows read back as written, cells no spreadsheet runs, damage said in one line."""

from __future__ import annotations

import csv
import json

import pytest

from stagebench._cli import main
from stagebench.runs._results import RowWriter, RunDir, RunFileError, read_rows
from stagebench.runs._schema import RESULTS_SCHEMA_VERSION, STAGE_COLUMNS

NAMES = ["NA", "None", "null", "nan", "007", "01", "02", "1e3", "", "=1+1", "+cmd", "-2", "@SUM(A1)", "'quoted", "ok"]


def _write(path, names):
    with RowWriter(path, STAGE_COLUMNS) as w:
        for i, name in enumerate(names):
            w.write(
                {
                    "stage": name,
                    "role": "stage",
                    "executor": "thread",
                    "harness": "direct",
                    "concurrency": 1,
                    "status": "ok",
                    "qps": 100.0 + i,
                    "reason": name,
                }
            )


def test_stage_names_come_back_exactly_as_written(tmp_path):
    _write(tmp_path / "results.csv", NAMES)
    df = read_rows(tmp_path / "results.csv")
    assert df["stage"].tolist() == NAMES  # no NaN for "NA", no 7.0 for "007", no phantom "1" for "01"
    assert df["reason"].tolist() == NAMES
    assert df["qps"].dtype.kind == "f" and df["concurrency"].dtype.kind == "i"


def test_no_cell_of_results_csv_starts_a_formula(tmp_path):
    _write(tmp_path / "results.csv", NAMES)
    with open(tmp_path / "results.csv", newline="") as f:
        cells = [c for row in csv.reader(f) for c in row]
    text = [c for c in cells if c and not c.replace(".", "").isdigit()]
    assert not [c for c in text if c[0] in "=+-@"], "a cell a spreadsheet would run as a formula"
    assert "'=1+1" in cells and "'-2" in cells


def _run_dir(tmp_path, meta=None, csv_text=None):
    d = tmp_path / "run"
    d.mkdir()
    if csv_text is None:
        _write(d / "results.csv", ["a"])
    else:
        (d / "results.csv").write_text(csv_text)
    (d / "run.json").write_text(json.dumps(meta if meta is not None else {"kind": "pipeline", "stages": []}))
    return d


@pytest.mark.parametrize(
    ("meta_text", "says"),
    [
        ('{"kind": "pipeline", "stag', "damaged, not JSON"),
        ("[1, 2]", "damaged, a JSON list"),
        (json.dumps({"schema_version": RESULTS_SCHEMA_VERSION + 1}), "written by a newer stagebench"),
        (json.dumps({"schema_version": 0}), "results schema 0"),
    ],
)
def test_a_damaged_or_foreign_run_json_is_one_line(tmp_path, capsys, meta_text, says):
    d = _run_dir(tmp_path)
    (d / "run.json").write_text(meta_text)
    with pytest.raises(RunFileError, match=says):
        RunDir(d).read_meta()
    for argv in (["report", str(d)], ["compare", str(d), str(d), "--out", str(tmp_path / "cmp")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and str(d / "run.json") in err
        assert "Traceback" not in err and err.count("\n") == 1


def test_a_truncated_results_csv_is_one_line(tmp_path, capsys):
    good = _run_dir(tmp_path)
    lines = (good / "results.csv").read_text().splitlines()
    # a row cut off mid-way with a stray quote: what a killed writer on a full disk leaves
    (good / "results.csv").write_text("\n".join(lines) + '\n"b,stage,thread\n')
    for argv in (["report", str(good)], ["compare", str(good), str(good), "--out", str(tmp_path / "cmp")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "damaged" in err and "results.csv" in err and "Traceback" not in err

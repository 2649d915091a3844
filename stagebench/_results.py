"""The run directory: rows appended as they are measured, metadata, derived files.

Layout (a contract other tools read)::

    RUN_DIR/
      run.json       what was run: kind, provenance, settings, stage order (written first)
      results.csv    one row per measured point, appended and flushed as measured
      summary.json   analysis of the rows (derived; `stagebench report` rebuilds it)
      report.html    the report (derived)

``results.csv`` and ``run.json`` are the source of truth; everything else is a
pure function of them.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RunDir",
    "RowWriter",
    "RunDirInUseError",
    "UnwritableOutputError",
    "default_run_dir",
    "read_rows",
    "to_jsonable",
]

RESULTS = "results.csv"
RUN_META = "run.json"
SUMMARY = "summary.json"
REPORT = "report.html"


class UnwritableOutputError(Exception):
    """The run directory cannot be created or written (checked before any work)."""


class RunDirInUseError(ValueError):
    """The run directory already holds a run: rows of two runs must not mix (checked before any work)."""


def default_run_dir(prefix: str = "run", base: str | os.PathLike = "reports") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(base) / f"{prefix}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = Path(base) / f"{prefix}-{stamp}-{n}"
    return path


def to_jsonable(x: Any) -> Any:
    """NaN/inf become null (JSON has no NaN); numpy scalars become Python numbers."""
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    return x


class RowWriter:
    """Appends rows to a CSV file, one flush per row: Ctrl-C or a crash loses nothing measured."""

    def __init__(self, path: str | os.PathLike, columns: Sequence[str]) -> None:
        self.path = Path(path)
        self.columns = tuple(columns)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._f = open(self.path, "a", newline="", encoding="utf-8")
        self._w = csv.DictWriter(self._f, fieldnames=self.columns, extrasaction="ignore")
        if new:
            self._w.writeheader()
            self._f.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        clean = {}
        for k in self.columns:
            v = row.get(k, "")
            if isinstance(v, float) and math.isnan(v):
                v = ""
            clean[k] = v
        self._w.writerow(clean)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunDir:
    """A run directory, created and checked for writability up front."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, path: str | os.PathLike, *, fresh: bool = False) -> "RunDir":
        """Create ``path`` and check it is writable.

        ``fresh=True`` is for a new measurement: a directory that already holds a
        run (a non-empty results.csv or run.json) is refused with
        :class:`RunDirInUseError`, because appending would mix two runs' rows
        under one run.json.
        """
        p = Path(path)
        if fresh:
            held = [n for n in (RESULTS, RUN_META) if (p / n).is_file() and (p / n).stat().st_size > 0]
            if held:
                raise RunDirInUseError(
                    f"the output directory {str(p)!r} already holds {' and '.join(held)} from an earlier run, "
                    "and rows of two runs must not mix: choose another directory or remove it"
                )
        try:
            p.mkdir(parents=True, exist_ok=True)
            probe = p / ".stagebench-write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise UnwritableOutputError(
                f"cannot write the output directory {str(p)!r}: {e.strerror or e}"
            ) from None
        return cls(p)

    @property
    def results_csv(self) -> Path:
        return self.path / RESULTS

    @property
    def summary_json(self) -> Path:
        return self.path / SUMMARY

    @property
    def report_html(self) -> Path:
        return self.path / REPORT

    @property
    def meta_json(self) -> Path:
        return self.path / RUN_META

    def writer(self, columns: Sequence[str]) -> RowWriter:
        return RowWriter(self.results_csv, columns)

    def write_meta(self, meta: Mapping[str, Any]) -> None:
        self._write_json(self.meta_json, meta)

    def read_meta(self) -> dict[str, Any]:
        if not self.meta_json.exists():
            return {}
        return json.loads(self.meta_json.read_text(encoding="utf-8"))

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        self._write_json(self.summary_json, summary)

    @staticmethod
    def _write_json(path: Path, obj: Any) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)  # atomic: a reader never sees half a file


def read_rows(path: str | os.PathLike):
    """results.csv as a DataFrame, with the dtypes analysis expects."""
    import pandas as pd

    p = Path(path)
    if p.is_dir():
        p = p / RESULTS
    df = pd.read_csv(p, keep_default_na=True)
    for col in ("reason", "error_example", "stage", "notes"):
        if col in df:
            # an all-empty column is read as float NaN; text columns stay text
            df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str)
    return df


def rows_to_frame(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]):
    import pandas as pd

    return pd.DataFrame(list(rows), columns=list(columns))

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
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stagebench._errors import StagebenchError
from stagebench._memory import out_of_memory
from stagebench.runs._schema import RESULTS_SCHEMA_VERSION

__all__ = [
    "RunDir",
    "RowWriter",
    "RunDirInUseError",
    "UnwritableOutputError",
    "default_run_dir",
    "read_rows",
    "to_jsonable",
    "read_rows_or_empty",
    "RunFileError",
    "csv_cell",
    "check_schema_version",
    "TEXT_COLUMNS",
    "is_run_dir",
    "RESULTS",
    "RUN_META",
    "SUMMARY",
    "TRANSFORMS_CSV",
    "write_atomically",
]

RESULTS = "results.csv"
RUN_META = "run.json"
SUMMARY = "summary.json"
TRANSFORMS_CSV = "transforms.csv"  # a loader's transforms measured as pipeline stages, beside results.csv


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


#: First characters that make a spreadsheet read a cell as a formula (OWASP's list). A text cell
#: starting with one, or with the quote itself, is written with a leading ``'``, as spreadsheets
#: expect; :func:`read_rows` removes it again, so names round-trip exactly.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")

#: Columns of free text (user-given names, messages): read as text, never as numbers or NA.
TEXT_COLUMNS = ("stage", "loader", "reason", "error_example", "notes")

#: pandas' default NA spellings (its documented list), kept for the numeric columns only.
_NA_SPELLINGS = (
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
)


def csv_cell(v: Any) -> Any:
    """A value as a CSV cell that no spreadsheet runs as a formula (text only; numbers stay numbers)."""
    if isinstance(v, str) and v.startswith(_FORMULA_START):
        return "'" + v
    return v


def _csv_text(v: str) -> str:
    return v[1:] if v.startswith("'") and v[1:].startswith(_FORMULA_START) else v


class RunFileError(StagebenchError):
    """A run file that cannot be read as written: damaged, or from another schema version."""


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
            clean[k] = csv_cell(v)
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
            raise UnwritableOutputError(f"cannot write the output directory {str(p)!r}: {e.strerror or e}") from None
        return cls(p)

    @property
    def results_csv(self) -> Path:
        return self.path / RESULTS

    @property
    def summary_json(self) -> Path:
        return self.path / SUMMARY

    @property
    def meta_json(self) -> Path:
        return self.path / RUN_META

    def writer(self, columns: Sequence[str]) -> RowWriter:
        return RowWriter(self.results_csv, columns)

    def write_meta(self, meta: Mapping[str, Any]) -> None:
        self._write_json(self.meta_json, meta)

    def read_meta(self) -> dict[str, Any]:
        """run.json; {} when there is none. :class:`RunFileError` when it is damaged or from
        a stagebench whose results schema this one does not read."""
        if not self.meta_json.exists():
            return {}
        meta = _read_json(self.meta_json)
        check_schema_version(meta, self.meta_json)
        return meta

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        self._write_json(self.summary_json, summary)

    @staticmethod
    def _write_json(path: Path, obj: Any) -> None:
        write_atomically(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, swapped in at once: a reader (a
    browser refreshing, `stagebench report`) never sees half a file. Where the write fails (a full
    disk), the temporary file is removed and the error raised: the old file, if any, is left as it was."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


#: Columns that hold words, not numbers (besides the free-text ones): read as text and never coerced.
_WORD_COLUMNS = (
    "role",
    "executor",
    "harness",
    "status",
    "started_at",
    "backend",
    "persistent_workers",
    "pin_memory",
    "search_phase",
)


#: Columns that hold counts (a number of workers): a value that is not a whole number >= 0 leaves its row out.
_COUNT_COLUMNS = ("num_workers",)


def read_rows(path: str | os.PathLike):
    """results.csv as a DataFrame, with the dtypes analysis expects.

    Text columns are read as written: a stage named ``NA``, ``None`` or ``007`` stays
    that string (pandas would read NaN and 7.0, and the analysis would look for a
    stage that does not exist). A file that cannot be read at all raises :class:`RunFileError`.

    Read strictly: a row cut short (the file does not end with its newline: the run stopped while
    writing it), a row with more or fewer fields than the header, or a number that is not one are
    left out, each named by its line number in ``df.attrs["damaged"]``. A row cut mid-number would
    otherwise read as a valid, different number (0.0007 cut to 0.07). So is a row whose count of workers
    is not a whole number >= 0 (a hand-edited -1): no run writes one.
    """
    # pandas loads where rows are read: a diagnosis writes its rows without it
    import pandas as pd

    p = Path(path)
    if p.is_dir():
        p = p / RESULTS
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunFileError(f"{p}: damaged ({_first_line(e)}); rebuild it by measuring again") from None
    damaged: list[str] = []
    if text and not text.endswith("\n"):
        damaged.append(f"line {text.count(chr(10)) + 1} was cut short (the run stopped while writing it): left out")
        text = text[: text.rfind("\n") + 1]
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise pd.errors.EmptyDataError("No columns to parse from file")
    kept, lines = io.StringIO(), []
    out = csv.writer(kept, lineterminator="\n")
    out.writerow(header)
    try:
        for rec in reader:
            if not rec:
                continue
            if len(rec) != len(header):
                damaged.append(
                    f"line {reader.line_num}: {len(rec)} fields where the header has {len(header)}: left out"
                )
                continue
            out.writerow(rec)
            lines.append(reader.line_num)
    except csv.Error as e:
        raise RunFileError(f"{p}: damaged ({_first_line(e)}); rebuild it by measuring again") from None
    text_cols = [c for c in TEXT_COLUMNS if c in header]
    try:
        df = pd.read_csv(
            io.StringIO(kept.getvalue()),
            keep_default_na=False,
            na_values={c: list(_NA_SPELLINGS) for c in header if c not in text_cols},
            dtype={c: str for c in text_cols},
        )
    except (pd.errors.ParserError, ValueError) as e:
        if out_of_memory(e):  # pandas' C parser says "out of memory": the rows are fine, the process is not
            raise
        raise RunFileError(f"{p}: damaged ({_first_line(e)}); rebuild it by measuring again") from None
    for col in text_cols:
        df[col] = df[col].map(_csv_text)
    bad = pd.Series(False, index=df.index)
    for col in (c for c in header if c not in text_cols and c not in _WORD_COLUMNS):
        if not pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col]):
            # a cell that is not a number where numbers are written (pandas then reads the column as text)
            coerced = pd.to_numeric(df[col], errors="coerce")
            wrong = coerced.isna() & df[col].notna()
            for i in df.index[wrong]:
                damaged.append(f"line {lines[i]}: {col}={str(df.at[i, col])[:40]!r} is not a number: left out")
            bad |= wrong
            df[col] = coerced
    for col in (c for c in _COUNT_COLUMNS if c in df.columns):
        # a count that no run writes (a hand-edited -1 or 2.5): the analysis keys rows by these knobs
        # (stagebench.model._knobs.LoaderKnobs.from_row), so the row is left out here, named, not a traceback
        v = df[col]  # numeric: the loop above coerced every column that is not text
        wrong = v.notna() & ((v < 0) | (v % 1 != 0))
        for i in df.index[wrong & ~bad]:
            damaged.append(f"line {lines[i]}: {col}={str(df.at[i, col])[:40]!r} is not a whole number >= 0: left out")
        bad |= wrong
    if bad.any():
        df = df[~bad].reset_index(drop=True)
    df.attrs["damaged"] = damaged
    return df


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise RunFileError(f"{path}: damaged, not JSON ({_first_line(e)})") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{path}: damaged, a JSON {type(data).__name__} where an object was expected")
    return data


def check_schema_version(meta: Mapping[str, Any], path: Path) -> None:
    """Refuse, in one line, a run written with another results schema than this stagebench reads.

    Runs without a version are from before versions were written (the same schema as 1).
    """
    version = meta.get("schema_version", RESULTS_SCHEMA_VERSION)
    if version == RESULTS_SCHEMA_VERSION:
        return
    libraries = (meta.get("provenance") or {}).get("libraries") or {}
    wrote = f"stagebench {libraries['stagebench']}" if libraries.get("stagebench") else "another stagebench"
    if isinstance(version, int) and version > RESULTS_SCHEMA_VERSION:
        raise RunFileError(
            f"{path}: written by a newer stagebench ({wrote}, results schema {version}); this one reads "
            f"schema {RESULTS_SCHEMA_VERSION}: upgrade stagebench to read it"
        )
    raise RunFileError(
        f"{path}: results schema {version!r}, from {wrote}; this stagebench reads schema "
        f"{RESULTS_SCHEMA_VERSION}: measure again, or read it with the stagebench that wrote it"
    )


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run (``run.json`` or ``results.csv``)."""
    return (path / RUN_META).is_file() or (path / RESULTS).is_file()


def read_rows_or_empty(path: Path) -> Any:
    """The rows of a run directory; an empty frame when it has none (yet)."""
    # pandas loads where rows are read: a diagnosis writes its rows without it
    import pandas as pd

    if not (path / RESULTS).is_file() or (path / RESULTS).stat().st_size == 0:
        return pd.DataFrame()
    try:
        return read_rows(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()

"""Regenerate the tables in docs/ that come from the code: ``python docs/generate.py``.

Each generated table sits between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->`` in its file; the prose around it is written by
hand. ``tests/test_docs.py`` fails when a table is out of date, so the settings
table (:mod:`stagebench._settings`) and the column lists
(:mod:`stagebench.runs._schema`) stay the one source.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the checkout's stagebench, not an installed copy


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def environment_table() -> str:
    from stagebench._settings import OTHER_VARIABLES, SETTINGS

    rows = ["| variable | what it sets | allowed | default |", "|---|---|---|---|"]
    for name, text in OTHER_VARIABLES.items():
        rows.append(f"| `{name}` | {_cell(text)} | | |")
    for s in SETTINGS:
        if s.env:
            rows.append(f"| `{s.env}` | {_cell(s.help)} | {_cell(s.what())} | {_cell(s.default_text())} |")
    return "\n".join(rows)


def schema_tables() -> str:
    from stagebench.runs._schema import (
        EXECUTORS,
        HARNESSES,
        LOADER_COLUMN_DOCS,
        RESULTS_SCHEMA_VERSION,
        ROLES,
        STAGE_COLUMN_DOCS,
        STATUSES,
        SUMMARY_SCHEMA_VERSION,
    )

    out = [
        f"Results schema version {RESULTS_SCHEMA_VERSION}, summary schema version {SUMMARY_SCHEMA_VERSION}.",
        "",
        f"Allowed values: executor {', '.join(EXECUTORS)}; harness {', '.join(HARNESSES)}; "
        f"status {', '.join(STATUSES)}; role {', '.join(ROLES)}.",
        "",
        "Stage rows (`results.csv` of a pipeline run), in column order:",
        "",
        "| column | what it holds |",
        "|---|---|",
    ]
    named = {"ROLES": ROLES, "EXECUTORS": EXECUTORS, "HARNESSES": HARNESSES, "STATUSES": STATUSES}
    out += [f"| `{k}` | {_cell(' | '.join(named[v]) if v in named else v)} |" for k, v in STAGE_COLUMN_DOCS.items()]
    out += [
        "",
        "Loader rows (`results.csv` of a loader run), in column order:",
        "",
        "| column | what it holds |",
        "|---|---|",
    ]
    out += [f"| `{k}` | {_cell(' | '.join(named[v]) if v in named else v)} |" for k, v in LOADER_COLUMN_DOCS.items()]
    return "\n".join(out)


GENERATED = {"environment.md": ("environment", environment_table), "schema.md": ("schema", schema_tables)}


def render(path: Path, name: str, body: str) -> str:
    text = path.read_text(encoding="utf-8")
    begin, end = f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: no {begin} ... {end} markers")
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.S)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for file, (name, make) in GENERATED.items():
        path = DOCS / file
        new = render(path, name, make())
        if new != path.read_text(encoding="utf-8"):
            stale.append(file)
            if not check:
                path.write_text(new, encoding="utf-8")
    if check and stale:
        print(f"out of date: {', '.join(stale)} (run python docs/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

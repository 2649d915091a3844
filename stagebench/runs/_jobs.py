"""Job folders of a Hydra sweep: each job's own record (``job_status.json``) and its label.

Plain file reads: the comparison labels runs with them, and the sweep app writes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["JOB_STATUS", "job_status", "job_overrides", "job_label", "short_labels"]


JOB_STATUS = "job_status.json"  # written by the Hydra sweep app in each job folder


def job_status(job_dir: Path) -> dict[str, Any]:
    """The Hydra job's own record (status, reason, label, overrides), or {}."""
    p = Path(job_dir) / JOB_STATUS
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def job_overrides(run_dir: Path) -> list[str]:
    """Hydra overrides of the job that wrote ``run_dir`` ([] when it was not a Hydra job)."""
    st = job_status(run_dir)
    if isinstance(st.get("overrides"), list):
        return [str(x) for x in st["overrides"]]
    for d in (run_dir, run_dir.parent):
        ov = d / ".hydra" / "overrides.yaml"
        if ov.is_file():
            return _read_overrides(ov)
    return []


def job_label(run_dir: Path, label: str | None = None) -> str:
    """A name for a run: its own ``label`` (run.json's), the job's label, its Hydra overrides, or the
    folder name."""
    run_dir = Path(run_dir)
    own = label or job_status(run_dir).get("label")
    return str(own) if own else _by_overrides(run_dir, job_overrides(run_dir))


def _by_overrides(run_dir: Path, overrides: list[str]) -> str:
    """A run's name without a label of its own: its Hydra overrides, or its folder's name."""
    return ", ".join(overrides) if overrides else run_dir.name


def short_labels(run_dirs: Sequence[Path], labels: Sequence[str | None]) -> list[str]:
    """Labels for runs shown together: explicit labels (``labels``: run.json's) win; otherwise only the Hydra
    overrides that differ between the runs (``loader.backend=torch``), not the ones they share."""
    overrides = [job_overrides(Path(d)) for d in run_dirs]
    # partition gives (o, "", "") without "=", so a bare override maps to ""
    parsed = [{k: v for k, _, v in (o.partition("=") for o in ov)} for ov in overrides]
    differ = [k for k in dict.fromkeys(k for p in parsed for k in p) if len({p.get(k) for p in parsed}) > 1]
    out = []
    for d, label, ov, p in zip(run_dirs, labels, overrides, parsed):
        own = label or job_status(Path(d)).get("label")
        if own:
            out.append(str(own))
        elif p and differ and len(run_dirs) > 1:
            out.append(", ".join(f"{k}={p[k]}" for k in differ if k in p))
        else:
            out.append(_by_overrides(Path(d), ov))
    return out


def _read_overrides(path: Path) -> list[str]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return [str(x) for x in data or []]
    except Exception:  # a label is a nicety; fall back to the plain list
        return [
            ln[2:].strip()
            for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()
            if ln.startswith("- ")
        ]

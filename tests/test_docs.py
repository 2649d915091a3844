"""The front door: the README stays short, its links resolve, and the generated docs are current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_tables_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_bytes()) <= 15_000


def test_every_relative_link_resolves():
    broken = []
    for md in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text(encoding="utf-8")):
            if "://" not in target and not (md.parent / target).exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not broken, broken

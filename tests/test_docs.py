# SPDX-License-Identifier: Apache-2.0
"""The repository stands alone: every `docs/*.md` the code cites exists, the docs link only to files that exist,
and nothing cites the design notes the project started from (they are not in the repository)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("nemo_polar", "harness_adapters", "credit", "environments", "tests", "benchmarks", "scripts", "recipes")
SUFFIXES = {".py", ".md", ".yaml", ".sh", ".toml", ".jinja"}
CITATION = re.compile(r"\bdocs/([a-z0-9_]+\.md)\b")  # ours are lower-case (fixtures cite docs/CHANGES.md)
# the design notes outside the repository; a citation of one is a dead reference for a reader of the repository
OUTSIDE = re.compile(
    r"DESIGN §|\bDESIGN\.md\b|\bNEMO\.md\b|\bHARNESSES\.md\b|\bBACKEND\.md\b|\bSTYLE\.md\b|shared/(docs|seeds)/"
)


def _files() -> list[Path]:
    out = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for d in SCANNED:
        out += [p for p in sorted((ROOT / d).rglob("*")) if p.suffix in SUFFIXES and p.is_file()]
    return [p for p in out if p.resolve() != Path(__file__).resolve()]


def test_every_cited_doc_exists() -> None:
    missing = sorted(
        {
            f"{p.relative_to(ROOT)} cites docs/{name}"
            for p in _files()
            for name in CITATION.findall(p.read_text(errors="replace"))
            if not (ROOT / "docs" / name).is_file()
        }
    )
    assert missing == []


def test_docs_link_only_to_files_that_exist() -> None:
    broken = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target and not (doc.parent / target).exists():
                broken.append(f"{doc.name} -> {target}")
    assert broken == []


def test_nothing_cites_the_design_notes_outside_the_repository() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for p in _files()
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert found == []

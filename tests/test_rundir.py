# SPDX-License-Identifier: Apache-2.0
"""`nemo_polar.rundir`: the one owner of the run-directory layout, its readers and writers; and the arrows it
freed: no core module imports `credit`, and `collect/` has no import cycle."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest

from nemo_polar.proxy.store import RecordStore, read_records
from nemo_polar.rundir import (
    ResultLog,
    RunDir,
    finished_session_ids,
    read_records_of,
    read_results,
    records_by_session,
    write_json,
)
from nemo_polar.types import CompletionRecord, EvalResult, SessionResult, Trajectory

ROOT = Path(__file__).resolve().parents[1]


def _record(session_id: str, seq: int) -> CompletionRecord:
    return CompletionRecord(
        id=f"{session_id}-r{seq}", session_id=session_id, seq=seq, dialect="openai_chat", prompt_token_ids=[1, seq]
    )


def _result(session_id: str, reward: float = 1.0) -> SessionResult:
    return SessionResult(
        session_id=session_id, task_id="t", trajectory=Trajectory(traces=[]), eval=EvalResult(reward=reward)
    )


def test_result_log_appends_and_a_torn_line_is_cut_on_resume(tmp_path: Path) -> None:
    log = ResultLog(tmp_path)
    log.append(_result("a"))
    log.append(_result("b", 0.0))
    log.close()
    assert [(r.session_id, r.reward) for r in read_results(tmp_path)] == [("a", 1.0), ("b", 0.0)]
    with open(RunDir(tmp_path).trajectories, "ab") as f:
        f.write(b'{"session_id": "c", "task')  # a kill mid-write
    assert [r.session_id for r in read_results(tmp_path)] == ["a", "b"]  # the reader skips it
    assert finished_session_ids(tmp_path) == {"a", "b"}
    assert RunDir(tmp_path).trajectories.read_bytes().endswith(b"\n")  # and resume cut it off
    assert read_results(tmp_path / "missing") == [] and finished_session_ids(tmp_path / "missing") == set()


def test_records_are_read_through_the_store_api(tmp_path: Path) -> None:
    store = RecordStore(tmp_path).open()

    async def put() -> None:
        for sid, seq in [("s2", 1), ("s1", 0), ("s2", 0)]:
            await store.commit(_record(sid, seq))
        await store.put_pending(_record("s1", 1))  # an unfinished call: not a record yet
        await store.put_session("s1", "key", 0.0, {"harness": "pi"})

    try:
        asyncio.run(put())
        live = read_records(tmp_path)  # while the proxy still holds the store open
    finally:
        store.close()
    assert [(r.session_id, r.seq) for r in live] == [("s1", 0), ("s2", 0), ("s2", 1)]
    assert [(r.session_id, r.seq) for r in read_records(tmp_path, include_pending=True)][:2] == [("s1", 0), ("s1", 1)]
    by = records_by_session(tmp_path)
    assert {k: [r.seq for r in v] for k, v in by.items()} == {"s1": [0], "s2": [0, 1]}
    # an exported records.jsonl takes precedence over the store
    RunDir(tmp_path).records_jsonl.write_bytes(_record("x", 0).to_json() + b"\n")
    assert [r.id for r in read_records_of(tmp_path)] == ["x-r0"]
    assert read_records_of(tmp_path / "empty") == []
    with pytest.raises(FileNotFoundError):
        read_records(tmp_path / "empty")


def test_paths_and_atomic_json(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert rd.records_db == tmp_path / "records.sqlite" and rd.rollout_journal == tmp_path / "rollout.sqlite"
    s = rd.session("abc")
    assert s.diff == tmp_path / "sessions" / "abc" / "diff.patch" and s.result.name == "result.json"
    assert rd.node("node-1").session("x").agent_log == tmp_path / "node-1" / "sessions" / "x" / "agent.log"
    write_json(rd.summary, {"n": 1})
    assert rd.summary.read_text() == '{\n  "n": 1\n}\n' and not list(tmp_path.glob(".*.tmp"))


# -- the arrows ------------------------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_no_core_module_imports_credit() -> None:
    """Core = nemo_polar/** (credit lives in credit/, imported as nemo_polar.credit). Function-level imports count."""
    bad = [
        f"{p.relative_to(ROOT)} imports {i}"
        for p in sorted((ROOT / "nemo_polar").rglob("*.py"))
        for i in sorted(_imports(p))
        if i == "nemo_polar.credit" or i.startswith("nemo_polar.credit.")
    ]
    assert bad == []


def test_collect_has_no_import_cycle() -> None:
    mods = {p.stem: p for p in (ROOT / "nemo_polar" / "collect").glob("*.py") if p.stem != "__init__"}
    edges = {
        m: {i.split(".")[2] for i in _imports(p) if i.startswith("nemo_polar.collect.") and i.split(".")[2] in mods}
        for m, p in mods.items()
    }

    def reaches(a: str, b: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in edges[a])

    assert [m for m in mods if reaches(m, m)] == []


# file names the run directory holds; only rundir.py (and the store, for its own database) may spell them
RUN_FILES = re.compile(
    r"""["'](records\.sqlite|records\.jsonl|trajectories\.jsonl|result\.json|diff\.patch|summary\.json|"""
    r"""rollout\.sqlite|tasks\.jsonl|credit\.jsonl|agent\.log|sft\.jsonl|report\.html|plan\.json|outbox|"""
    r"""runtimes|workdir\.diff)["']"""
)
OWNERS = {"nemo_polar/rundir.py", "nemo_polar/proxy/store.py"}


def test_only_rundir_spells_the_run_directory_file_names() -> None:
    bad = []
    for top in ("nemo_polar", "credit", "environments"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in OWNERS:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if RUN_FILES.search(code) and not code.lstrip().startswith(('"', "'")):  # not docstring prose
                    bad.append(f"{rel}:{n}: {line.strip()}")
    assert bad == []

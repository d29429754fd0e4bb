# SPDX-License-Identifier: Apache-2.0
"""The causal graph: reference edges across any number of turns, IG→AE by path, AE→RV coverage."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nemo_polar.credit import CallGraph, annotate
from nemo_polar.credit.config import CallCreditConfig, GraphConfig

from .sessions import PYTEST_FAIL, bugfix_steps, make_session, per_request_trajectory, prefix_merged_trajectory


def edges(g: CallGraph) -> set[tuple[int, int]]:
    return {(e.src, e.dst) for e in g.edges}


def test_bugfix_session_edges() -> None:
    g = annotate(make_session(bugfix_steps()), harness="claude_code")
    e = edges(g)
    assert (0, 1) in e  # the grep found the file the read opens
    assert (1, 4) in e  # IG→AE by the edited path
    assert (4, 5) in e and (4, 7) in e  # AE→RV: the tests of the edited module
    assert (5, 6) in e  # the failing test's traceback names the file the corrective edit changes
    assert (2, 4) not in e and (3, 4) not in e  # README and `ls docs` informed nothing
    assert g.out_degree()[2] == 0 and g.out_degree()[3] == 0
    kinds = {(x.src, x.dst): x.kinds for x in g.edges}
    assert "verify" in kinds[(4, 5)] and "path" in kinds[(1, 4)]


def test_edge_spanning_many_turns() -> None:
    filler = [("Bash", {"command": f"ls dir{k}"}, f"file{k}.txt") for k in range(5)]
    steps = [
        ("Grep", {"pattern": "TIMEOUT", "path": "."}, "pkg/net/client.go:12:const TIMEOUT = 5"),
        *filler,
        ("Edit", {"file_path": "pkg/net/client.go", "old_string": "5", "new_string": "30"}, "ok"),
        (None, {"content": "done"}, None),
    ]
    g = annotate(make_session(steps), harness="claude_code")
    assert (0, 6) in edges(g)  # six turns apart
    assert all(g.nodes[k].role == "IG" for k in range(6)) and g.nodes[6].role == "AE"
    assert not any(e.src in range(1, 6) and e.dst == 6 for e in g.edges)


def test_symbol_and_test_name_edges() -> None:
    steps = [
        ("Read", {"file_path": "src/calc.py"}, "     1\tdef compute_total(items):\n     2\t    return sum(items)\n"),
        (
            "Bash",
            {"command": "pytest -q"},
            "FAILED tests/test_calc.py::test_rounding - AssertionError\n1 failed in 0.1s",
        ),
        ("Bash", {"command": "ls"}, "src tests"),
        ("Bash", {"command": "grep -rn compute_total lib"}, "lib/report.py:3: compute_total(x)"),
        ("Bash", {"command": "pytest -q -k test_rounding"}, "1 passed in 0.1s"),
        (None, {"content": "done"}, None),
    ]
    g = annotate(make_session(steps), harness="claude_code")
    kinds = {(x.src, x.dst): x.kinds for x in g.edges}
    assert "symbol" in kinds[(0, 3)]  # compute_total was introduced by the read of call 0
    assert "test" in kinds[(1, 4)]  # test_rounding was introduced by the failing run of call 1


def test_edge_source_option() -> None:
    steps = [
        ("Read", {"file_path": "src/a.py"}, "x"),
        ("Read", {"file_path": "src/a.py"}, "x"),
        ("Edit", {"file_path": "src/a.py", "old_string": "x", "new_string": "y"}, "ok"),
        (None, {"content": "done"}, None),
    ]
    recs = make_session(steps)
    assert {(0, 2), (1, 2)} <= edges(annotate(recs))
    latest = CallCreditConfig(graph=GraphConfig(source="latest"))
    e = edges(annotate(recs, config=latest))
    assert (1, 2) in e and (0, 2) not in e


def test_ae_rv_modes() -> None:
    steps = [
        ("Edit", {"file_path": "src/a.py", "old_string": "x", "new_string": "y"}, "ok"),
        ("Edit", {"file_path": "src/b.py", "old_string": "x", "new_string": "y"}, "ok"),
        ("Bash", {"command": "pytest tests/test_a.py -q"}, "1 passed in 0.1s"),
        ("Bash", {"command": "pytest -q"}, "5 passed in 0.3s"),
        (None, {"content": "done"}, None),
    ]
    recs = make_session(steps)
    e = edges(annotate(recs))
    assert (0, 2) in e and (1, 2) not in e  # the scoped run covers only a.py
    assert (0, 3) in e and (1, 3) in e  # the unscoped run covers every edit
    after = edges(annotate(recs, config=CallCreditConfig(graph=GraphConfig(ae_rv="after"))))
    assert (1, 2) in after


def test_failed_run_to_corrective_edit() -> None:
    steps = [
        ("Bash", {"command": "python -m pytest tests/test_dates.py"}, PYTEST_FAIL),
        ("Edit", {"file_path": "src/utils/dates.py", "old_string": "a", "new_string": "b"}, "ok"),
        (None, {"content": "done"}, None),
    ]
    g = annotate(make_session(steps))
    assert (0, 1) in edges(g)


def test_annotate_a_trajectory_gives_the_same_graph() -> None:
    recs = make_session(bugfix_steps())
    direct = annotate(recs, harness="claude_code")
    for traj in (per_request_trajectory(recs), prefix_merged_trajectory(recs)):
        traj.validate()
        via = annotate(traj, records=recs, harness="claude_code")
        assert via.roles() == direct.roles() and edges(via) == edges(direct)
    # a span whose record is missing becomes an OTHER node without edges
    partial = annotate(prefix_merged_trajectory(recs), records=recs[:-1], harness="claude_code")
    assert partial.nodes[-1].role == "OTHER" and partial.nodes[-1].source == "missing"


def test_graph_round_trips() -> None:
    g = annotate(make_session(bugfix_steps()), harness="claude_code")
    g2 = CallGraph.from_dict(g.to_dict())
    assert g2.to_dict() == g.to_dict()


_junk = st.one_of(
    st.none(),
    st.text(max_size=20),
    st.integers(),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_junk, _junk, _junk), min_size=1, max_size=6))
def test_malformed_records_never_raise(parts: list[tuple[object, object, object]]) -> None:
    from nemo_polar.types import CompletionRecord

    recs = []
    for k, (content, args, msgs) in enumerate(parts):
        tool_calls = [
            {"id": f"c{k}", "function": {"name": "Bash", "arguments": args if isinstance(args, str) else "{"}}
        ]
        recs.append(
            CompletionRecord(
                id=f"r{k}",
                session_id="s",
                seq=k,
                dialect="openai_chat",
                request={"messages": msgs if isinstance(msgs, list) else [{"role": "tool", "content": content}]},
                response={"content": content, "tool_calls": tool_calls if k % 2 else content},
            )
        )
    g = annotate(recs)
    assert len(g) == len(recs) and all(n.role in ("IG", "AE", "RV", "OTHER") for n in g.nodes)

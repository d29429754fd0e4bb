# SPDX-License-Identifier: Apache-2.0
"""The causal call graph G = (V, E) of one session, and `annotate()` that builds it.

Nodes are calls with roles (`roles.py`). An edge i→j (i < j) exists when call j's action references an
artifact that call i's observation introduced — a file path, a symbol defined in the shown code, a test
name — however many turns lie between them (an inverted index over artifacts, so the cost is linear in the
references). Two role-specific rules on top (the proposal's §1.2): IG→AE by referenced paths (covered by the
generic rule, since a read's own path counts as introduced by its observation), and AE→RV when the
verification covers what was edited (`GraphConfig.ae_rv`).

Paths match by their last two components (or by basename when one side is a bare file name), so
`/repo/src/a/b.py`, `src/a/b.py` and `a/b.py` are one artifact. This module computes no credit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_polar.types import CompletionRecord, Trajectory

from .calls import Call, extract_calls
from .config import CallCreditConfig, GraphConfig
from .roles import Judge, RoleLabel, classify_calls, openai_judge

__all__ = ["CallGraph", "CallNode", "Edge", "annotate", "build_edges"]

_EXT = (
    "py|pyi|pyx|ipynb|js|jsx|mjs|cjs|ts|tsx|vue|svelte|go|rs|java|kt|kts|scala|sc|c|h|cc|cpp|cxx|hpp|hh|cs|rb|php|"
    "swift|m|mm|lua|pl|pm|r|jl|ex|exs|erl|hs|ml|dart|sh|bash|zsh|sql|md|rst|txt|json|jsonl|yaml|yml|toml|cfg|ini|"
    "conf|env|lock|xml|html|htm|css|scss|less|proto|gradle|mk|cmake|tf|bzl|csv|tsv|log|patch|diff|in|tmpl|j2|jinja"
)
_EXTS = frozenset(_EXT.split("|"))
_SPECIAL_NAMES = frozenset({"Makefile", "Dockerfile", "Gemfile", "Rakefile", "Procfile", "LICENSE"})
# path candidates: runs of characters that can make a path, cut at whitespace, quotes and punctuation
_TOKEN_RE = re.compile(r"[\w./+@$-]+")
_DEF_KEYWORDS = tuple(
    f"{k} "
    for k in (
        "def", "class", "function", "func", "fn", "struct", "interface", "enum", "trait", "type", "module", "const",
        "let", "var", "val", "impl",
    )
)  # fmt: skip
_IDENT_AT = re.compile(r"\s*(?:\([^)\n]*\)\s*)?([A-Za-z_][A-Za-z0-9_]*)")
_NODE_ID_RE = re.compile(r"([\w./-]+\.py)::([\w\[\]:.,-]+)")
_GO_FAIL_RE = re.compile(r"--- FAIL: (\w+)")
_TEST_WORD_RE = re.compile(r"\b(test_\w+|Test[A-Z]\w*)")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STOP_SYMBOLS = {
    "self",
    "None",
    "True",
    "False",
    "return",
    "import",
    "from",
    "main",
    "init",
    "__init__",
    "test",
    "tests",
    "setup",
    "name",
    "data",
    "value",
    "args",
    "kwargs",
    "this",
    "null",
    "undefined",
    "string",
    "number",
    "void",
    "object",
    "list",
    "dict",
    "type",
    "class",
    "function",
    "const",
    "async",
    "await",
    "error",
    "result",
    "print",
}


def _path_keys(p: str) -> tuple[str, str | None, bool]:
    """(basename, last-two-components or None, is_bare) of a path, normalised."""
    p = p.strip().strip("'\"`,;()[]{}").rstrip(":")
    while p.startswith("./"):
        p = p[2:]
    parts = [x for x in p.split("/") if x and x not in (".", "..")]
    if not parts:
        return "", None, True
    base = parts[-1]
    last2 = "/".join(parts[-2:]) if len(parts) >= 2 else None
    return base, last2, len(parts) == 1


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n // 2] + "\n" + text[-n // 2 :]


@dataclass(slots=True)
class Edge:
    """i → j, why (`kind`: path | symbol | test | verify | after) and a few of the shared artifacts."""

    src: int
    dst: int
    kinds: list[str]
    artifacts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "kinds": self.kinds, "artifacts": self.artifacts}


@dataclass(slots=True)
class CallNode:
    """A call with its role, evidence and what it touched."""

    index: int
    record_id: str
    seq: int
    call_kind: str
    role: str
    evidence: list[str]
    ambiguous: bool
    source: str
    n_tokens: int
    paths_read: list[str]
    paths_written: list[str]
    test_targets: list[str]
    scoped: bool
    test_outcome: str | None
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class CallGraph:
    """One session's calls (in `seq` order) and causal edges."""

    session_id: str
    harness: str | None
    nodes: list[CallNode]
    edges: list[Edge]

    def __len__(self) -> int:
        return len(self.nodes)

    def out_degree(self) -> list[int]:
        deg = [0] * len(self.nodes)
        for e in self.edges:
            deg[e.src] += 1
        return deg

    def parents(self, j: int) -> list[int]:
        return sorted(e.src for e in self.edges if e.dst == j)

    def children(self, i: int) -> list[int]:
        return sorted(e.dst for e in self.edges if e.src == i)

    def roles(self) -> list[str]:
        return [n.role for n in self.nodes]

    def index_of(self) -> dict[str, int]:
        return {n.record_id: n.index for n in self.nodes}

    def polar_calls(self, chain_kinds: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """docs/nemo.md's `polar_calls`: per call `{call_index, record_id, role, evidence, parents, chain_kind}`."""
        parents: dict[int, list[int]] = {}
        for e in self.edges:
            parents.setdefault(e.dst, []).append(e.src)
        kinds = chain_kinds or {}
        return [
            {
                "call_index": n.index,
                "record_id": n.record_id,
                "role": n.role,
                "evidence": list(n.evidence),
                "parents": sorted(parents.get(n.index, [])),
                "chain_kind": kinds.get(n.record_id, n.call_kind),
            }
            for n in self.nodes
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "harness": self.harness,
            "nodes": [n.to_dict() for n in self.nodes],
            "edges": [e.to_dict() for e in self.edges],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CallGraph:
        return cls(
            session_id=d["session_id"],
            harness=d.get("harness"),
            nodes=[CallNode(**n) for n in d["nodes"]],
            edges=[Edge(**e) for e in d["edges"]],
        )


class _Artifacts:
    """Introduced and referenced artifacts of one call, as keys."""

    __slots__ = ("intro_bare", "intro_base", "intro_last2", "intro_syms", "intro_tests", "ref_paths", "ref_words")

    def __init__(self) -> None:
        self.intro_base: set[str] = set()
        self.intro_last2: set[str] = set()
        self.intro_bare: set[str] = set()
        self.intro_syms: set[str] = set()
        self.intro_tests: set[str] = set()
        self.ref_paths: list[tuple[str, str | None, bool]] = []
        self.ref_words: set[str] = set()

    def add_intro_path(self, p: str) -> None:
        base, last2, bare = _path_keys(p)
        if not base:
            return
        self.intro_base.add(base)
        if last2:
            self.intro_last2.add(last2)
        if bare:
            self.intro_bare.add(base)


def _defined_symbols(text: str) -> set[str]:
    """Names defined in shown code (`def x`, `class X`, `func (r T) X`, `const x` …); str.find keeps this linear."""
    out: set[str] = set()
    for kw in _DEF_KEYWORDS:
        i = text.find(kw)
        while i != -1:
            if i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"):
                m = _IDENT_AT.match(text, i + len(kw))
                if m:
                    out.add(m.group(1))
            i = text.find(kw, i + len(kw))
    return out


def _test_names(text: str) -> set[str]:
    """Test names a tool result introduced (pytest node ids, Go failures, test_* / Test* identifiers)."""
    out: set[str] = set()
    if "::" in text:
        out.update(m.group(2).split("::")[-1].split("[")[0] for m in _NODE_ID_RE.finditer(text))
    if "--- FAIL" in text:
        out.update(_GO_FAIL_RE.findall(text))
    if "test_" in text or "Test" in text:
        out.update(_TEST_WORD_RE.findall(text))
    return out


def _paths_in(text: str) -> list[str]:
    """File paths mentioned in `text`: tokens whose last component has a known extension or a special name."""
    out = []
    for tok in _TOKEN_RE.findall(text):
        if "." not in tok and "/" not in tok:
            continue
        tok = tok.rstrip(".")
        base = tok.rsplit("/", 1)[-1]
        if base in _SPECIAL_NAMES:
            out.append(tok)
            continue
        stem, dot, ext = base.rpartition(".")
        if dot and stem and ext.lower() in _EXTS and "@" not in tok and "$" not in tok and "//" not in tok:
            out.append(tok)
    return out


def _artifacts(call: Call, label: RoleLabel, cfg: GraphConfig) -> _Artifacts:
    a = _Artifacts()
    obs = _clip(call.observation, cfg.max_observation_chars)
    kinds = set(cfg.artifacts)
    if "path" in kinds:
        for p in _paths_in(obs):
            a.add_intro_path(p)
        if cfg.include_action_paths:
            for info in label.actions:
                for p in info.paths_read | info.paths_written:
                    a.add_intro_path(p)
    if "symbol" in kinds:
        a.intro_syms = {x for x in _defined_symbols(obs) if len(x) >= cfg.min_symbol_len} - _STOP_SYMBOLS
    if "test" in kinds:
        a.intro_tests = _test_names(obs)
    action = call.action_text()
    refs = set(_paths_in(action))
    for info in label.actions:
        refs |= info.paths_read | info.paths_written | {t.split("::")[0] for t in info.test_targets}
    a.ref_paths = [k for k in (_path_keys(p) for p in refs) if k[0]]
    a.ref_words = set(_IDENT_RE.findall(action))
    for t in (t for info in label.actions for t in info.test_targets):
        a.ref_words |= set(_IDENT_RE.findall(t))
    return a


def _stem(name: str) -> str:
    s = name.rsplit("/", 1)[-1]
    s = s.split(".", 1)[0]
    for pre in ("test_",):
        if s.startswith(pre):
            s = s[len(pre) :]
    for suf in ("_test", "_spec", "Test", "Tests"):
        if s.endswith(suf):
            s = s[: -len(suf)]
    return s.lower()


def build_edges(calls: Sequence[Call], labels: Sequence[RoleLabel], cfg: GraphConfig | None = None) -> list[Edge]:
    """All edges of one session (see the module docstring)."""
    cfg = cfg or GraphConfig()
    arts = [_artifacts(c, lab, cfg) for c, lab in zip(calls, labels, strict=True)]
    # inverted indexes: key -> calls (ascending) that introduced it
    idx_base: dict[str, list[int]] = {}
    idx_last2: dict[str, list[int]] = {}
    idx_bare: dict[str, list[int]] = {}
    idx_sym: dict[str, list[int]] = {}
    idx_test: dict[str, list[int]] = {}
    edges: dict[tuple[int, int], Edge] = {}

    def pick(lst: list[int]) -> list[int]:
        if cfg.source == "latest":
            return lst[-1:]
        if cfg.source == "first":
            return lst[:1]
        return lst

    def link(i: int, j: int, kind: str, artifact: str) -> None:
        e = edges.get((i, j))
        if e is None:
            e = edges[(i, j)] = Edge(i, j, [kind], [artifact])
        else:
            if kind not in e.kinds:
                e.kinds.append(kind)
            if len(e.artifacts) < 5 and artifact not in e.artifacts:
                e.artifacts.append(artifact)

    for j, a in enumerate(arts):
        for base, last2, bare in a.ref_paths:
            srcs: list[int] = []
            if bare:
                srcs = idx_base.get(base, [])
            else:
                srcs = idx_last2.get(last2 or "", []) + idx_bare.get(base, [])
            for i in pick(sorted(set(srcs))):
                link(i, j, "path", last2 or base)
        for w in a.ref_words:
            for i in pick(idx_sym.get(w, [])):
                link(i, j, "symbol", w)
            for i in pick(idx_test.get(w, [])):
                link(i, j, "test", w)
        for key in a.intro_base:
            idx_base.setdefault(key, []).append(j)
        for key in a.intro_last2:
            idx_last2.setdefault(key, []).append(j)
        for key in a.intro_bare:
            idx_bare.setdefault(key, []).append(j)
        for key in a.intro_syms:
            idx_sym.setdefault(key, []).append(j)
        for key in a.intro_tests:
            idx_test.setdefault(key, []).append(j)
    if cfg.ae_rv != "none":
        _ae_rv_edges(calls, labels, cfg, link)
    return sorted(edges.values(), key=lambda e: (e.src, e.dst))


def _ae_rv_edges(calls: Sequence[Call], labels: Sequence[RoleLabel], cfg: GraphConfig, link: Any) -> None:
    edited: list[tuple[int, set[str], set[str], set[str]]] = []  # (i, bases, last2s, stems)
    for j, (c, lab) in enumerate(zip(calls, labels, strict=True)):
        if lab.role == "AE":
            written = {p for info in lab.actions for p in info.paths_written}
            keys = [_path_keys(p) for p in written]
            edited.append(
                (j, {k[0] for k in keys if k[0]}, {k[1] for k in keys if k[1]}, {_stem(k[0]) for k in keys if k[0]})
            )
            continue
        if lab.role != "RV" or not edited:
            continue
        if cfg.ae_rv == "after":
            for i, *_ in edited:
                link(i, j, "after", "runs after the edit")
            continue
        scoped = any(info.scoped for info in lab.actions)
        targets = {t for info in lab.actions for t in (info.test_targets | info.paths_read)}
        tkeys = [_path_keys(t.split("::")[0]) for t in targets]
        tbases = {k[0] for k in tkeys}
        tlast2 = {k[1] for k in tkeys if k[1]}
        tstems = {_stem(k[0]) for k in tkeys}
        obs_paths = {_path_keys(p)[0] for p in _paths_in(_clip(c.observation, cfg.max_observation_chars))}
        for i, bases, last2s, stems in edited:
            why = None
            if (last2s & tlast2) or (bases & tbases):
                why = "verification names the edited path"
            elif stems & tstems - {""}:
                why = "test module matches the edited module"
            elif bases & obs_paths:
                why = "verification output mentions the edited path"
            elif not scoped and cfg.unscoped_rv_covers_all:
                why = "unscoped verification covers every edit"
            if why:
                link(i, j, "verify", why)


def annotate(
    source: Sequence[CompletionRecord] | Trajectory,
    *,
    records: Sequence[CompletionRecord] | Mapping[str, CompletionRecord] | None = None,
    harness: str | None = None,
    session_id: str | None = None,
    config: CallCreditConfig | None = None,
    judge: Judge | None = None,
) -> CallGraph:
    """Roles and causal graph of one session.

    Args:
        source: the session's `CompletionRecord`s, or its `Trajectory` (then `records` must hold the records its
            `call_spans` name; spans without a record become OTHER nodes without edges).
        harness: harness name for the tool table (`roles.DEFAULT_TOOL_ROLES` keys).
        judge: optional LLM judge for ambiguous calls (used only when `config.roles.judge.enabled`; when None and
            `config.roles.judge.base_url` is set, the built-in OpenAI-compatible judge is used).

    Returns:
        the `CallGraph`; node `index` follows `seq` order.
    """
    cfg = config or CallCreditConfig()
    if isinstance(source, Trajectory):
        recs = _records_for(source, records)
    else:
        recs = list(source)
    calls = extract_calls([r for r in recs if r is not None], text_shell_blocks=cfg.roles.text_shell_blocks)
    if judge is None and cfg.roles.judge.enabled and cfg.roles.judge.base_url:
        judge = openai_judge(cfg.roles.judge)
    labels = classify_calls(calls, harness=harness, config=cfg.roles, judge=judge)
    edges = build_edges(calls, labels, cfg.graph)
    nodes = [_node(c, lab) for c, lab in zip(calls, labels, strict=True)]
    if isinstance(source, Trajectory):
        nodes = _add_missing_span_nodes(source, nodes)
    sid = session_id or (recs[0].session_id if recs and recs[0] is not None else "")
    return CallGraph(session_id=sid, harness=harness, nodes=nodes, edges=edges)


def _records_for(
    traj: Trajectory, records: Sequence[CompletionRecord] | Mapping[str, CompletionRecord] | None
) -> list[CompletionRecord]:
    if records is None:
        return []
    pool = list(records.values()) if isinstance(records, Mapping) else list(records)
    wanted = {rid for t in traj.traces for rid, _, _ in t.call_spans}
    sessions = {r.session_id for r in pool if r.id in wanted}
    # every record of the spanned sessions: the observation of a call lives in a later request
    return [r for r in pool if r.session_id in sessions]


def _add_missing_span_nodes(traj: Trajectory, nodes: list[CallNode]) -> list[CallNode]:
    have = {n.record_id for n in nodes}
    extra = [rid for t in traj.traces for rid, _, _ in t.call_spans if rid not in have]
    out = list(nodes)
    for rid in dict.fromkeys(extra):
        out.append(
            CallNode(
                len(out),
                rid,
                -1,
                "main",
                "OTHER",
                ["no record for this span"],
                True,
                "missing",
                0,
                [],
                [],
                [],
                False,
                None,
                "",
            )
        )
    return out


def _summary(c: Call) -> str:
    if not c.actions:
        return c.text[:80].replace("\n", " ")
    a = c.actions[0]
    from .calls import shell_command_of

    cmd = shell_command_of(a.arguments)
    body = cmd if cmd is not None else ", ".join(f"{k}={str(v)[:40]}" for k, v in list(a.arguments.items())[:2])
    s = f"{a.tool or 'shell'}: {body}".replace("\n", " ")
    return s[:120] + (f" (+{len(c.actions) - 1})" if len(c.actions) > 1 else "")


def _node(c: Call, lab: RoleLabel) -> CallNode:
    return CallNode(
        index=c.index,
        record_id=c.record_id,
        seq=c.seq,
        call_kind=c.call_kind,
        role=lab.role,
        evidence=lab.evidence,
        ambiguous=lab.ambiguous,
        source=lab.source,
        n_tokens=c.n_tokens,
        paths_read=sorted({p for i in lab.actions for p in i.paths_read}),
        paths_written=sorted({p for i in lab.actions for p in i.paths_written}),
        test_targets=sorted({t for i in lab.actions for t in i.test_targets}),
        scoped=any(i.scoped for i in lab.actions),
        test_outcome=lab.test_outcome,
        summary=_summary(c),
    )

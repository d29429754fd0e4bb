# SPDX-License-Identifier: Apache-2.0
"""Role of each call: IG (information gathering), AE (action execution), RV (result verification), OTHER.

Signals, in order (docs/call_credit.md, "Roles"):
1. the tool name, through a per-harness table (`DEFAULT_TOOL_ROLES`; harness adapters may pass their own);
   a shell tool's command goes through `shell.analyse_shell`, and a call with several parts takes its
   strongest effect (`RoleConfig.effect_order`: SUBMIT > AE > RV > EXEC > IG > SETUP > NEUTRAL by default);
2. the observation (the tool result): test-runner output makes a program run RV, an edit confirmation AE,
   file content or listings IG — used only where the action alone is ambiguous;
3. the position prior (IG → AE → RV): a program run before the session's first edit is IG, after it RV;
4. an optional LLM judge (any OpenAI-compatible endpoint, an injectable callable) for what is still ambiguous.

Every label carries its evidence (a list of short strings) and whether it was ambiguous. This module does not
build edges or assign credit.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .calls import Action, Call, shell_command_of
from .config import JudgeConfig, RoleConfig
from .shell import ShellAnalysis, analyse_shell, code_writes_files, patch_paths

__all__ = [
    "DEFAULT_TOOL_ROLES",
    "PATH_ARG_KEYS",
    "ActionInfo",
    "Judge",
    "RoleLabel",
    "adapter_tool_roles",
    "classify_action",
    "classify_calls",
    "observation_signals",
    "openai_judge",
    "tool_table",
    "verification_outcome",
]

ROLE_NAMES = ("IG", "AE", "RV", "OTHER")

# tool-name -> hint (IG | AE | RV | OTHER | SHELL) per harness, as the six CLIs (and mini-swe-agent) name them
DEFAULT_TOOL_ROLES: dict[str, dict[str, str]] = {
    "claude_code": {
        "Read": "IG",
        "Grep": "IG",
        "Glob": "IG",
        "LS": "IG",
        "NotebookRead": "IG",
        "WebFetch": "IG",
        "WebSearch": "IG",
        "Task": "IG",
        "Agent": "IG",
        "BashOutput": "IG",
        "Edit": "AE",
        "MultiEdit": "AE",
        "Write": "AE",
        "NotebookEdit": "AE",
        "Bash": "SHELL",
        "TodoWrite": "OTHER",
        "KillShell": "OTHER",
        "KillBash": "OTHER",
        "ExitPlanMode": "OTHER",
        "SlashCommand": "OTHER",
        # Claude Code 2.1's task list, scheduling and session tools (the probe of `capture_role_calls.py` lists them)
        "TaskCreate": "OTHER",
        "TaskUpdate": "OTHER",
        "TaskList": "OTHER",
        "TaskGet": "OTHER",
        "TaskStop": "OTHER",
        "TaskOutput": "IG",
        "CronCreate": "OTHER",
        "CronDelete": "OTHER",
        "CronList": "OTHER",
        "ScheduleWakeup": "OTHER",
        "SendMessage": "OTHER",
        "Skill": "OTHER",
        "EnterWorktree": "OTHER",
        "ExitWorktree": "OTHER",
    },
    "codex": {
        "exec_command": "SHELL",
        "shell": "SHELL",
        "local_shell": "SHELL",
        "container.exec": "SHELL",
        "apply_patch": "AE",
        "update_plan": "OTHER",
        "view_image": "IG",
        "web_search": "IG",
        "write_stdin": "OTHER",
        "request_user_input": "OTHER",
        "get_goal": "OTHER",
        "create_goal": "OTHER",
        "update_goal": "OTHER",
    },
    "gemini_cli": {
        "read_file": "IG",
        "read_many_files": "IG",
        "search_file_content": "IG",
        "grep_search": "IG",
        "glob": "IG",
        "list_directory": "IG",
        "web_fetch": "IG",
        "google_web_search": "IG",
        "replace": "AE",
        "edit": "AE",
        "write_file": "AE",
        "run_shell_command": "SHELL",
        "save_memory": "OTHER",
        "write_todos": "OTHER",
        "update_topic": "OTHER",
        "enter_plan_mode": "OTHER",
        "activate_skill": "OTHER",
        "invoke_agent": "IG",
        "list_background_processes": "IG",
        "read_background_output": "IG",
    },
    "qwen_code": {
        "read_file": "IG",
        "read_many_files": "IG",
        "search_file_content": "IG",
        "grep_search": "IG",
        "glob": "IG",
        "list_directory": "IG",
        "web_fetch": "IG",
        "web_search": "IG",
        "task": "IG",
        "lsp": "IG",
        "replace": "AE",
        "edit": "AE",
        "write_file": "AE",
        "run_shell_command": "SHELL",
        "save_memory": "OTHER",
        "todo_write": "OTHER",
        "exit_plan_mode": "OTHER",
        "agent": "IG",
        "monitor": "SHELL",
        "task_stop": "OTHER",
        "send_message": "OTHER",
        "skill": "OTHER",
        "tool_search": "OTHER",
    },
    "opencode": {
        "read": "IG",
        "grep": "IG",
        "glob": "IG",
        "list": "IG",
        "webfetch": "IG",
        "task": "IG",
        "lsp_hover": "IG",
        "edit": "AE",
        "write": "AE",
        "patch": "AE",
        "multiedit": "AE",
        "bash": "SHELL",
        "lsp_diagnostics": "RV",
        "todowrite": "OTHER",
        "todoread": "OTHER",
        "skill": "OTHER",
    },
    "pi": {"read": "IG", "ls": "IG", "grep": "IG", "find": "IG", "edit": "AE", "write": "AE", "bash": "SHELL"},
    "mini_swe_agent": {"bash": "SHELL"},
    "shell": {"bash": "SHELL", "shell": "SHELL"},
}

PATH_ARG_KEYS = (
    "file_path",
    "path",
    "absolute_path",
    "filePath",
    "notebook_path",
    "paths",
    "file",
    "filename",
    "target_file",
    "dir_path",
    "directory",
)

_NAME_HINTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"bash|shell|exec|terminal|run_command|command", re.I), "SHELL"),
    (re.compile(r"edit|write|create|patch|replace|insert|delete|remove|rename|move|apply", re.I), "AE"),
    (re.compile(r"test|verify|check|lint|diagnos", re.I), "RV"),
    (re.compile(r"read|view|open|get|search|grep|glob|find|list|ls|fetch|browse|lookup|cat|show", re.I), "IG"),
    (re.compile(r"todo|plan|memory|note|think", re.I), "OTHER"),
]

_TEST_OUTPUT = re.compile(
    r"^=+ .*\b(?:passed|failed|errors?)\b.* in [\d.]+s|^(?:FAILED|PASSED|ERROR) [\w/.-]+::|^Ran \d+ tests? in [\d.]+s|"
    r"^--- (?:FAIL|PASS): |^(?:ok|FAIL)\s+\S+\s+[\d.]+s|test result: (?:ok|FAILED)\.|\bTests?:\s+\d+ (?:passed|failed)|"
    r"\b\d+ (?:passed|failed)(?:,| in )|tests finished: \d+ passed|Test Files\s+\d+|^collected \d+ items?",
    re.M,
)
_TEST_FAIL = re.compile(
    r"\b\d+ failed\b|^FAILED\b|--- FAIL:|^FAIL\s|test result: FAILED|FAILED \((?:failures|errors)=|"
    r"Tests?:\s+\d+ failed|\d+ errors? in [\d.]+s|^E\s+\w*Error|✕|AssertionError|"
    r"(?:[Ee]xit(?:ed with)? [Cc]ode|[Ee]xit [Ss]tatus)[: ]+[1-9]",
    re.M,
)
_TEST_PASS = re.compile(
    r"\b\d+ passed\b(?!.*\bfailed)|^OK(?: \(|\s*$)|test result: ok\.|^ok\s+\S+\s+[\d.]+s|"
    r"Tests?:\s+\d+ passed, \d+ total|tests finished: \d+ passed, in|✓",
    re.M,
)
_EDIT_CONFIRM = re.compile(
    r"has been (?:updated|edited|modified|created|written)|[Ss]uccessfully (?:modified|created|wrote|replaced|"
    r"written|applied|updated)|File created successfully|Updated the following files|Applied \d+ edits?|"
    r"Patch applied|patching file |\b[Ww]rote \d+ bytes\b"
)
# cheap pre-checks: a regex runs only when one of its literal keywords occurs in the text
_TEST_KEYS = (
    "passed",
    "failed",
    "FAILED",
    "PASSED",
    "ERROR",
    "Ran ",
    "--- ",
    "ok ",
    "FAIL",
    "test result",
    "Test",
    "collected",
    "tests finished",
)
_EDIT_KEYS = (
    "has been",
    "uccessfully",
    "File created",
    "Updated the",
    "Applied",
    "Patch applied",
    "patching",
    "rote ",
)
_EXIT_CODE = re.compile(r"(?:[Ee]xit(?:ed with)? [Cc]ode|[Ee]xit [Ss]tatus)[: ]+(\d+)\b")
_DIFF = re.compile(r"^(?:diff --git |@@ -\d+|\+\+\+ b/)", re.M)
_NUMBERED = re.compile(r"^\s*\d+[\t→│|:]", re.M)


def adapter_tool_roles(adapter: Any) -> dict[str, str]:
    """A harness adapter's tool table for `RoleConfig.tool_roles[adapter.name]` (duck-typed: `role_hints` and
    `shell_tool`, so credit never imports the adapters)."""
    table = {str(k): str(v) for k, v in dict(getattr(adapter, "role_hints", {}) or {}).items()}
    shell = getattr(adapter, "shell_tool", None)
    if shell:
        table[str(shell)] = "SHELL"
    return table


def tool_table(harness: str | None, overrides: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """The tool → hint table for `harness`: its own table over the union of all, then `overrides`."""
    table: dict[str, str] = {}
    for t in DEFAULT_TOOL_ROLES.values():
        table.update(t)
    if harness and harness in DEFAULT_TOOL_ROLES:
        table.update(DEFAULT_TOOL_ROLES[harness])
    for key in ("*", harness or ""):
        if overrides and key in overrides:
            table.update(overrides[key])
    return table


def observation_signals(text: str | None) -> set[str]:
    """Shapes found in a tool result: test_output, test_failed, test_passed, edit_confirm, diff, file_content."""
    if not text:
        return set()
    out = set()
    if any(k in text for k in _TEST_KEYS) and _TEST_OUTPUT.search(text):
        out.add("test_output")
        if _TEST_FAIL.search(text):
            out.add("test_failed")
        elif _TEST_PASS.search(text):
            out.add("test_passed")
    if any(k in text for k in _EDIT_KEYS) and _EDIT_CONFIRM.search(text):
        out.add("edit_confirm")
    if ("@@" in text or "diff --git" in text or "+++" in text) and _DIFF.search(text):
        out.add("diff")
    if len(_NUMBERED.findall(text[:4000])) >= 2:
        out.add("file_content")
    return out


def verification_outcome(text: str | None) -> str | None:
    """'passed' | 'failed' | None (not recognisable) for a verification's output."""
    if not text:
        return None
    code = _EXIT_CODE.search(text)  # the harness's own report of the exit status wins when there is one
    if code is not None:
        return "failed" if code.group(1) != "0" or _TEST_FAIL.search(text) else "passed"
    if _TEST_FAIL.search(text):
        return "failed"
    if _TEST_PASS.search(text) or re.search(
        r"\b(?:0 errors|no issues found|All checks passed|Success: no issues)", text, re.I
    ):
        return "passed"
    if re.search(r"\b(?:error|Traceback|exception)\b", text, re.I):
        return "failed"
    return None


@dataclass(slots=True)
class ActionInfo:
    """What one action does: its effect, why, and the paths/tests it touches."""

    effect: str  # IG | AE | RV | EXEC | SETUP | NEUTRAL | SUBMIT | OTHER
    evidence: list[str]
    paths_read: set[str] = field(default_factory=set)
    paths_written: set[str] = field(default_factory=set)
    test_targets: set[str] = field(default_factory=set)
    scoped: bool = False
    shell: ShellAnalysis | None = None


def _arg_paths(args: Mapping[str, Any]) -> set[str]:
    out: set[str] = set()
    for k in PATH_ARG_KEYS:
        v = args.get(k)
        if isinstance(v, str) and v and "\n" not in v:
            out.add(v)
        elif isinstance(v, list):
            out.update(x for x in v if isinstance(x, str) and "\n" not in x)
    edits = args.get("edits")
    if isinstance(edits, list):
        for e in edits:
            if isinstance(e, Mapping) and isinstance(e.get("file_path"), str):
                out.add(e["file_path"])
    return out


def classify_action(action: Action, harness: str | None, cfg: RoleConfig) -> ActionInfo:
    """Classify one action from its tool name and arguments only (no observation, no position)."""
    table = tool_table(harness, cfg.tool_roles)
    tool = action.tool
    hint: str | None
    if tool is None:
        hint = "SHELL"
        ev = ["text: shell block in the reply"]
    else:
        hint = table.get(tool)
        ev = [f"tool:{tool}→{hint}"] if hint else []
        if hint is None:
            low = {k.lower(): v for k, v in table.items()}
            hint = low.get(tool.lower())
            if hint:
                ev = [f"tool:{tool}→{hint} (case-insensitive)"]
        if hint is None:
            for pat, h in _NAME_HINTS:
                if pat.search(tool):
                    hint = h
                    ev = [f"tool-name pattern {pat.pattern!r}→{h}"]
                    break
        if hint is None:
            hint = "EXEC"
            ev = [f"unknown tool {tool}"]
    args = action.arguments
    if hint == "SHELL":
        cmd = shell_command_of(args)
        if cmd is None:
            return ActionInfo("EXEC", [*ev, "shell tool without a command"])
        sa = analyse_shell(cmd, scratch_prefixes=cfg.scratch_prefixes, submit_sentinels=cfg.submit_sentinels)
        top = sa.strongest(cfg.effect_order)
        if top is None:
            return ActionInfo("NEUTRAL", [*ev, "empty command"], shell=sa)
        eff = top.effect
        if eff == "NEUTRAL" and any(c.argv[:1] == ["cd"] for c in sa.commands if c.effect == "NEUTRAL"):
            eff = "IG"
        parts = sorted({c.effect for c in sa.commands})
        ev = [*ev, f"shell:{top.reason}→{eff}"] + ([f"compound:{'+'.join(parts)}"] if len(parts) > 1 else [])
        return ActionInfo(eff, ev, set(sa.paths_read), set(sa.paths_written), set(sa.test_targets), sa.scoped, sa)
    paths = _arg_paths(args)
    info = ActionInfo(hint, ev)
    if hint == "AE":
        info.paths_written = paths
        for key in ("input", "patch", "patchText", "diff"):
            v = args.get(key)
            if isinstance(v, str):
                info.paths_written |= patch_paths(v)
    elif hint == "IG":
        info.paths_read = paths
    elif hint == "RV":
        info.paths_read = paths
        info.scoped = bool(paths)
    # a raw-argument tool whose text carries code that writes files
    raw = args.get("_raw")
    if hint == "EXEC" and isinstance(raw, str) and code_writes_files(raw):
        info.effect = "AE"
        info.evidence.append("arguments write files")
    return info


@dataclass(slots=True)
class RoleLabel:
    """The role of one call and why."""

    role: str
    evidence: list[str]
    ambiguous: bool
    source: str  # rule | observation | prior | judge | side | text
    actions: list[ActionInfo] = field(default_factory=list)
    test_outcome: str | None = None


Judge = Callable[[Mapping[str, Any]], str | None]
"""A judge gets {harness, tool, arguments, observation, position, n_calls, after_edit} and returns a role or None."""


def _combine(infos: Sequence[ActionInfo], order: Sequence[str]) -> tuple[str, list[str]]:
    effs = {i.effect for i in infos}
    for eff in order:
        if eff in effs:
            return eff, [e for i in infos for e in i.evidence]
    if "OTHER" in effs:
        return "OTHER", [e for i in infos for e in i.evidence]
    return (infos[0].effect if infos else "OTHER"), [e for i in infos for e in i.evidence]


def _label_one(call: Call, harness: str | None, cfg: RoleConfig, after_edit: bool) -> RoleLabel:
    if not call.ok:
        return RoleLabel("OTHER", ["failed call (error set)"], False, "rule")
    if not call.actions:
        return RoleLabel("OTHER", ["text-only reply"], False, "text")
    infos = [classify_action(a, harness, cfg) for a in call.actions]
    eff, ev = _combine(infos, cfg.effect_order)
    obs = call.observation
    sig = observation_signals(obs) if cfg.use_observation else set()
    outcome = None
    if eff == "SUBMIT":
        return RoleLabel("OTHER", [*ev, "submission"], False, "rule", infos)
    if eff in ("IG", "AE", "RV", "OTHER"):
        if eff == "RV":
            outcome = verification_outcome(obs)
        if sig:
            ev.append("obs:" + ",".join(sorted(sig)))
        return RoleLabel(eff, ev, False, "rule", infos, outcome)
    if eff == "SETUP":
        return RoleLabel("OTHER", [*ev, "environment set-up"], False, "rule", infos)
    if eff == "NEUTRAL":
        return RoleLabel("OTHER", [*ev, "no effect on the workspace"], False, "rule", infos)
    # EXEC (or an unknown tool): observation, then position prior
    if "test_output" in sig:
        return RoleLabel("RV", [*ev, "obs:test runner output"], True, "observation", infos, verification_outcome(obs))
    if "edit_confirm" in sig:
        return RoleLabel("AE", [*ev, "obs:edit confirmation"], True, "observation", infos)
    if cfg.position_prior:
        if after_edit:
            return RoleLabel(
                "RV", [*ev, "prior:runs code after an edit→RV"], True, "prior", infos, verification_outcome(obs)
            )
        return RoleLabel("IG", [*ev, "prior:runs code before any edit→IG"], True, "prior", infos)
    return RoleLabel("IG", [*ev, "default:IG"], True, "rule", infos)


def classify_calls(
    calls: Sequence[Call],
    *,
    harness: str | None = None,
    config: RoleConfig | None = None,
    judge: Judge | None = None,
    context: Sequence[Mapping[str, Any]] | None = None,
) -> list[RoleLabel]:
    """Label every call of one session. `context[i]` may force `after_edit` (used by the label set)."""
    cfg = config or RoleConfig()
    out: list[RoleLabel] = []
    seen_edit = False
    for i, c in enumerate(calls):
        if c.call_kind == "side" and cfg.side_calls == "other":
            out.append(RoleLabel("OTHER", ["side call"], False, "side"))
            continue
        after = seen_edit
        if context is not None and i < len(context) and "after_edit" in context[i]:
            after = bool(context[i]["after_edit"])
        lab = _label_one(c, harness, cfg, after)
        if lab.ambiguous and judge is not None and cfg.judge.enabled:
            a0 = c.actions[0] if c.actions else None
            verdict = judge(
                {
                    "harness": harness,
                    "tool": a0.tool if a0 else None,
                    "arguments": a0.arguments if a0 else {},
                    "observation": (c.observation or "")[: cfg.judge.max_chars],
                    "position": i,
                    "n_calls": len(calls),
                    "after_edit": after,
                    "rule_role": lab.role,
                }
            )
            if verdict in ROLE_NAMES:
                lab = RoleLabel(
                    verdict,
                    [*lab.evidence, f"judge→{verdict}"],
                    True,
                    "judge",
                    lab.actions,
                    lab.test_outcome if verdict == "RV" else None,
                )
        if lab.role == "AE":
            seen_edit = True
        out.append(lab)
    return out


_JUDGE_PROMPT = (
    "You label one tool call of a coding agent with its functional role.\n"
    "IG = information gathering (reads, searches, runs code only to learn something before any fix);\n"
    "AE = action execution (changes files or the project);\n"
    "RV = result verification (runs tests, checks, or the program to confirm a change);\n"
    "OTHER = none of these.\nAnswer with exactly one word: IG, AE, RV or OTHER."
)


def openai_judge(cfg: JudgeConfig) -> Judge:
    """A judge that asks an OpenAI-compatible chat endpoint (stdlib HTTP, `cfg.timeout_s` per request).

    Any failure (network, timeout, unparsable answer) yields None: the rule label stands.
    """
    if not cfg.base_url or not cfg.model:
        raise ValueError("the OpenAI-compatible judge needs base_url and model")
    url = cfg.base_url.rstrip("/") + "/chat/completions"
    key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""

    def judge(item: Mapping[str, Any]) -> str | None:
        user = json.dumps(
            {k: item.get(k) for k in ("harness", "tool", "arguments", "observation", "after_edit")}, default=str
        )[: cfg.max_chars]
        body = json.dumps(
            {
                "model": cfg.model,
                "messages": [{"role": "system", "content": _JUDGE_PROMPT}, {"role": "user", "content": user}],
                "temperature": 0,
                "max_tokens": 4,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
                data = json.loads(resp.read())
            text = data["choices"][0]["message"]["content"] or ""
        except Exception:
            return None
        m = re.search(r"\b(IG|AE|RV|OTHER)\b", text.upper())
        return m.group(1) if m else None

    return judge

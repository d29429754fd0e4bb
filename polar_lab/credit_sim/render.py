# SPDX-License-Identifier: Apache-2.0
"""Abstract actions → a harness's concrete tool calls and tool results (docs/credit_sim_model.md §4).

`Repo` is one task's small repository (relevant module, its tests, irrelevant modules, README) and the text of
every observation (grep hits, numbered file content, edit confirmations, pytest output, git output). `render`
gives, for one vocabulary and action, the assistant turn (`reasoning`, `content`, tool calls as (name, arguments))
and the observation the harness sends back. Vocabularies use the tool names and argument shapes of the core's
role tables. This module builds no records and tokenises nothing (`records.py`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .model import State

__all__ = ["HELD_IN", "HELD_OUT", "VOCABULARIES", "Repo", "Turn", "make_repo", "render", "tool_schemas"]

VOCABULARIES = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi", "mini_swe_agent")
HELD_OUT = "mini_swe_agent"
HELD_IN = tuple(v for v in VOCABULARIES if v != HELD_OUT)

_PKGS = ("billing", "dates", "geometry", "inventory", "textkit", "netutil", "ledger", "shipping", "metrics", "units")
_MODS = ("parser", "amounts", "convert", "records", "tokens", "rates", "ranges", "codes")
_IRR = ("logging_setup", "cli", "constants", "colors", "cache", "version", "http_client", "plugins")
# (function, buggy body line, fixed line, wrong line, target test, other function, other test)
_BUGS = (
    (
        "parse_amount",
        "    return int(text.split(SEP)[0])",
        "    return int(text.strip().split(SEP)[0])",
        "    return int(text.strip())",
        "test_parse_amount_strips_spaces",
        "format_amount",
        "test_format_amount",
    ),
    (
        "clamp_ratio",
        "    return min(value, HIGH)",
        "    return max(LOW, min(value, HIGH))",
        "    return max(LOW, value)",
        "test_clamp_ratio_lower_bound",
        "scale_ratio",
        "test_scale_ratio",
    ),
    (
        "normalize_code",
        "    return code.upper()",
        "    return code.strip().upper()",
        "    return code.strip()",
        "test_normalize_code_whitespace",
        "split_codes",
        "test_split_codes",
    ),
)


@dataclass(frozen=True, slots=True)
class Repo:
    """One task's repository and issue text."""

    pkg: str
    mod: str
    irrelevant: tuple[str, ...]
    fn: str
    bug: str
    fix: str
    wrong: str
    target_test: str
    other_fn: str
    other_test: str
    mentions_path: bool

    @property
    def rel(self) -> str:
        return f"src/{self.pkg}/{self.mod}.py"

    @property
    def test_file(self) -> str:
        return f"tests/test_{self.mod}.py"

    def irr_path(self, i: int) -> str:
        name = self.irrelevant[i % len(self.irrelevant)]
        return "README.md" if name == "README" else f"src/{self.pkg}/{name}.py"

    def source(self) -> str:
        return (
            'SEP = ","\nLOW = 0\nHIGH = 100\n\n\n'
            f'def {self.fn}(text):\n    """{self.fn.replace("_", " ").capitalize()}."""\n{self.bug}\n\n\n'
            f"def {self.other_fn}(value):\n    return str(value)\n"
        )

    def irr_source(self, i: int) -> str:
        name = self.irrelevant[i % len(self.irrelevant)]
        if name == "README":
            return f"# {self.pkg}\n\nSmall utilities for {self.pkg}.\n\n## Install\n\n    pip install -e .\n"
        return (
            f'"""{name.replace("_", " ").capitalize()} helpers."""\n\nDEFAULT_{name.upper()} = {len(name)}\n\n\n'
            f"def {name}_helper(x):\n    return x + DEFAULT_{name.upper()}\n"
        )

    def issue(self) -> str:
        where = f" in `{self.rel}`" if self.mentions_path else ""
        return (
            f"`{self.fn}`{where} gives the wrong result for inputs with surrounding spaces or out-of-range values; "
            f"`{self.target_test}` fails. Fix the bug so that the test suite passes."
        )

    def pytest_output(self, edit: str) -> tuple[str, bool]:
        """(pytest -q output, passed) for the current state of the relevant module."""
        if edit == "ok":
            return (
                "....                                                                     [100%]\n4 passed in 0.05s",
                True,
            )
        failed = [f"FAILED {self.test_file}::{self.target_test} - AssertionError"]
        if edit == "bad":
            failed.append(f"FAILED {self.test_file}::{self.other_test} - AssertionError")
        head = "F" * len(failed) + "." * (4 - len(failed))
        body = "\n".join(failed)
        detail = (
            f"=================================== FAILURES ===================================\n"
            f"_____________________ {self.target_test} _____________________\n"
            f">       assert {self.fn}(' 12,5 ') == 12\nE       AssertionError\n{self.rel}:8: AssertionError\n"
        )
        summary = f"{len(failed)} failed, {4 - len(failed)} passed in 0.07s"
        return f"{head}{' ' * 60}[100%]\n{detail}{body}\n{summary}", False


def make_repo(rng: random.Random, mentions_path: bool) -> Repo:
    fn, bug, fix, wrong, tt, ofn, ot = rng.choice(_BUGS)
    irr = (*rng.sample(_IRR, 3), "README")
    return Repo(rng.choice(_PKGS), rng.choice(_MODS), irr, fn, bug, fix, wrong, tt, ofn, ot, mentions_path)


def _numbered(text: str, style: str) -> str:
    lines = text.rstrip("\n").split("\n")
    if style == "cat":
        return "\n".join(f"{i + 1:>6}\t{x}" for i, x in enumerate(lines))
    if style == "arrow":
        return "\n".join(f"{i + 1:>6}→{x}" for i, x in enumerate(lines))
    if style == "pipe":
        return "\n".join(f"{i + 1:05d}| {x}" for i, x in enumerate(lines))
    return "\n".join(lines)


@dataclass(slots=True)
class Turn:
    """One assistant turn and what came back."""

    reasoning: str
    content: str
    tool_calls: list[tuple[str, dict[str, Any]]]
    observation: str | None


_THOUGHTS = {
    "SEARCH": "I need to find where {fn} is defined.",
    "LIST": "Let me look at the layout of the repository.",
    "READ_REL": "Let me read the module that defines {fn}.",
    "READ_IRR": "Let me check {path} as well.",
    "EDIT_FIX": "The function does not handle the input correctly; I will patch it.",
    "EDIT_WRONG": "I will change the return statement of {fn}.",
    "EDIT_DIST": "I will tidy up {path} while I am here.",
    "TEST": "Let me run the tests.",
    "REVERT": "That edit broke another test; I will revert the file.",
    "SUBMIT": "The fix is in place.",
    "NULL": "Let me think about the next step.",
}


def _target(repo: Repo, action: str, state: State, k: int) -> str:
    if action in ("READ_IRR", "EDIT_DIST"):
        return repo.irr_path(k)
    return repo.rel


def _edit_strings(repo: Repo, action: str, k: int) -> tuple[str, str, str]:
    """(path, old, new) of an edit action."""
    if action == "EDIT_FIX":
        return repo.rel, repo.bug, repo.fix
    if action == "EDIT_WRONG":
        return repo.rel, repo.bug, repo.wrong
    path = repo.irr_path(k)
    name = repo.irrelevant[k % len(repo.irrelevant)]
    if name == "README":
        return path, f"Small utilities for {repo.pkg}.", f"Small, tested utilities for {repo.pkg}."
    return path, f"def {name}_helper(x):", f"def {name}_helper(x):  # noqa: D103"


def _shell_cmd(repo: Repo, action: str, k: int) -> str:
    if action == "SEARCH":
        return f"grep -rn 'def {repo.fn}' src"
    if action == "LIST":
        return f"ls src/{repo.pkg} tests"
    if action in ("READ_REL", "READ_IRR"):
        return f"cat {_target(repo, action, State(0, True, False, 'none', False, False), k)}"
    if action == "TEST":
        return f"python -m pytest {repo.test_file} -q"
    if action == "REVERT":
        return f"git checkout -- {repo.rel}"
    raise ValueError(action)


def _shell_obs(repo: Repo, action: str, state: State, k: int) -> tuple[str, int]:
    """(output, exit code) of a shell action."""
    if action == "SEARCH":
        return f"{repo.rel}:6:def {repo.fn}(text):", 0
    if action == "LIST":
        files = sorted({f"{repo.mod}.py", *(f"{n}.py" for n in repo.irrelevant if n != "README"), "__init__.py"})
        return f"src/{repo.pkg}:\n" + "\n".join(files) + f"\n\ntests:\ntest_{repo.mod}.py", 0
    if action == "READ_REL":
        return repo.source(), 0
    if action == "READ_IRR":
        return repo.irr_source(k), 0
    if action == "TEST":
        out, ok = repo.pytest_output(state.edit)
        return out, 0 if ok else 1
    if action == "REVERT":
        return "Updated 1 path from the index", 0
    raise ValueError(action)


def _sed_escape(s: str) -> str:
    out = []
    for ch in s:
        if ch in "/\\&.*[]^$":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out).replace("'", "'\\''")


def render(vocab: str, repo: Repo, action: str, state: State, k: int) -> Turn:
    """The assistant turn for `action` at call `k` (in `state`) and the observation the harness sends back.

    `state` is the state before the call (a test run's output depends on the edit state); `k` picks which
    irrelevant file a READ_IRR / EDIT_DIST touches.
    """
    thought = _THOUGHTS[action].format(fn=repo.fn, path=_target(repo, action, state, k))
    if action in ("SUBMIT", "NULL"):
        text = f"I fixed `{repo.fn}` in {repo.rel}." if action == "SUBMIT" else "Let me think about what to do next."
        if vocab == "mini_swe_agent":
            if action == "SUBMIT":
                return Turn(
                    thought,
                    f"THOUGHT: {thought}\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
                    [],
                    None,
                )
            return Turn(
                thought, f"THOUGHT: {thought}", [], "Please always provide EXACTLY ONE action in triple backticks."
            )
        return Turn(thought, text, [], None if action == "SUBMIT" else "Please continue.")
    if vocab == "mini_swe_agent":
        if action.startswith("EDIT"):
            path, old, new = _edit_strings(repo, action, k)
            cmd = f"sed -i 's/{_sed_escape(old.strip())}/{_sed_escape(new.strip())}/' {path}"
            out, code = "", 0
        else:
            cmd = _shell_cmd(repo, action, k)
            out, code = _shell_obs(repo, action, state, k)
        content = f"THOUGHT: {thought}\n\n```bash\n{cmd}\n```"
        return Turn(thought, content, [], f"<returncode>{code}</returncode>\n<output>\n{out}\n</output>")
    name, args, obs = _tool_call(vocab, repo, action, state, k)
    return Turn(thought, "", [(name, args)], obs)


def _tool_call(vocab: str, repo: Repo, action: str, state: State, k: int) -> tuple[str, dict[str, Any], str]:
    abs_path = f"/repo/{_target(repo, action, state, k)}"
    if action.startswith("EDIT"):
        return _edit_call(vocab, repo, action, k)
    if action in ("READ_REL", "READ_IRR"):
        text, _ = _shell_obs(repo, action, state, k)
        if vocab == "claude_code":
            return "Read", {"file_path": abs_path}, _numbered(text, "arrow")
        if vocab == "codex":
            return "exec_command", {"cmd": f"sed -n '1,200p' {abs_path[6:]}"}, text
        if vocab in ("gemini_cli", "qwen_code"):
            return "read_file", {"absolute_path": abs_path}, text
        if vocab == "opencode":
            return "read", {"filePath": abs_path}, "<file>\n" + _numbered(text, "pipe") + "\n</file>"
        return "read", {"path": abs_path}, text  # pi
    if action == "SEARCH":
        pat = f"def {repo.fn}"
        hit = f"{repo.rel}:6:def {repo.fn}(text):"
        if vocab == "claude_code":
            return "Grep", {"pattern": pat, "path": "src", "output_mode": "content", "-n": True}, hit
        if vocab == "codex":
            return "exec_command", {"cmd": f"rg -n '{pat}' src"}, hit
        if vocab == "gemini_cli":
            return (
                "search_file_content",
                {"pattern": pat},
                f"Found 1 match\nFile: {repo.rel}\nL6: def {repo.fn}(text):",
            )
        if vocab == "qwen_code":
            return "grep_search", {"pattern": pat}, f"Found 1 match\nFile: {repo.rel}\nL6: def {repo.fn}(text):"
        return "grep", {"pattern": pat, "path": "src"}, hit
    if action == "LIST":
        text, _ = _shell_obs(repo, action, state, k)
        d = f"/repo/src/{repo.pkg}"
        if vocab == "claude_code":
            return "LS", {"path": d}, text
        if vocab == "codex":
            return "exec_command", {"cmd": f"ls src/{repo.pkg} tests"}, text
        if vocab == "gemini_cli":
            return "list_directory", {"dir_path": d}, text
        if vocab == "qwen_code":
            return "list_directory", {"path": d}, text
        if vocab == "opencode":
            return "list", {"path": d}, text
        return "ls", {"path": d}, text
    # TEST, REVERT: the harness's shell tool
    cmd = _shell_cmd(repo, action, k)
    out, code = _shell_obs(repo, action, state, k)
    if vocab == "claude_code":
        desc = "Run the tests" if action == "TEST" else "Revert the module"
        return "Bash", {"command": cmd, "description": desc}, out + ("" if code == 0 else f"\nExit code {code}")
    if vocab == "codex":
        return "exec_command", {"cmd": cmd}, f"Process exited with code {code}\nOutput:\n{out}"
    if vocab in ("gemini_cli", "qwen_code"):
        return "run_shell_command", {"command": cmd}, f"{out}\nExit Code: {code}"
    if vocab == "opencode":
        return "bash", {"command": cmd, "description": "Run the tests" if action == "TEST" else "Revert"}, out
    return "bash", {"command": cmd}, out


def _edit_call(vocab: str, repo: Repo, action: str, k: int) -> tuple[str, dict[str, Any], str]:
    path, old, new = _edit_strings(repo, action, k)
    abs_path = f"/repo/{path}"
    if vocab == "claude_code":
        args = {"file_path": abs_path, "old_string": old, "new_string": new}
        return "Edit", args, f"The file {abs_path} has been updated."
    if vocab == "codex":
        patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"
        return "apply_patch", {"input": patch}, f"Success. Updated the following files:\nM {path}"
    if vocab in ("gemini_cli", "qwen_code"):
        name = "replace" if vocab == "gemini_cli" else "edit"
        args = {"file_path": abs_path, "old_string": old, "new_string": new}
        return name, args, f"Successfully modified file: {abs_path} (1 replacements)."
    if vocab == "opencode":
        return "edit", {"filePath": abs_path, "oldString": old, "newString": new}, "Edit applied successfully."
    return "edit", {"path": abs_path, "oldText": old, "newText": new}, f"Successfully replaced text in {abs_path}."


def tool_schemas(vocab: str) -> list[dict[str, Any]]:
    """OpenAI tool definitions the harness sends with every request (none for mini-swe-agent)."""

    def fn(name: str, desc: str, props: dict[str, str], required: list[str]) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": desc,
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": t} for p, t in props.items()},
                    "required": required,
                },
            },
        }

    s = "string"
    if vocab == "claude_code":
        return [
            fn("Read", "Read a file.", {"file_path": s}, ["file_path"]),
            fn(
                "Grep",
                "Search file contents.",
                {"pattern": s, "path": s, "output_mode": s, "-n": "boolean"},
                ["pattern"],
            ),
            fn("LS", "List a directory.", {"path": s}, ["path"]),
            fn(
                "Edit",
                "Replace a string in a file.",
                {"file_path": s, "old_string": s, "new_string": s},
                ["file_path"],
            ),
            fn("Bash", "Run a shell command.", {"command": s, "description": s}, ["command"]),
        ]
    if vocab == "codex":
        return [
            fn("exec_command", "Run a command.", {"cmd": s}, ["cmd"]),
            fn("apply_patch", "Apply a patch.", {"input": s}, ["input"]),
        ]
    if vocab in ("gemini_cli", "qwen_code"):
        grep = "search_file_content" if vocab == "gemini_cli" else "grep_search"
        edit = "replace" if vocab == "gemini_cli" else "edit"
        ls_key = "dir_path" if vocab == "gemini_cli" else "path"
        return [
            fn("read_file", "Read a file.", {"absolute_path": s}, ["absolute_path"]),
            fn(grep, "Search file contents.", {"pattern": s}, ["pattern"]),
            fn("list_directory", "List a directory.", {ls_key: s}, [ls_key]),
            fn(edit, "Replace text in a file.", {"file_path": s, "old_string": s, "new_string": s}, ["file_path"]),
            fn("run_shell_command", "Run a shell command.", {"command": s}, ["command"]),
        ]
    if vocab == "opencode":
        return [
            fn("read", "Read a file.", {"filePath": s}, ["filePath"]),
            fn("grep", "Search file contents.", {"pattern": s, "path": s}, ["pattern"]),
            fn("list", "List a directory.", {"path": s}, ["path"]),
            fn("edit", "Edit a file.", {"filePath": s, "oldString": s, "newString": s}, ["filePath"]),
            fn("bash", "Run a shell command.", {"command": s, "description": s}, ["command"]),
        ]
    if vocab == "pi":
        return [
            fn("read", "Read a file.", {"path": s}, ["path"]),
            fn("grep", "Search file contents.", {"pattern": s, "path": s}, ["pattern"]),
            fn("ls", "List a directory.", {"path": s}, ["path"]),
            fn("edit", "Edit a file.", {"path": s, "oldText": s, "newText": s}, ["path"]),
            fn("bash", "Run a shell command.", {"command": s}, ["command"]),
        ]
    return []

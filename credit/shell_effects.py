# SPDX-License-Identifier: Apache-2.0
"""The shell analyser's vocabulary: effect records and which program names mean which effect.

`CommandEffect` is one simple command with its effect (IG reads, AE changes files, RV verifies, EXEC runs a
program, SETUP installs tools, NEUTRAL, SUBMIT); `ShellAnalysis` is a whole command line's result. The tables map
program names to effects, the patterns recognise test files, pytest node ids, file-writing inline code and the
paths a patch names. Used by `shell_lex.py`, `shell_tools.py` and `shell.py`; it decides nothing by itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CommandEffect", "ShellAnalysis", "code_writes_files", "patch_paths"]

IG_COMMANDS = frozenset(
    (
        "ack ag apt-cache basename bat cat cmp colordiff column ctags curl cut date df diff dirname dpkg du "
        "egrep env fd fgrep file git-log grep head hexdump history id jq less ll locate ls lsof man more nl "
        "od printenv ps pwd pydoc pydoc3 readlink realpath rev rg sort stat strings tac tail tr tree type "
        "uname uniq wc wget whereis which whoami xxd yq zcat"
    ).split()
)
AE_COMMANDS = frozenset(
    (
        "apply_patch applypatch chmod chown cp dd install ln mkdir mv patch rm rmdir rsync shred touch truncate unlink"
    ).split()
)
NEUTRAL_COMMANDS = frozenset(
    (
        ". : alias cd clear echo exit export false popd printf pushd read return set shopt sleep source trap "
        "true ulimit umask unset wait"
    ).split()
)
WRAPPERS = {"sudo", "time", "nice", "nohup", "command", "exec", "stdbuf", "builtin", "unbuffer", "timeout", "env"}
RV_COMMANDS = frozenset(
    (
        "ava behave black clippy-driver ctest eslint flake8 golangci-lint hadolint isort jest karma mocha "
        "mypy nosetests nox phpunit prove py.test pycodestyle pyflakes pylint pyright pytest rspec ruff "
        "shellcheck tox trial tsc vitest"
    ).split()
)
INTERPRETERS = frozenset(
    (
        "Rscript bash bun dash deno java julia ksh lua node perl php pypy pypy3 python python2 python3 ruby "
        "sh ts-node tsx zsh"
    ).split()
)
PY_MODULE_RV = frozenset(
    (
        "black compileall doctest flake8 isort mypy nose nose2 py_compile pylint pyright pytest ruff tox unittest"
    ).split()
)
PKG_MANAGERS = {"npm", "yarn", "pnpm", "bun"}
TEST_WORDS = ("test", "tests", "check", "verify", "spec", "lint", "typecheck", "type-check", "vet")

TEST_FILE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test\.\w+|[^/]*\.(?:test|spec)\.\w+|tests?|runtests(?:\.\w+)?)$")
NODE_ID = re.compile(r"^[\w./-]+\.py::[\w:\[\]\-.,]+$")
_PY_WRITE = re.compile(
    r"open\([^)]*,\s*['\"](?:w|a|x|r\+|w\+|a\+|wb|ab)['\"]|\.write_(?:text|bytes)\(|shutil\.(?:copy\w*|move|rmtree)\("
    r"|os\.(?:remove|unlink|rename|replace|makedirs|mkdir|rmdir)\(|\.unlink\(|\.rename\(|\.mkdir\(|\.touch\("
    r"|fs\.(?:writeFileSync|writeFile|appendFileSync|renameSync|unlinkSync|mkdirSync|rmSync)\("
    r"|File\.write\(|IO\.write\(|file_put_contents\("
)
_PATCH_PATH = re.compile(r"^(?:\*\*\* (?:Update|Add|Delete) File: |\+\+\+ (?:b/)?|--- (?:a/)?)(\S+)", re.M)


@dataclass(slots=True)
class CommandEffect:
    """One simple command and its effect."""

    effect: str  # IG | AE | RV | EXEC | SETUP | NEUTRAL | SUBMIT
    argv: list[str]
    reason: str


@dataclass(slots=True)
class ShellAnalysis:
    """Every simple command of a command line, with the paths it touches and the tests it names."""

    command: str
    commands: list[CommandEffect] = field(default_factory=list)
    paths_read: set[str] = field(default_factory=set)
    paths_written: set[str] = field(default_factory=set)
    test_targets: set[str] = field(default_factory=set)
    scoped: bool = False  # an RV command named a target (path, node id, -k expression)

    def effects(self) -> set[str]:
        return {c.effect for c in self.commands}

    def strongest(self, order: Sequence[str]) -> CommandEffect | None:
        """The first command (in `order` of effects) that decides the line, or None for an empty line."""
        for eff in order:
            for c in self.commands:
                if c.effect == eff:
                    return c
        return self.commands[0] if self.commands else None


def code_writes_files(code: str) -> bool:
    """Whether inline program text (python -c, heredoc body) writes, moves or deletes files."""
    return bool(_PY_WRITE.search(code))


def patch_paths(text: str) -> set[str]:
    """Paths named by a unified diff or an apply_patch envelope."""
    out = set()
    for m in _PATCH_PATH.finditer(text):
        p = m.group(1)
        if p != "/dev/null":
            out.add(p)
    return out

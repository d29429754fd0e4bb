# SPDX-License-Identifier: Apache-2.0
"""A small shell-command analyser: what a command line does to the workspace (read, edit, verify, run).

It splits a command line into simple commands (pipelines, `&&`/`||`/`;`/newlines, subshells), lifts heredoc
bodies out first, recurses into `bash -lc '…'` / `sh -c` / `xargs` / `find -exec` / wrappers (`timeout`,
`env`, `sudo`, …), reads redirections (`> file`, `>> file`, `tee file`) and classifies each simple command
as one effect: IG (reads), AE (changes files or the project), RV (runs tests, type checkers, linters,
builds meant as checks), EXEC (runs a program whose purpose the command alone does not show), SETUP
(installs tools into the environment), NEUTRAL (`cd`, `echo` …) or SUBMIT (a harness's submit sentinel).

It also collects the paths read and written and the test targets named, for the causal graph. It does not
execute anything and does not decide a call's final role (`roles.py` does, with observation and position).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CommandEffect", "ShellAnalysis", "analyse_shell", "code_writes_files", "patch_paths"]

SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", "\n", ";;", "|&"}
REDIRECTS = {">", ">>", ">|", "&>", "&>>", "<", "<<<", ">&", "<&", "<>"}

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

_TEST_FILE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test\.\w+|[^/]*\.(?:test|spec)\.\w+|tests?|runtests(?:\.\w+)?)$")
_NODE_ID = re.compile(r"^[\w./-]+\.py::[\w:\[\]\-.,]+$")
_PY_WRITE = re.compile(
    r"open\([^)]*,\s*['\"](?:w|a|x|r\+|w\+|a\+|wb|ab)['\"]|\.write_(?:text|bytes)\(|shutil\.(?:copy\w*|move|rmtree)\("
    r"|os\.(?:remove|unlink|rename|replace|makedirs|mkdir|rmdir)\(|\.unlink\(|\.rename\(|\.mkdir\(|\.touch\("
    r"|fs\.(?:writeFileSync|writeFile|appendFileSync|renameSync|unlinkSync|mkdirSync|rmSync)\("
    r"|File\.write\(|IO\.write\(|file_put_contents\("
)
_PATCH_PATH = re.compile(r"^(?:\*\*\* (?:Update|Add|Delete) File: |\+\+\+ (?:b/)?|--- (?:a/)?)(\S+)", re.M)
_HEREDOC = re.compile(r"<<(-?)[ \t]*(['\"]?)([A-Za-z_][\w.-]*)\2")


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


def _number_heredocs(line: str, first: int) -> str:
    counter = iter(range(first, first + 1000))
    return _HEREDOC.sub(lambda _m: f"<< __HEREDOC_{next(counter)}__", line)


def _lift_heredocs(cmd: str) -> tuple[str, list[str]]:
    """Remove heredoc bodies from `cmd`; each `<<DELIM` becomes `<< __HEREDOC_k__`. Returns (command, bodies)."""
    if "<<" not in cmd:
        return cmd, []
    lines = cmd.split("\n")
    out: list[str] = []
    bodies: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<<" in line:
            out.append(line)
            i += 1
            continue
        pending = [(m.group(3), m.group(1) == "-") for m in _HEREDOC.finditer(line)]
        out.append(_number_heredocs(line, len(bodies)))
        i += 1
        for delim, strip_tabs in pending:
            body: list[str] = []
            while i < len(lines):
                cur = lines[i].lstrip("\t") if strip_tabs else lines[i]
                i += 1
                if cur.strip() == delim:
                    break
                body.append(lines[i - 1])
            bodies.append("\n".join(body))
    return "\n".join(out), bodies


def _tokens(cmd: str) -> list[str]:
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=";&|()<>\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        return list(lex)
    except ValueError:  # unbalanced quotes: fall back to a plain split
        return cmd.replace("\n", " \n ").split(" ")


def _split_commands(tokens: list[str]) -> list[list[str]]:
    cmds: list[list[str]] = []
    cur: list[str] = []
    for t in tokens:
        if t in SEPARATORS:
            if cur:
                cmds.append(cur)
            cur = []
        elif t:
            cur.append(t)
    if cur:
        cmds.append(cur)
    return cmds


class _Analyser:
    def __init__(self, scratch: Sequence[str], sentinels: Sequence[str]):
        self.scratch = tuple(scratch)
        self.sentinels = tuple(sentinels)

    def run(self, command: str, depth: int = 0) -> ShellAnalysis:
        res = ShellAnalysis(command=command)
        if any(s in command for s in self.sentinels):
            res.commands.append(CommandEffect("SUBMIT", [], "submit sentinel"))
        cleaned, bodies = _lift_heredocs(command)
        for argv in _split_commands(_tokens(cleaned)):
            self._simple(argv, bodies, res, depth)
        return res

    def _is_scratch(self, path: str) -> bool:
        return path.startswith(self.scratch) or path.startswith("&") or path in ("-", "/dev/null")

    def _simple(self, argv: list[str], bodies: list[str], res: ShellAnalysis, depth: int) -> None:
        words: list[str] = []
        redirect_out: list[str] = []
        heredoc: str | None = None
        it = iter(range(len(argv)))
        for i in it:
            t = argv[i]
            if t in REDIRECTS or t == "<<":
                target = argv[i + 1] if i + 1 < len(argv) else ""
                next(it, None)
                if words and words[-1].isdigit() and t != "<<":
                    words.pop()  # the fd number of `2>`
                if t == "<<":
                    m = re.fullmatch(r"__HEREDOC_(\d+)__", target)
                    if m and int(m.group(1)) < len(bodies):
                        heredoc = bodies[int(m.group(1))]
                elif t in (">", ">>", ">|", "&>", "&>>", "<>") and target and not target.startswith("&"):
                    redirect_out.append(target)
                elif t == "<" and target:
                    res.paths_read.add(target)
                continue
            words.append(t)
        # leading assignments and wrappers
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], flags=re.S):
            words.pop(0)
        words = self._unwrap(words)
        written = [p for p in redirect_out if not self._is_scratch(p)]
        if written:
            res.paths_written.update(written)
            res.commands.append(CommandEffect("AE", argv, f"redirection > {written[0]}"))
        if not words:
            return
        eff = self._classify(words, heredoc, res, depth)
        if eff is not None:
            res.commands.append(eff)

    @staticmethod
    def _unwrap(words: list[str]) -> list[str]:
        while words:
            head = words[0].rsplit("/", 1)[-1]
            if head not in WRAPPERS:
                break
            words = words[1:]
            if head == "timeout":
                while words and (words[0].startswith("-") or re.fullmatch(r"[\d.]+[smhd]?", words[0])):
                    words = words[1:]
            elif head == "env":
                while words and (words[0].startswith("-") or "=" in words[0]):
                    words = words[1:]
                if not words:
                    return ["env"]
            else:
                while words and words[0].startswith("-"):
                    words = words[1:]
        return words

    def _classify(self, w: list[str], heredoc: str | None, res: ShellAnalysis, depth: int) -> CommandEffect | None:
        prog = w[0].rsplit("/", 1)[-1]
        args = w[1:]
        if prog in ("bash", "sh", "zsh", "dash", "ksh") and depth < 4:
            for i, a in enumerate(args):
                if re.fullmatch(r"-[a-z]*c[a-z]*", a) and i + 1 < len(args):
                    sub = self.run(args[i + 1], depth + 1)
                    self._merge(sub, res)
                    return None
            if heredoc is not None:
                self._merge(self.run(heredoc, depth + 1), res)
                return None
        if prog == "xargs":
            k = 0
            while k < len(args) and args[k].startswith("-"):
                k += 2 if args[k] in ("-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a") else 1
            rest = args[k:]
            return self._classify(rest, None, res, depth) if rest else CommandEffect("IG", w, "xargs")
        if prog in NEUTRAL_COMMANDS:
            return CommandEffect("NEUTRAL", w, prog)
        if prog in ("apply_patch", "applypatch", "patch"):
            text = heredoc or " ".join(args)
            res.paths_written.update(patch_paths(text))
            res.paths_written.update(a for a in args if not a.startswith("-") and "/" in a and "\n" not in a)
            return CommandEffect("AE", w, prog)
        if prog == "git":
            return self._git(w, heredoc, res)
        if prog == "sed":
            return self._sed(w, res)
        if prog in ("awk", "gawk"):
            if any(a in ("-i", "inplace") for a in args) and "inplace" in args:
                self._files(args, res.paths_written)
                return CommandEffect("AE", w, "awk -i inplace")
            self._files(args[1:] if args else [], res.paths_read)
            return CommandEffect("IG", w, prog)
        if prog == "perl":
            if any(re.fullmatch(r"-\w*i\w*", a) for a in args):
                self._files([a for a in args if not a.startswith("-")][1:], res.paths_written)
                return CommandEffect("AE", w, "perl -i")
            if any(re.fullmatch(r"-\w*[np]\w*", a) for a in args):
                return CommandEffect("IG", w, "perl -n")
            return CommandEffect("EXEC", w, "perl")
        if prog == "find":
            return self._find(w, res, depth)
        if prog == "tee":
            files = [a for a in args if not a.startswith("-") and not self._is_scratch(a)]
            if files:
                res.paths_written.update(files)
                return CommandEffect("AE", w, "tee file")
            return CommandEffect("NEUTRAL", w, "tee")
        if prog in ("tar", "unzip", "gunzip", "zip"):
            listing = any(a in ("-t", "-l", "--list") or re.fullmatch(r"-?[a-z]*t[a-z]*", a) for a in args[:1])
            return CommandEffect("IG" if listing else "AE", w, prog)
        if prog in AE_COMMANDS:
            files = [a for a in args if not a.startswith("-")]
            res.paths_written.update(files if prog not in ("cp", "rsync", "ln", "install") else files[-1:])
            if prog in ("cp", "rsync"):
                res.paths_read.update(files[:-1])
            return CommandEffect("AE", w, prog)
        if prog in RV_COMMANDS:
            return self._rv(w, args, res, prog)
        if prog in ("npx", "pnpx", "bunx") and args:
            rest = [a for a in args if not a.startswith("-")]
            return self._classify(rest, heredoc, res, depth) if rest else CommandEffect("EXEC", w, prog)
        if prog in (
            "pip",
            "pip3",
            "conda",
            "mamba",
            "apt",
            "apt-get",
            "brew",
            "yum",
            "dnf",
            "apk",
            "uv",
            "pipx",
            "gem",
        ):
            return self._installer(w, prog, args)
        if prog in PKG_MANAGERS or prog in (
            "poetry",
            "cargo",
            "go",
            "make",
            "gradle",
            "mvn",
            "dotnet",
            "mix",
            "bundle",
            "rake",
            "composer",
            "swift",
            "gradlew",
            "mvnw",
            "cmake",
            "ninja",
            "bazel",
            "sbt",
            "stack",
            "cabal",
        ):
            return self._build_tool(w, prog, args, res, depth)
        if prog in INTERPRETERS or prog.startswith("python"):
            return self._interpreter(w, prog, args, heredoc, res)
        if prog in ("grep", "egrep", "fgrep", "rg") and any(
            a in ("--quiet", "--silent") or re.fullmatch(r"-[a-zA-Z]*q[a-zA-Z]*", a) for a in args
        ):
            return CommandEffect("EXEC", w, f"{prog} -q (an exit-status check)")  # a condition: position decides
        if prog in IG_COMMANDS:
            self._files([a for a in args if not a.startswith("-")], res.paths_read)
            return CommandEffect("IG", w, prog)
        if _TEST_FILE.search(w[0]) or prog in ("runtests", "runtests.py", "runtests.sh"):
            res.test_targets.add(w[0])
            return CommandEffect("RV", w, f"test script {w[0]}")
        if "/" in w[0] or w[0].startswith("."):
            return CommandEffect("EXEC", w, f"runs {w[0]}")
        return CommandEffect("EXEC", w, f"unknown command {prog}")

    @staticmethod
    def _files(args: Sequence[str], into: set[str]) -> None:
        for a in args:
            if not a.startswith("-") and ("/" in a or "." in a) and len(a) < 300 and "\n" not in a:
                into.add(a)

    def _merge(self, sub: ShellAnalysis, res: ShellAnalysis) -> None:
        res.commands.extend(sub.commands)
        res.paths_read |= sub.paths_read
        res.paths_written |= sub.paths_written
        res.test_targets |= sub.test_targets
        res.scoped = res.scoped or sub.scoped

    def _git(self, w: list[str], heredoc: str | None, res: ShellAnalysis) -> CommandEffect:
        args = w[1:]
        i = 0
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] in ("-C", "-c") else 1
        sub = args[i] if i < len(args) else ""
        rest = args[i + 1 :]
        read = {
            "diff",
            "log",
            "show",
            "status",
            "blame",
            "grep",
            "ls-files",
            "rev-parse",
            "describe",
            "shortlog",
            "reflog",
            "ls-tree",
            "cat-file",
            "whatchanged",
            "rev-list",
            "remote",
            "config",
            "help",
            "version",
            "fetch",
            "bisect",
        }
        if sub == "stash" and rest[:1] in (["list"], ["show"]):
            return CommandEffect("IG", w, f"git stash {rest[0]}")
        if sub == "stash" and rest[:1] in ([], ["push"], ["save"], ["pop"], ["apply"]):
            return CommandEffect("STASH", w, f"git stash {' '.join(rest[:1])}".strip())
        if sub == "branch" and not [a for a in rest if not a.startswith("-")]:
            return CommandEffect("IG", w, "git branch")
        if sub == "tag" and (not rest or rest[0] in ("-l", "--list")):
            return CommandEffect("IG", w, "git tag")
        if sub in read:
            self._files([a for a in rest if not a.startswith("-")], res.paths_read)
            return CommandEffect("IG", w, f"git {sub}")
        if sub == "apply":
            if any(a in ("--check", "--stat", "--numstat", "--summary") for a in rest):
                return CommandEffect("IG", w, "git apply --check")
            res.paths_written.update(patch_paths(heredoc or ""))
        if sub in ("checkout", "restore", "rm", "mv", "add"):
            self._files([a for a in rest if not a.startswith("-")], res.paths_written)
        return CommandEffect("AE", w, f"git {sub}".strip())

    def _sed(self, w: list[str], res: ShellAnalysis) -> CommandEffect:
        args = w[1:]
        inplace = any(
            a == "--in-place" or a.startswith("--in-place=") or re.fullmatch(r"-[a-zA-Z]*i\S*", a) for a in args
        )
        plain = [a for a in args if not a.startswith("-")]
        has_e = any(a in ("-e", "--expression") or re.fullmatch(r"-[a-zA-Z]*e", a) for a in args)
        files = plain if has_e else plain[1:]
        if inplace:
            self._files(files, res.paths_written)
            return CommandEffect("AE", w, "sed -i")
        self._files(files, res.paths_read)
        return CommandEffect("IG", w, "sed (stdout)")

    def _find(self, w: list[str], res: ShellAnalysis, depth: int) -> CommandEffect:
        args = w[1:]
        if "-delete" in args:
            return CommandEffect("AE", w, "find -delete")
        for flag in ("-exec", "-execdir", "-ok", "-okdir"):
            if flag in args:
                k = args.index(flag)
                inner = [a for a in args[k + 1 :] if a not in ("{}", "+", ";", "\\;")]
                if inner:
                    sub = self._classify(inner, None, ShellAnalysis(command=" ".join(inner)), depth + 1)
                    if sub is not None and sub.effect == "AE":
                        return CommandEffect("AE", w, f"find {flag} {inner[0]}")
        return CommandEffect("IG", w, "find")

    def _rv(self, w: list[str], args: list[str], res: ShellAnalysis, prog: str) -> CommandEffect:
        if prog in ("pytest", "py.test") and any(a in ("--collect-only", "--co") for a in args):
            return CommandEffect("IG", w, "pytest --collect-only")
        if prog in ("black", "isort", "ruff") and not any(a in ("--check", "--diff", "check") for a in args):
            if prog == "ruff" and args[:1] == ["check"] and "--fix" not in args:
                pass
            elif prog != "ruff" or "format" in args or "--fix" in args:
                return CommandEffect("AE", w, f"{prog} rewrites files")
        self._test_targets(args, res)
        return CommandEffect("RV", w, prog)

    def _test_targets(self, args: Sequence[str], res: ShellAnalysis) -> None:
        skip_next = False
        for a in args:
            if skip_next:
                res.test_targets.add(a)
                res.scoped = True
                skip_next = False
                continue
            if a in ("-k", "-m", "-run", "--run", "-t", "--testNamePattern", "-p", "--package", "-e"):
                skip_next = a not in ("-e", "-p", "--package")
                if a in ("-p", "--package"):
                    res.scoped = True
                continue
            if a.startswith("-"):
                continue
            if _NODE_ID.match(a) or "/" in a or a.endswith((".py", ".js", ".ts", ".go", ".rs", ".rb")) or "::" in a:
                res.test_targets.add(a)
                res.paths_read.add(a.split("::", 1)[0])
                res.scoped = True
            elif re.fullmatch(r"[\w.]+", a) and "." in a:  # unittest dotted module
                res.test_targets.add(a)
                res.scoped = True

    @staticmethod
    def _installer(w: list[str], prog: str, args: list[str]) -> CommandEffect:
        sub = [a for a in args if not a.startswith("-")]
        if prog == "pip" or prog == "pip3" or prog == "uv":
            if sub[:1] in (["list"], ["show"], ["freeze"], ["check"], ["index"]) or sub[:2] == ["pip", "list"]:
                return CommandEffect("IG", w, f"{prog} {sub[0] if sub else ''}".strip())
        if sub[:1] in (["install"], ["add"], ["sync"]) or (sub[:2] == ["pip", "install"]):
            return CommandEffect("SETUP", w, f"{prog} install")
        if sub[:1] in (["search"], ["info"], ["list"], ["show"]):
            return CommandEffect("IG", w, f"{prog} {sub[0]}")
        return CommandEffect("SETUP", w, prog)

    def _build_tool(self, w: list[str], prog: str, args: list[str], res: ShellAnalysis, depth: int) -> CommandEffect:
        sub = [a for a in args if not a.startswith("-")]
        first = sub[0] if sub else ""
        if prog in PKG_MANAGERS:
            if first in ("test", "t") or (first == "run" and len(sub) > 1 and sub[1].startswith(TEST_WORDS)):
                self._test_targets(sub[1:], res)
                return CommandEffect("RV", w, f"{prog} test")
            if first in ("install", "i", "add", "remove", "uninstall", "rm", "ci"):
                if len(sub) > 1 and first != "ci":
                    return CommandEffect("AE", w, f"{prog} {first} <package> (changes the manifest)")
                return CommandEffect("SETUP", w, f"{prog} {first}")
            if first in ("ls", "list", "view", "info", "why", "outdated", "audit"):
                return CommandEffect("IG", w, f"{prog} {first}")
            if first in ("exec", "dlx", "x") and len(sub) > 1:
                return self._classify(sub[1:], None, res, depth) or CommandEffect("EXEC", w, prog)
            return CommandEffect("EXEC", w, f"{prog} {first}".strip())
        if prog in ("make", "gradle", "gradlew", "mvn", "mvnw", "rake", "bazel", "ninja", "sbt"):
            if prog == "make" and any(a in ("-n", "--dry-run", "--just-print", "--recon") for a in args):
                return CommandEffect("IG", w, "make -n (prints the commands)")
            if any(t.startswith(TEST_WORDS) or t in ("verify", "integration", "ci") for t in sub):
                return CommandEffect("RV", w, f"{prog} {first}")
            if first in ("install", "clean", "dist", "deploy"):
                return CommandEffect("SETUP", w, f"{prog} {first}")
            return CommandEffect("EXEC", w, f"{prog} {first}".strip())
        if prog == "go":
            if first in ("test", "vet", "build"):
                self._test_targets(sub[1:], res)
                return CommandEffect("RV", w, f"go {first}")
            if first in ("get", "mod"):
                return CommandEffect("AE", w, f"go {first}")
            if first in ("doc", "list", "env", "version"):
                return CommandEffect("IG", w, f"go {first}")
            if first == "fmt":
                return CommandEffect("AE", w, "go fmt")
            return CommandEffect("EXEC", w, f"go {first}")
        if prog == "cargo":
            if first in ("test", "check", "clippy", "build", "nextest", "bench"):
                self._test_targets(sub[1:], res)
                return CommandEffect("RV", w, f"cargo {first}")
            if first in ("add", "remove", "fmt", "update", "fix"):
                return CommandEffect("AE", w, f"cargo {first}")
            if first in ("tree", "metadata", "search", "doc"):
                return CommandEffect("IG", w, f"cargo {first}")
            return CommandEffect("EXEC", w, f"cargo {first}")
        if prog in ("poetry", "composer", "mix", "bundle", "dotnet", "swift", "stack", "cabal"):
            if first in ("test",) or (first in ("run", "exec") and len(sub) > 1):
                if first == "test":
                    return CommandEffect("RV", w, f"{prog} test")
                return self._classify(sub[1:], None, res, depth) or CommandEffect("EXEC", w, prog)
            if first in ("add", "remove", "require"):
                return CommandEffect("AE", w, f"{prog} {first}")
            if first in ("install", "restore", "get"):
                return CommandEffect("SETUP", w, f"{prog} {first}")
            if first in ("build",):
                return CommandEffect("RV", w, f"{prog} build")
            return CommandEffect("EXEC", w, f"{prog} {first}".strip())
        return CommandEffect("EXEC", w, prog)

    def _interpreter(
        self, w: list[str], prog: str, args: list[str], heredoc: str | None, res: ShellAnalysis
    ) -> CommandEffect:
        if prog.startswith("python") or prog.startswith("pypy"):
            if "-m" in args:
                k = args.index("-m")
                mod = args[k + 1] if k + 1 < len(args) else ""
                rest = args[k + 2 :]
                if mod in PY_MODULE_RV:
                    if mod == "pytest" and any(a in ("--collect-only", "--co") for a in rest):
                        return CommandEffect("IG", w, "pytest --collect-only")
                    self._test_targets(rest, res)
                    return CommandEffect("RV", w, f"python -m {mod}")
                if mod == "pip":
                    return self._installer(w, "pip", rest)
                if mod in ("json.tool", "pydoc", "site", "tokenize", "pdb", "inspect"):
                    return CommandEffect("IG", w, f"python -m {mod}")
                return CommandEffect("EXEC", w, f"python -m {mod}")
            if any(a in ("--version", "-V") for a in args):
                return CommandEffect("IG", w, "python --version")
        code = None
        if "-c" in args or "-e" in args:
            flag = "-c" if "-c" in args else "-e"
            k = args.index(flag)
            code = args[k + 1] if k + 1 < len(args) else ""
        elif heredoc is not None and (not args or args[0] == "-"):
            code = heredoc
        if code is not None:
            if code_writes_files(code):
                return CommandEffect("AE", w, f"{prog} inline code writes files")
            return CommandEffect("EXEC", w, f"{prog} inline code")
        script = next((a for a in args if not a.startswith("-")), "")
        if script in ("setup.py",) and len(args) > 1:
            act = args[args.index(script) + 1] if args.index(script) + 1 < len(args) else ""
            if act == "test":
                return CommandEffect("RV", w, "setup.py test")
            return CommandEffect("SETUP", w, f"setup.py {act}")
        if script.endswith("manage.py") and "test" in args:
            return CommandEffect("RV", w, "manage.py test")
        if script and _TEST_FILE.search(script):
            res.test_targets.add(script)
            res.paths_read.add(script)
            res.scoped = True
            return CommandEffect("RV", w, f"{prog} runs test script {script}")
        if script:
            res.paths_read.add(script)
            return CommandEffect("EXEC", w, f"{prog} {script}")
        return CommandEffect("EXEC", w, prog)


def analyse_shell(
    command: str,
    *,
    scratch_prefixes: Sequence[str] = ("/tmp/", "/dev/", "/var/tmp/"),
    submit_sentinels: Sequence[str] = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",),
) -> ShellAnalysis:
    """Analyse one command line (see the module docstring). A `git stash` … `git stash pop` pair is neutral."""
    res = _Analyser(scratch_prefixes, submit_sentinels).run(command)
    stash = [c for c in res.commands if c.effect == "STASH"]
    pops = any(c.reason.endswith(("pop", "apply")) for c in stash)
    pushes = any(not c.reason.endswith(("pop", "apply")) for c in stash)
    for c in stash:
        c.effect = "NEUTRAL" if (pops and pushes) else "AE"
    return res

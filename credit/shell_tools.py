# SPDX-License-Identifier: Apache-2.0
"""Per-tool rules of the shell analyser: git, sed, find, test runners, installers, build tools, interpreters.

`ToolRules` is a mixin of `shell._Analyser`: each method reads one family of programs' arguments and returns the
command's effect, recording the paths read and written and the test targets named. Rules that hand a sub-command
back (`npm exec …`, `poetry run …`, `find -exec …`) call the analyser's `_classify`, which `shell.py` defines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .shell_effects import (
    NODE_ID,
    PKG_MANAGERS,
    PY_MODULE_RV,
    TEST_FILE,
    TEST_WORDS,
    CommandEffect,
    ShellAnalysis,
    code_writes_files,
    patch_paths,
)

__all__ = ["ToolRules"]


class ToolRules:
    """The per-program rules; the subclass supplies `_classify` (the dispatch on the program name)."""

    def _classify(self, w: list[str], heredoc: str | None, res: ShellAnalysis, depth: int) -> CommandEffect | None:
        raise NotImplementedError

    @staticmethod
    def _files(args: Sequence[str], into: set[str]) -> None:
        for a in args:
            if not a.startswith("-") and ("/" in a or "." in a) and len(a) < 300 and "\n" not in a:
                into.add(a)

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
            if NODE_ID.match(a) or "/" in a or a.endswith((".py", ".js", ".ts", ".go", ".rs", ".rb")) or "::" in a:
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
        if script and TEST_FILE.search(script):
            res.test_targets.add(script)
            res.paths_read.add(script)
            res.scoped = True
            return CommandEffect("RV", w, f"{prog} runs test script {script}")
        if script:
            res.paths_read.add(script)
            return CommandEffect("EXEC", w, f"{prog} {script}")
        return CommandEffect("EXEC", w, prog)

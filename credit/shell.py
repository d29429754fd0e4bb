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
from collections.abc import Sequence

from .shell_effects import (
    AE_COMMANDS,
    IG_COMMANDS,
    INTERPRETERS,
    NEUTRAL_COMMANDS,
    PKG_MANAGERS,
    RV_COMMANDS,
    TEST_FILE,
    WRAPPERS,
    CommandEffect,
    ShellAnalysis,
    code_writes_files,
    patch_paths,
)
from .shell_lex import REDIRECTS, lift_heredocs, split_commands, tokens
from .shell_tools import ToolRules

__all__ = ["CommandEffect", "ShellAnalysis", "analyse_shell", "code_writes_files", "patch_paths"]


class _Analyser(ToolRules):
    def __init__(self, scratch: Sequence[str], sentinels: Sequence[str]):
        self.scratch = tuple(scratch)
        self.sentinels = tuple(sentinels)

    def run(self, command: str, depth: int = 0) -> ShellAnalysis:
        res = ShellAnalysis(command=command)
        if any(s in command for s in self.sentinels):
            res.commands.append(CommandEffect("SUBMIT", [], "submit sentinel"))
        cleaned, bodies = lift_heredocs(command)
        for argv in split_commands(tokens(cleaned)):
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
        if TEST_FILE.search(w[0]) or prog in ("runtests", "runtests.py", "runtests.sh"):
            res.test_targets.add(w[0])
            return CommandEffect("RV", w, f"test script {w[0]}")
        if "/" in w[0] or w[0].startswith("."):
            return CommandEffect("EXEC", w, f"runs {w[0]}")
        return CommandEffect("EXEC", w, f"unknown command {prog}")

    def _merge(self, sub: ShellAnalysis, res: ShellAnalysis) -> None:
        res.commands.extend(sub.commands)
        res.paths_read |= sub.paths_read
        res.paths_written |= sub.paths_written
        res.test_targets |= sub.test_targets
        res.scoped = res.scoped or sub.scoped


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

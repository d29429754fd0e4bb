# SPDX-License-Identifier: Apache-2.0
"""Lexing a shell command line: heredoc bodies lifted out, tokens, and the split into simple commands.

`lift_heredocs` replaces each `<<DELIM` … `DELIM` body by a numbered placeholder (`<< __HEREDOC_k__`) and returns the
bodies; `tokens` splits with shell quoting (falling back to a plain split on unbalanced quotes); `split_commands`
cuts the tokens at `&&`, `||`, `;`, pipes, subshell parentheses and newlines. Nothing here classifies a command.
"""

from __future__ import annotations

import re
import shlex

__all__ = ["REDIRECTS", "SEPARATORS", "lift_heredocs", "split_commands", "tokens"]

SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", "\n", ";;", "|&"}
REDIRECTS = {">", ">>", ">|", "&>", "&>>", "<", "<<<", ">&", "<&", "<>"}
_HEREDOC = re.compile(r"<<(-?)[ \t]*(['\"]?)([A-Za-z_][\w.-]*)\2")


def _number_heredocs(line: str, first: int) -> str:
    counter = iter(range(first, first + 1000))
    return _HEREDOC.sub(lambda _m: f"<< __HEREDOC_{next(counter)}__", line)


def lift_heredocs(cmd: str) -> tuple[str, list[str]]:
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


def tokens(cmd: str) -> list[str]:
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=";&|()<>\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        return list(lex)
    except ValueError:  # unbalanced quotes: fall back to a plain split
        return cmd.replace("\n", " \n ").split(" ")


def split_commands(tokens: list[str]) -> list[list[str]]:
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

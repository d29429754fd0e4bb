# SPDX-License-Identifier: Apache-2.0
"""The forced plans of `capture_role_calls.py`, one per harness, each step with its HAND label.

A step is `(kind, payload, label, ambiguous, reason)`:
- kind `sh`: payload is a shell command (the adapter's shell tool; relative paths, the CLI's cwd is the workdir);
- kind `edit`: payload `(path, old, new)` through the adapter's own edit tool; `write`: `(path, content)`;
- kind `tool`: payload `(native tool name, arguments)` — `{W}` in any string becomes the session's workdir;
- kind `text`: a final text answer (mini-swe-agent ends with its submit command instead).

Labels follow docs/call_credit.md: IG reads, searches, inspects (including running code to learn something before the fix it
informs); AE changes files or the project (edits, writes, deletes, reverts, git history); RV runs tests, builds,
lints, or the program to check a change; OTHER plans, sets up the environment, waits, answers. They were written
with the plans, by meaning, before any rule was run on them. `ambiguous` marks calls whose role depends on intent
or on context the call itself does not show.
"""

from __future__ import annotations

from typing import Any

Step = tuple[str, Any, str, bool, str]

FIX = ('re.split(r"\\s+", title.lower())', "title.lower().split()")
FIX_LINE = (
    '    words = re.split(r"\\s+", title.lower())',
    "    words = title.lower().split()",
)  # apply_patch: whole lines
TEST_CLI = (
    "import subprocess\nimport sys\n\n\ndef test_cli_strips():\n"
    "    out = subprocess.run([sys.executable, '-m', 'app.cli'], input='  A B \\n', capture_output=True, text=True)\n"
    "    assert out.stdout.strip() == 'a-b'\n"
)
TEST_CONFIG = "from app.config import DEFAULTS\n\n\ndef test_defaults():\n    assert DEFAULTS['sep'] == '-'\n"
TEST_SHORTEN = "from app.slug import shorten\n\n\ndef test_short_input():\n    assert shorten('abc') == 'abc'\n"
NORMALIZE = "def normalize(s):\n    return ' '.join(s.split())\n"
BENCH = (
    "import timeit\n\nfrom app.slug import slugify\n\nprint(timeit.timeit(lambda: slugify('a b c'), number=1000))\n"
)


def _end(text: str = "Done: slugify now ignores surrounding whitespace and the tests pass.") -> Step:
    return ("text", text, "OTHER", False, "final text answer, no tool call")


CLAUDE_CODE: list[Step] = [
    ("sh", "git status", "IG", False, "inspects the working tree state"),
    ("sh", "ls -la app tests", "IG", False, "lists directories"),
    ("tool", ("Read", {"file_path": "{W}/app/slug.py"}), "IG", False, "reads a source file"),
    ("sh", 'grep -rn "slugify" --include=*.py .', "IG", False, "searches the code"),
    ("sh", "git log --oneline -5", "IG", False, "reads history"),
    ("sh", "python3 scripts/reproduce.py", "IG", True, "runs a reproduction before any edit to see the bug"),
    (
        "tool",
        ("TaskCreate", {"subject": "Fix slugify whitespace", "description": "Strip input", "activeForm": "Fixing"}),
        "OTHER",
        False,
        "task bookkeeping",
    ),
    ("edit", ("app/slug.py", *FIX), "AE", False, "edits the source with the Edit tool"),
    ("sh", "python3 -m pytest -q tests/test_slug.py", "RV", False, "runs the tests after the fix"),
    ("tool", ("Read", {"file_path": "{W}/tests/test_slug.py"}), "IG", False, "reads the tests"),
    ("write", ("tests/test_cli.py", TEST_CLI), "AE", False, "writes a new test file"),
    ("sh", "cd tests && python3 -m pytest -q test_cli.py", "RV", False, "chained cd && pytest: runs tests"),
    (
        "sh",
        "python3 -c \"from app.slug import slugify; print(slugify('  A  B '))\"",
        "RV",
        True,
        "python -c exercising the fixed function after the edit",
    ),
    ("sh", "sed -n '1,20p' app/cli.py", "IG", False, "sed -n prints a file range"),
    ("sh", 'sed -i \'s/"max_len": 20/"max_len": 40/\' app/config.py', "AE", False, "sed -i edits in place"),
    ("sh", "git diff --stat", "IG", False, "inspects the diff"),
    (
        "sh",
        "cat > docs/USAGE.md <<'EOF'\n# Usage\n\n    echo 'Hello World' | python3 -m app.cli\nEOF",
        "AE",
        False,
        "heredoc writes a project file",
    ),
    ("sh", "echo 'Hello World' | python3 -m app.cli", "RV", True, "runs the program after the edits to check it"),
    ("sh", "make test", "RV", False, "make test runs the suite"),
    (
        "sh",
        "git add -A && git commit -qm 'Fix slugify whitespace'",
        "AE",
        True,
        "records the change in git history; no working-tree edit",
    ),
    (
        "tool",
        ("WebFetch", {"url": "https://docs.python.org/3/library/stdtypes.html", "prompt": "What does str.split do?"}),
        "IG",
        False,
        "fetches documentation",
    ),
    ("tool", ("TaskUpdate", {"taskId": "1", "status": "completed"}), "OTHER", False, "task bookkeeping"),
    (
        "sh",
        "find . -name '__pycache__' -type d -prune -exec rm -rf {} +",
        "AE",
        False,
        "find with rm deletes files from the workspace",
    ),
    ("sh", "git log -1 --stat", "IG", False, "reads the last commit"),
    _end(),
]

CODEX: list[Step] = [
    ("sh", "rg --files", "IG", False, "lists files"),
    ("sh", 'rg -n "def slugify" -S .', "IG", False, "searches the code"),
    ("sh", "nl -ba app/slug.py | sed -n '1,40p'", "IG", False, "prints a numbered file range"),
    ("sh", "cat tests/test_slug.py", "IG", False, "reads the tests"),
    ("sh", "python3 -m pytest -q", "RV", True, "baseline test run before any edit (verifies the current state)"),
    ("sh", "git diff", "IG", False, "inspects the uncommitted diff"),
    ("edit", ("app/slug.py", *FIX_LINE), "AE", False, "apply_patch edits the source"),
    ("sh", "python3 -m pytest -q tests/test_slug.py::test_strip", "RV", False, "runs the target test after the fix"),
    (
        "sh",
        "python3 - <<'PY'\nfrom app.slug import slugify\nfor t in ['a b', '  a  b ', '']:\n    print(repr(slugify(t)))\nPY",
        "RV",
        True,
        "python heredoc exercising the fixed function after the edit",
    ),
    ("write", ("tests/test_shorten.py", TEST_SHORTEN), "AE", False, "apply_patch adds a test file"),
    ("sh", "python3 -m pytest -q -k shorten", "RV", False, "runs tests"),
    ("sh", "git status --short", "IG", False, "inspects the working tree"),
    ("sh", "wc -l app/*.py", "IG", False, "counts lines"),
    ("sh", "python3 -m pyflakes app || true", "RV", False, "lints the package"),
    ("sh", "perl -0pi -e 's/n=20/n=40/' app/slug.py", "AE", False, "perl -pi edits in place"),
    ("sh", "head -n 5 docs/CHANGES.md", "IG", False, "reads a file head"),
    (
        "sh",
        "printf -- '- slugify ignores surrounding whitespace\\n' >> docs/CHANGES.md",
        "AE",
        False,
        "appends to a project file",
    ),
    (
        "sh",
        "git stash && python3 -m pytest -q; git stash pop",
        "RV",
        True,
        "runs the tests without the change, then restores it",
    ),
    ("sh", "npm test", "RV", False, "npm test runs the JS tests"),
    ("sh", "tail -n 3 web/test.js", "IG", False, "reads a file tail"),
    ("sh", "make test 2>&1 | tail -5", "RV", False, "make test piped to tail"),
    ("sh", "git show --stat HEAD", "IG", False, "reads a commit"),
    ("sh", "rm -rf dist build", "AE", True, "deletes build outputs (workspace change, not source)"),
    ("sh", "python3 -m app.cli < README.md | head -3", "RV", True, "runs the program after the edits"),
    _end(),
]

GEMINI_CLI: list[Step] = [
    ("tool", ("list_directory", {"dir_path": "{W}"}), "IG", False, "lists a directory"),
    ("tool", ("glob", {"pattern": "**/*.py"}), "IG", False, "finds files"),
    ("tool", ("grep_search", {"pattern": "slugify", "dir_path": "{W}"}), "IG", False, "searches the code"),
    ("tool", ("read_file", {"file_path": "{W}/app/slug.py"}), "IG", False, "reads a source file"),
    (
        "tool",
        ("read_file", {"file_path": "{W}/tests/test_slug.py", "start_line": 1, "end_line": 12}),
        "IG",
        False,
        "reads part of the tests",
    ),
    ("sh", "python3 -m pytest -q tests/test_slug.py -x", "RV", True, "baseline test run before any edit"),
    ("edit", ("app/slug.py", *FIX), "AE", False, "replace edits the source"),
    ("sh", "python3 -m pytest -q tests/test_slug.py", "RV", False, "runs the tests after the fix"),
    ("write", ("tests/test_config.py", TEST_CONFIG), "AE", False, "writes a new test file"),
    ("sh", "python3 -m pytest tests/test_config.py -q", "RV", False, "runs the new test"),
    ("sh", "git diff app/slug.py", "IG", False, "inspects the diff of a file"),
    ("sh", "python3 -m pip list 2>/dev/null | grep -i pytest", "IG", False, "inspects installed packages"),
    ("sh", "pip install -r requirements.txt", "OTHER", True, "environment set-up, no project change"),
    (
        "sh",
        "node -e \"console.log(require('./web/slug').slug(' A B '))\"",
        "IG",
        True,
        "probes the JS behaviour before fixing the JS file (an edit to another file came earlier)",
    ),
    ("edit", ("web/slug.js", "s.toLowerCase()", "s.trim().toLowerCase()"), "AE", False, "replace edits the JS"),
    ("sh", "npm test", "RV", False, "npm test runs the JS tests"),
    ("sh", "npm run build", "RV", True, "builds after the edits (also writes dist/)"),
    ("sh", "ls dist", "IG", False, "lists a directory"),
    (
        "tool",
        ("google_web_search", {"query": "python str.split without arguments whitespace"}),
        "IG",
        False,
        "web search",
    ),
    ("sh", "sed -n '/def shorten/,$p' app/slug.py", "IG", False, "sed -n prints a range"),
    ("sh", "git stash list", "IG", False, "lists stashes"),
    ("sh", "echo 'sep = \"-\"' | tee app/settings.ini", "AE", False, "tee writes a project file"),
    ("sh", "python3 -m compileall -q app && echo ok", "RV", False, "byte-compiles the package to check it"),
    ("sh", "git checkout -- app/config.py", "AE", False, "reverts a file"),
    _end(),
]

QWEN_CODE: list[Step] = [
    ("tool", ("list_directory", {"path": "{W}"}), "IG", False, "lists a directory"),
    ("tool", ("read_file", {"file_path": "{W}/README.md"}), "IG", False, "reads the README"),
    ("tool", ("glob", {"pattern": "tests/**/*.py"}), "IG", False, "finds files"),
    ("tool", ("grep_search", {"pattern": "def ", "path": "{W}/app"}), "IG", False, "searches the code"),
    ("tool", ("read_file", {"file_path": "{W}/app/slug.py"}), "IG", False, "reads a source file"),
    (
        "tool",
        ("todo_write", {"todos": [{"id": "1", "content": "Fix slugify", "status": "in_progress"}]}),
        "OTHER",
        False,
        "todo bookkeeping",
    ),
    ("sh", "python3 scripts/reproduce.py", "IG", True, "runs a reproduction before any edit"),
    ("edit", ("app/slug.py", *FIX), "AE", False, "edit tool changes the source"),
    ("sh", "python3 scripts/reproduce.py", "RV", True, "re-runs the reproduction after the fix"),
    ("sh", "python3 -m pytest -q --tb=short", "RV", False, "runs the suite"),
    ("sh", "python3 -m pytest --co -q", "IG", True, "collect-only lists tests without running them"),
    ("write", ("scripts/bench.py", BENCH), "AE", False, "writes a new script"),
    ("sh", "python3 -m py_compile scripts/bench.py", "RV", False, "checks the new script compiles"),
    ("sh", "git diff --name-only", "IG", False, "inspects changed files"),
    (
        "sh",
        "sed -i 's/^- first release$/- first release\\n- whitespace fix/' docs/CHANGES.md",
        "AE",
        False,
        "sed -i edits in place",
    ),
    ("sh", 'grep -c "" app/*.py', "IG", False, "counts lines per file"),
    ("sh", "cd web && npm test", "RV", False, "chained cd && npm test"),
    ("sh", "mkdir -p tests/fixtures && cp README.md tests/fixtures/", "AE", False, "creates files in the project"),
    ("sh", "git add app/slug.py", "AE", True, "stages a change (git index), no file content change"),
    ("sh", 'git commit -m "slugify: ignore surrounding whitespace"', "AE", True, "records the change in history"),
    ("sh", "git log --oneline | head -3", "IG", False, "reads history"),
    (
        "tool",
        (
            "web_fetch",
            {"url": "https://docs.pytest.org/en/stable/how-to/usage.html", "prompt": "How to select tests?"},
        ),
        "IG",
        False,
        "fetches documentation",
    ),
    (
        "sh",
        'python3 -c "import app.config as c; print(c.DEFAULTS)"',
        "IG",
        True,
        "python -c printing config values (reads, does not check an edit)",
    ),
    (
        "tool",
        ("todo_write", {"todos": [{"id": "1", "content": "Fix slugify", "status": "completed"}]}),
        "OTHER",
        False,
        "todo bookkeeping",
    ),
    _end(),
]

OPENCODE: list[Step] = [
    ("tool", ("glob", {"pattern": "**/*.py", "path": "{W}"}), "IG", False, "finds files"),
    ("tool", ("grep", {"pattern": "slugify", "include": "*.py"}), "IG", False, "searches the code"),
    ("tool", ("read", {"filePath": "{W}/app/slug.py"}), "IG", False, "reads a source file"),
    ("tool", ("read", {"filePath": "{W}/tests/test_slug.py"}), "IG", False, "reads the tests"),
    ("sh", "python3 -m pytest tests/test_slug.py -q 2>&1 | tail -15", "RV", True, "baseline test run before any edit"),
    (
        "tool",
        ("todowrite", {"todos": [{"id": "1", "content": "fix slugify", "status": "in_progress", "priority": "high"}]}),
        "OTHER",
        False,
        "todo bookkeeping",
    ),
    ("edit", ("app/slug.py", *FIX), "AE", False, "edit tool changes the source"),
    ("sh", "python3 -m pytest tests/test_slug.py -q", "RV", False, "runs the tests after the fix"),
    ("tool", ("read", {"filePath": "{W}/app/cli.py"}), "IG", False, "reads a source file"),
    ("edit", ("app/cli.py", "print(slugify(line))", "print(slugify(line.rstrip()))"), "AE", False, "edits the CLI"),
    ("sh", "printf 'Hello World\\n  Foo Bar \\n' | python3 -m app.cli", "RV", True, "runs the program after the edit"),
    ("write", ("tests/test_cli.py", TEST_CLI), "AE", False, "writes a new test file"),
    ("sh", "python3 -m pytest -q tests/ -x && echo ALL_OK", "RV", False, "runs the suite"),
    ("sh", "git diff", "IG", False, "inspects the diff"),
    ("sh", "git status --porcelain", "IG", False, "inspects the working tree"),
    ("sh", "cat package.json | jq .scripts", "IG", False, "reads package scripts"),
    ("sh", "npm test --silent", "RV", False, "npm test"),
    ("sh", "npm install", "OTHER", True, "installs declared dependencies (environment set-up)"),
    ("sh", "find . -name '*.log' -delete", "AE", False, "find -delete removes files"),
    ("sh", "ls -R web", "IG", False, "lists a directory tree"),
    ("sh", "sed -n '1,5p' Makefile", "IG", False, "sed -n prints a range"),
    ("sh", "make lint", "RV", False, "runs the linter through make"),
    (
        "tool",
        ("webfetch", {"url": "https://docs.python.org/3/library/re.html", "format": "markdown"}),
        "IG",
        False,
        "fetches documentation",
    ),
    ("sh", "curl -sS http://127.0.0.1:8000/health || true", "IG", True, "probes a local service"),
    _end(),
]

PI: list[Step] = [
    ("sh", "ls -la", "IG", False, "lists the directory"),
    ("sh", "find . -name '*.py' -not -path './.git/*'", "IG", False, "finds files"),
    ("tool", ("read", {"path": "{W}/app/slug.py"}), "IG", False, "reads a source file"),
    ("tool", ("read", {"path": "{W}/tests/test_slug.py", "offset": 1, "limit": 20}), "IG", False, "reads the tests"),
    ("sh", 'grep -rn "re.split" app', "IG", False, "searches the code"),
    ("sh", "python3 -m pytest -q tests/test_slug.py::test_strip", "RV", True, "baseline test run before any edit"),
    ("edit", ("app/slug.py", *FIX), "AE", False, "edit tool changes the source"),
    ("sh", "python3 -m pytest -q", "RV", False, "runs the suite after the fix"),
    ("sh", "git diff --color=never", "IG", False, "inspects the diff"),
    ("write", ("app/normalize.py", NORMALIZE), "AE", False, "writes a new module"),
    (
        "edit",
        ("README.md", "Turn titles into URL slugs.", "Turn titles into URL slugs (whitespace-safe)."),
        "AE",
        False,
        "edits the README",
    ),
    ("sh", 'python3 -c "import app.normalize"', "RV", True, "checks the new module imports"),
    ("sh", "cat requirements.txt", "IG", False, "reads a file"),
    ("sh", "pip install --user pyflakes", "OTHER", True, "installs a tool into the environment"),
    ("sh", "python3 -m pyflakes app", "RV", False, "lints the package"),
    ("sh", "tail -n 20 docs/CHANGES.md", "IG", False, "reads a file tail"),
    ("sh", "cat >> docs/CHANGES.md <<'EOF'\n- normalize module\nEOF", "AE", False, "heredoc appends to a file"),
    ("sh", "tee web/VERSION <<< '0.1.1'", "AE", False, "tee writes a project file"),
    ("sh", "node web/test.js", "RV", False, "runs the JS test file"),
    ("sh", "git log --format='%h %s' -3", "IG", False, "reads history"),
    ("sh", "make test && git status --short", "RV", False, "runs the tests, then shows the tree"),
    ("sh", "rm app/normalize.py && git status --short", "AE", False, "deletes a file"),
    ("sh", "du -sh .git", "IG", False, "inspects disk usage"),
    (
        "sh",
        "python3 scripts/reproduce.py 2>&1 | tee /tmp/repro.log",
        "RV",
        True,
        "re-runs the reproduction after the fix; tee to a scratch log",
    ),
    _end(),
]

CHECK_WS = "from app.slug import slugify\nassert slugify(' a b ') == 'a-b', slugify(' a b ')\nprint('fixed')\n"

MINI_SWE_AGENT: list[Step] = [
    ("sh", "find {W} -maxdepth 2 -type f -name '*.py' | sort", "IG", False, "finds files"),
    ("sh", "cat {W}/app/slug.py", "IG", False, "reads a source file"),
    ("sh", 'grep -rn "split" {W}/app {W}/tests', "IG", False, "searches the code"),
    ("sh", "cd {W} && git log --oneline -3 && git status", "IG", False, "reads history and status"),
    ("sh", "cd {W} && python3 scripts/reproduce.py", "IG", True, "runs a reproduction before any edit"),
    (
        "sh",
        f"cat <<'EOF' > {{W}}/scripts/check_ws.py\n{CHECK_WS}EOF",
        "AE",
        True,
        "writes a reproduction script (a file, but not the fix)",
    ),
    (
        "sh",
        "cd {W} && python3 scripts/check_ws.py",
        "IG",
        True,
        "runs the new reproduction before the fix (after a file was written)",
    ),
    ("edit", ("app/slug.py", *FIX), "AE", False, "python -c rewrites the source file"),
    ("sh", "cd {W} && python3 scripts/check_ws.py", "RV", True, "re-runs the reproduction after the fix"),
    ("sh", "cd {W} && python3 -m pytest tests/ -q", "RV", False, "runs the tests"),
    ("sh", "sed -n '8,12p' {W}/app/slug.py", "IG", False, "sed -n prints a range"),
    ("sh", "sed -i 's/n=20/n=24/' {W}/app/slug.py", "AE", False, "sed -i edits in place"),
    ("sh", "cd {W} && python3 -m pytest -q tests/test_slug.py::test_shorten", "RV", False, "runs one test"),
    (
        "sh",
        "cd {W} && sed -i 's/n=24/n=20/' app/slug.py && python3 -m pytest -q",
        "AE",
        True,
        "reverts an edit and re-runs the tests in one command",
    ),
    ("sh", "cd {W} && git diff", "IG", False, "inspects the diff"),
    ("sh", "cd {W} && git stash", "AE", True, "shelves the working-tree changes"),
    ("sh", "cd {W} && python3 -m pytest -q tests/test_slug.py", "RV", True, "tests the stashed (original) tree"),
    ("sh", "cd {W} && git stash pop", "AE", True, "restores the shelved changes"),
    ("sh", "cd {W} && rm -f scripts/check_ws.py", "AE", False, "deletes a file"),
    ("sh", "cd {W} && make test", "RV", False, "make test"),
    ("sh", "wc -l {W}/app/slug.py {W}/tests/test_slug.py", "IG", False, "counts lines"),
    ("sh", "cd {W} && python3 -m json.tool package.json", "IG", False, "pretty-prints a file"),
    ("sh", "cd {W} && npm run build && ls dist", "RV", True, "builds after the edits and checks the output"),
    ("sh", "which python3 && python3 --version", "IG", False, "inspects the environment"),
    ("sh", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "OTHER", False, "submission sentinel"),
]

# nemo_polar/examples/tiny_agent.py stops after 20 model calls: 19 tool steps and the answer
SHELL: list[Step] = [
    ("sh", "pwd && ls", "IG", False, "lists the directory"),
    ("sh", "cat app/slug.py tests/test_slug.py", "IG", False, "reads files"),
    ("sh", 'grep -n "assert" tests/test_slug.py', "IG", False, "searches a file"),
    ("sh", "python3 -m unittest discover -s tests -q", "RV", True, "baseline test run before any edit"),
    ("edit", ("app/slug.py", *FIX), "AE", False, "edit tool changes the source"),
    ("sh", "python3 -m unittest discover -s tests", "RV", False, "runs the tests after the fix"),
    ("write", ("tests/test_more.py", TEST_SHORTEN), "AE", False, "writes a new test file"),
    ("sh", "python3 -m pytest tests/test_more.py -v", "RV", False, "runs the new test"),
    ("sh", "git diff --stat && git diff app/", "IG", False, "inspects the diff"),
    ("sh", "python3 -c \"open('app/VERSION','w').write('0.1.1\\n')\"", "AE", False, "python -c writes a file"),
    ("sh", "npm test 2>&1 | tail -2", "RV", False, "npm test"),
    ("sh", "ruff check app || python3 -m pyflakes app", "RV", False, "lints the package"),
    ("sh", "ruff format app", "AE", True, "a formatter rewrites files"),
    ("sh", "git restore app/config.py", "AE", False, "reverts a file"),
    ("sh", "python3 app/cli.py < /dev/null; echo exit=$?", "RV", True, "runs the program after the edits"),
    (
        "edit",
        ("docs/CHANGES.md", "- first release", "- first release\n- slugify strips whitespace"),
        "AE",
        False,
        "edits the changelog",
    ),
    (
        "sh",
        "grep -q whitespace docs/CHANGES.md && echo found",
        "RV",
        True,
        "grep used to confirm the edit landed",
    ),
    ("sh", "make -n test", "IG", True, "dry run prints the test command without running it"),
    ("sh", "sleep 1 && echo waited", "OTHER", False, "waits; no effect"),
    _end(),
]

PLANS: dict[str, list[Step]] = {
    "claude_code": CLAUDE_CODE,
    "codex": CODEX,
    "gemini_cli": GEMINI_CLI,
    "qwen_code": QWEN_CODE,
    "opencode": OPENCODE,
    "pi": PI,
    "mini_swe_agent": MINI_SWE_AGENT,
    "shell": SHELL,
}

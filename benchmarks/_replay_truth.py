# SPDX-License-Identifier: Apache-2.0
"""Credit fidelity, the replay subset (issue 13 item 3): ground truth through the REAL counterfactual replay path.
A helper of `credit_fidelity.py`, which runs it beside the simulator (`make bench` skips `_*.py`); runnable alone:

    .venv/bin/python benchmarks/_replay_truth.py [--examples median,slugify,lru_cache,roman,intervals]
        [--upstream URL --model NAME]

What runs: the rollout service in this process (rollout server, one gateway, its hosted proxy) in front of the
proxy's FAKE upstream (named as a fake; `--upstream` takes a real vLLM instead). Every model call of these
sessions is a forced or replayed plan step, so the upstream decides nothing: the harness (`shell` running
nemo_polar/examples/tiny_agent.py, a real OpenAI-SDK tool loop), the runtime, the proxy's plan steps and the `swe_tests`
evaluator are what produce the outcome. Per example task, a GRPO group of two sessions is recorded: its `fix_plan`
(reward 1) and its `noop_plan` (reward 0). Then, for every call k of both sessions, `credit.RolloutRunner` re-runs
the session with the calls before k replayed token for token, NULL at k (a no-op shell call, `true`: the step spent
on no action, as docs/credit_sim_model.md §5 defines it) and the recorded calls after k replayed (the plan-driven
agent's own continuation): δ_k = R(τ) − R(τ′) is the call's interventional effect, measured end to end.

Reported: per call (example, role, δ_k, credit), and pooled Spearman ρ between credit and δ_k for (a) outcome
broadcast, (b) uniform per-step split and (c) CALL-CREDIT rules (`CallCreditConfig()`), plus whether every replayed
prompt equalled the recorded one token for token. Plan steps use workdir-relative paths, so prompts name nothing
session-specific.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (the repository root, for polar_lab: the simulator, the fake upstream)
from nemo_polar.credit import CallCreditConfig, annotate, assign
from nemo_polar.credit.counterfactual import Alternative, CounterfactualRequest
from nemo_polar.credit.counterfactual_rollout import RolloutRunner

from nemo_polar import examples
from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.types import CompletionRecord, SessionResult
from polar_lab.credit_sim.fidelity import spearman

EXAMPLES = ("median", "slugify", "lru_cache", "roman", "intervals")
NULL_STEP = {"tool": "bash", "arguments": {"command": "true"}}


def native_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """A harness-neutral plan as `shell`-adapter tool steps with workdir-relative paths."""
    steps = []
    for s in plan["steps"]:
        if "shell" in s:
            steps.append({"tool": "bash", "arguments": {"command": s["shell"]}})
        elif "edit" in s:
            steps.append({"tool": "edit", "arguments": dict(s["edit"])})
        elif "write" in s:
            steps.append({"tool": "write", "arguments": dict(s["write"])})
        else:
            steps.append(dict(s))
    return {"version": 1, "steps": steps, "side": "live"}


def example_task(name: str) -> TaskSpec:
    ex = examples.load(name)
    return TaskSpec.model_validate(
        {
            "task_id": f"truth-{name}",
            "instruction": ex.problem_statement,
            "num_samples": 2,
            "runtime": {"isolation": "none", "source": f"example:{name}"},
            "agent": {
                "harness": "shell",
                "timeout_s": 120,
                "sampling": {"temperature": 0.0, "max_tokens": 32},
                "options": {"command_line": examples.tiny_agent_command()},
            },
            "builder": "per_request",
            "evaluator": {
                "name": "swe_tests",
                "options": {"FAIL_TO_PASS": list(ex.fail_to_pass), "PASS_TO_PASS": list(ex.pass_to_pass)},
            },
            "plans": [native_plan(ex.fix_plan), native_plan(ex.noop_plan)],
            "timeout_s": 300,
            "metadata": {"group_id": name},
        }
    )


async def _measure(names: tuple[str, ...], work: Path, upstream: str | None, model: str) -> dict[str, Any]:
    from nemo_polar.rollout.client import PolarClient
    from nemo_polar.rollout.stack import StackConfig, start_stack
    from polar_lab.fake_upstream import FakeUpstream

    fake = None if upstream else await FakeUpstream().start()
    url = upstream or (fake.base_url if fake else "")
    try:
        stack = await start_stack(
            StackConfig(work_dir=str(work), upstreams=[url], served_model=model, heartbeat_s=0.5, run_slots=3)
        )
    except BaseException:
        if fake is not None:
            await fake.stop()
        raise
    proxy, server_url = stack.proxy, stack.server_url
    assert proxy is not None and server_url is not None
    try:
        tasks = [example_task(n) for n in names]
        async with PolarClient(server_url, poll_wait_s=5) as client:
            for t in tasks:
                await client.submit(t)
            results: list[SessionResult] = []
            for t in tasks:
                results += sorted(await client.collect(t.task_id), key=lambda r: r.sample_index)
        records = [sorted(await proxy.records(r.session_id), key=lambda x: x.seq) for r in results]
        by_task = {t.task_id: t for t in tasks}
        runner = RolloutRunner(
            server_url, {r.session_id: by_task[r.task_id] for r in results}, records_of=proxy.records
        )
        sem = asyncio.Semaphore(3)

        async def delta(res: SessionResult, recs: list[CompletionRecord], k: int) -> tuple[float, bool]:
            alt = Alternative("plan", NULL_STEP, then="recorded")
            req = CounterfactualRequest(res.session_id, recs, k, recs[k].id, alt, timeout_s=300)
            async with sem:
                out = await asyncio.wait_for(runner.run(req), timeout=300)
            return res.reward - out.reward, bool(out.metadata.get("replay_prompts_equal"))

        jobs = [(i, k) for i, recs in enumerate(records) for k in range(len(recs))]
        deltas = await asyncio.gather(*(delta(results[i], records[i], k) for i, k in jobs))
        return {"results": results, "records": records, "jobs": jobs, "deltas": deltas}
    finally:
        await stack.close()
        if fake is not None:
            await fake.stop()


def run(
    names: tuple[str, ...] = EXAMPLES, *, upstream: str | None = None, model: str = "tiny-qwen3"
) -> dict[str, Any]:
    """Record the groups, measure δ_k for every call through the replay path, score the three arms."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="replay-truth-") as tmp:
        m = asyncio.run(_measure(names, Path(tmp), upstream, model))
    results, records = m["results"], m["records"]
    graphs = [
        annotate(recs, harness="shell", session_id=r.session_id) for r, recs in zip(results, records, strict=True)
    ]
    cfg = CallCreditConfig()
    assigns = assign(graphs, [r.reward for r in results], cfg, group_ids=[r.task_id for r in results])
    rows = []
    for (i, k), (d, same) in zip(m["jobs"], m["deltas"], strict=True):
        a = assigns[i]
        rows.append(
            {
                "example": results[i].task_id.removeprefix("truth-"),
                "session": "fix" if results[i].sample_index == 0 else "noop",
                "call": k,
                "role": graphs[i].nodes[k].role,
                "delta": d,
                "broadcast": a.advantage,
                "uniform": a.advantage / max(len(graphs[i].nodes), 1),
                "rules": float(a.credit[k]),
                "prompts_equal": same,
            }
        )
    deltas = [r["delta"] for r in rows]
    rho = {arm: spearman([r[arm] for r in rows], deltas) for arm in ("broadcast", "uniform", "rules")}
    return {
        "rows": rows,
        "decisive_first": decisive_first(rows),
        "rho": rho,
        "rewards": [r.reward for r in results],
        "sessions": len(results) + len(rows),
        "upstream": upstream or "FAKE",
        "wall_s": time.perf_counter() - t0,
    }


def decisive_first(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Per example whose fix session has a decisive call (δ > 0): whether that call has the highest rules credit
    of the session (every other call, the reads before it included, strictly less)."""
    out: dict[str, bool] = {}
    for ex in dict.fromkeys(r["example"] for r in rows):
        calls = [r for r in rows if r["example"] == ex and r["session"] == "fix"]
        decisive = [r for r in calls if r["delta"] > 0]
        if not decisive:
            continue
        top = max(decisive, key=lambda r: r["rules"])
        out[ex] = all(r["rules"] < top["rules"] for r in calls if r is not top)
    return out


def format_table(out: dict[str, Any]) -> str:
    rows = out["rows"]
    lines = [
        f"replay subset: ground truth through the real counterfactual replay path ({len(rows)} calls, "
        f"{out['sessions']} sessions through the rollout service, upstream {out['upstream']}: every call forced or "
        f"replayed; {out['wall_s']:.1f} s)",
        f"{'example':<11}{'session':<8}{'call':>5}  {'role':<6}{'δ (replay)':>11}{'broadcast':>11}{'uniform':>10}"
        f"{'rules':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r['example']:<11}{r['session']:<8}{r['call']:>5}  {r['role']:<6}{r['delta']:>+11.0f}"
            f"{r['broadcast']:>+11.3f}{r['uniform']:>+10.3f}{r['rules']:>+10.3f}"
        )
    fmt = {k: ("n/a" if not math.isfinite(v) else f"{v:+.3f}") for k, v in out["rho"].items()}
    lines.append(
        f"ρ = Spearman(credit, δ) over these calls: (a) broadcast {fmt['broadcast']}, (b) uniform {fmt['uniform']}, "
        f"(c) CALL-CREDIT rules {fmt['rules']}; replayed prompts equal the recorded ones token for token: "
        f"{sum(r['prompts_equal'] for r in rows)}/{len(rows)}"
        + (
            " (vacuous on the FAKE upstream, which tokenises every prompt alike; tests/credit/"
            "test_counterfactual_rollout.py checks it on vLLM)"
            if out["upstream"] == "FAKE"
            else ""
        )
    )
    first = out.get("decisive_first", {})
    if first:
        lines.append(
            "the decisive call has the highest CALL-CREDIT credit of its fix session: "
            + ", ".join(f"{ex} {'yes' if ok else 'NO'}" for ex, ok in first.items())
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", default=",".join(EXAMPLES))
    ap.add_argument("--upstream", default=None, help="a vLLM base URL instead of the FAKE upstream")
    ap.add_argument("--model", default="tiny-qwen3")
    args = ap.parse_args(argv)
    out = run(tuple(n for n in args.examples.split(",") if n), upstream=args.upstream, model=args.model)
    print(format_table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

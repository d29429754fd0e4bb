# SPDX-License-Identifier: Apache-2.0
"""Credit fidelity (issue 13): does CALL-CREDIT credit the calls that caused success?

    .venv/bin/python benchmarks/credit_fidelity.py [--seeds 5] [--scenarios basic,confounded,noisy]
        [--tasks-in 10] [--tasks-out 10] [--samples 8] [--adapt-steps 5] [--json OUT]

What runs (docs/credit_sim_model.md is the causal model, fixed before any measurement): per scenario and seed,
GRPO batches of simulated coding-agent sessions (10 held-in tasks in six harness vocabularies, 10 held-out tasks in
mini-swe-agent's, 8 samples each; the held-out split had 4 until 2026-12-01, docs/credit_sim_model.md §9) become
real `CompletionRecord`s (tiny-qwen3's chat template and tokenizer), go through `trajectory.build` (per_request and
prefix_merging) and CALL-CREDIT with `CallCreditConfig()` (defaults, never tuned here). Five arms — (a) outcome
broadcast, (b) uniform per-step split, (c) CALL-CREDIT rules, (d) + the core's counterfactual calibration with the
simulator's runner, (e) ω after N co-evolution steps — are scored against each call's exact interventional effect:
Spearman ρ, the reward-hacking rate, the share of positive credit on irrelevant calls; mean ± 95 % t-interval over
seeds. Rows `call` are Â_v before fusion; builder rows are the fused token advantages the trainer receives
(α = 0.5 for (c)–(e)). The held-out batch's sessions are also re-rendered in each held-in vocabulary and
CALL-CREDIT's roles and credit compared (`vocabulary_check`). Needs `polar backend prepare` (tiny-qwen3's
tokenizer); without it, it exits 2 with the reason.

The replay subset (`_replay_truth.py`, run alongside in a thread): for the example tasks in `--replay-examples`,
each call's effect measured through the REAL counterfactual replay path (rollout service, proxy plan steps, a real
tool-calling harness, the `swe_tests` evaluator), scored against arms (a)-(c). `--replay-examples ''` skips it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # polar_lab (the simulator) lives at the repository root, not in the wheel
    sys.path.insert(0, str(REPO))

from polar_lab.credit_sim.fidelity import FidelityConfig, format_table, run, summarize  # noqa: E402
from polar_lab.credit_sim.records import ChatTokenizer, TokenizerMissing  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--scenarios", default="basic,confounded,noisy")
    ap.add_argument("--tasks-in", type=int, default=10)
    ap.add_argument("--tasks-out", type=int, default=10, help="0 leaves the held-out vocabulary out")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--adapt-steps", type=int, default=5)
    ap.add_argument("--adapt-tasks", type=int, default=5)
    ap.add_argument("--truth-calls", type=int, default=4, help="calls per seed checked through the runner")
    ap.add_argument("--truth-runs", type=int, default=200)
    ap.add_argument("--json", default=None, help="also write the per-seed numbers here")
    ap.add_argument(
        "--replay-examples",
        default="median,roman,intervals",
        help="example tasks whose calls get ground truth through the real replay path ('' skips it)",
    )
    args = ap.parse_args(argv)
    try:
        tok = ChatTokenizer()
    except TokenizerMissing as exc:
        print(f"credit_fidelity: {exc}", file=sys.stderr)
        return 2
    fc = FidelityConfig(
        scenarios=tuple(s for s in args.scenarios.split(",") if s),
        seeds=tuple(range(args.seeds)),
        tasks_in=args.tasks_in,
        tasks_out=args.tasks_out,
        samples=args.samples,
        adapt_steps=args.adapt_steps,
        adapt_tasks=args.adapt_tasks,
        truth_calls=args.truth_calls,
        truth_runs=args.truth_runs,
    )
    t0 = time.perf_counter()
    replay: dict[str, Any] = {}
    names = tuple(n for n in args.replay_examples.split(",") if n)
    thread = None
    if names:  # mostly subprocesses (harness, tests): it overlaps the simulator's CPU work

        def replay_subset() -> None:
            import _replay_truth

            try:
                replay["out"] = _replay_truth.run(names)
            except Exception as exc:  # reported, never fatal to the simulator's table
                replay["error"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=replay_subset, daemon=True)
        thread.start()
    out = run(fc, tok)
    if thread is not None:
        thread.join()
    wall = time.perf_counter() - t0
    print(format_table(out))
    if "out" in replay:
        import _replay_truth

        print()
        print(_replay_truth.format_table(replay["out"]))
    elif "error" in replay:
        print(f"\nreplay subset failed: {replay['error']}")
    print(f"\nwall time {wall:.1f} s")
    if args.json:
        rows = []
        for (scenario, split, builder, arm), slot in out["results"].items():
            row = {"scenario": scenario, "split": split, "builder": builder, "arm": arm}
            for k, v in slot.items():
                m, h, n = summarize(v)
                row[k] = {"per_seed": v, "mean": m, "half_width_95": h if math.isfinite(h) else None, "n": n}
            rows.append(row)
        with open(args.json, "w") as f:
            json.dump(
                {"rows": rows, "truth": out["extras"]["truth"], "replay": replay.get("out"), "wall_s": wall},
                f,
                indent=1,
                default=str,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

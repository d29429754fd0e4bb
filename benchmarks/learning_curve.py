# SPDX-License-Identifier: Apache-2.0
"""Learning curve (issue 24): does CALL-CREDIT learn faster than outcome broadcast through the real training path?

    make learning-curve        # the full default: 3 arms x 3 seeds x 3 steps; ~25 min on 2 cores
    <nemo-rl venv python> benchmarks/learning_curve.py [--steps N] [--seeds 0,1,2] [--arms a,b] [--group G]
        [--lr LR] [--threshold T] [--quick] [--work-dir DIR] [--json OUT] [--svg OUT] [--markdown OUT]

Runs in the NeMo RL venv (`bash scripts/nemo_rl_venv.sh | tail -n1`). The task, the harness, the arms and the
refit are `polar_lab/learning_curve.py`'s (docstring there). Per arm: reward per step (mean ± 95 %
t-interval over seeds), trajectories sampled until the mean reward of two consecutive steps reaches `--threshold`
(per seed; mean ± interval over the seeds that reached it, and how many did), final reward (mean of the last two
steps), the share of |advantage| on the decisive call (calls weighted equally), the hacking rate (share of
sessions whose decisive call rewrote the test file instead of fixing the code) over training, tokens trained and
tokens run forward per step, wall time per step. Prints the table and the two verdicts the issue asks for; writes
the per-step report (JSON), the plot (SVG) and the markdown section. Exits non-zero when a step did not do its
job (records of a step not at that policy's version, a reward that disagrees with the decisive choice).
`--quick`: 1 seed, 3 steps, arms broadcast + call_credit. Defaults: arms broadcast, call_credit and
call_credit_per_request (rolled out on its own), seeds 0,1,2, group 5, lr 5e-3 (2e-2 collapses every arm onto one
option at step 4: RESULTS.md), 3 steps, no step round started after 30 min (`--max-minutes`);
`--shadow-per-request ARMS` also trains a per_request twin on those arms' own batches (compared by weights).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _path  # noqa: F401  (the repository root on sys.path)

from polar_lab import learning_curve as lc

HERE = Path(__file__).resolve().parent
DEFAULT_ARMS = ("broadcast", "call_credit", "call_credit_per_request")
COLORS = {
    "broadcast": "#d62728",
    "call_credit": "#1f77b4",
    "call_credit_per_request": "#2ca02c",
    "call_credit_literal": "#9467bd",
}


def summarize(report: dict[str, Any], threshold: float) -> dict[str, Any]:
    group, steps = report["group"], report["steps"]
    by_arm: dict[str, list[list[dict[str, Any]]]] = {}
    for pol in report["policies"].values():
        by_arm.setdefault(pol["arm"], []).append(pol["steps"])
    out: dict[str, Any] = {}
    for arm, runs in by_arm.items():
        per_step = [lc.mean_ci([r[s]["reward"] for r in runs]) for s in range(steps)]
        reach = [lc.trajectories_to_threshold([x["reward"] for x in r], group, threshold) for r in runs]
        reached = [x for x in reach if x is not None]
        tail = min(2, steps)
        final = [sum(x["reward"] for x in r[-tail:]) / tail for r in runs]
        half = max(1, steps // 2)
        out[arm] = {
            "seeds": len(runs),
            "reward_per_step": per_step,
            "trajectories_to_threshold": lc.mean_ci(reached) if reached else (float("nan"), float("nan")),
            "reached": f"{len(reached)}/{len(runs)}",
            "reach_per_seed": reach,
            "final_reward": lc.mean_ci(final),
            "decisive_share": lc.mean_ci([_mean([x["decisive_share"] for x in r]) for r in runs]),
            "hack_rate_first_half": lc.mean_ci([_mean([x["hack_rate"] for x in r[:half]]) for r in runs]),
            "hack_rate_second_half": lc.mean_ci([_mean([x["hack_rate"] for x in r[half:]]) for r in runs]),
            "tokens_trained_per_step": _mean([x["tokens_trained"] for r in runs for x in r]),
            "tokens_forward_per_step": _mean([x["tokens_forward"] for r in runs for x in r]),
            "wall_s_per_step": _mean([x["wall_s"] for r in runs for x in r]),
            "reload_s_per_step": _mean([x["times_s"]["reload"] for r in runs for x in r]),
        }
        shadows = [x["per_request_shadow"] for r in runs for x in r if x.get("per_request_shadow")]
        if shadows:
            out[arm]["per_request_shadow"] = {
                "weights_rel_diff_max": max(x["weights_rel_diff"] for x in shadows),
                "weights_rel_diff_last": _mean([r[-1]["per_request_shadow"]["weights_rel_diff"] for r in runs]),
                "tokens_forward_per_step": _mean([x["tokens_forward"] for x in shadows]),
                "tokens_trained_per_step": _mean([x["tokens_trained"] for x in shadows]),
                "rows_per_step": _mean([x["rows"] for x in shadows]),
                "loss_abs_diff_max": max(abs(x["loss"] - x["loss_prefix_merging"]) for x in shadows),
            }
    return out


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def _pm(mc: tuple[float, float], digits: int = 2) -> str:
    m, h = mc
    return "n/a" if m != m else f"{m:.{digits}f} ± {h:.{digits}f}"


def verdicts(summary: dict[str, Any]) -> list[str]:
    out = []
    b, c = summary.get("broadcast"), summary.get("call_credit")
    if b and c:
        (cm, ch), (bm, bh) = c["trajectories_to_threshold"], b["trajectories_to_threshold"]
        if c["reached"].startswith("0/") or b["reached"].startswith("0/"):
            word = (
                "cannot be compared: "
                + ("CALL-CREDIT " if c["reached"].startswith("0/") else "")
                + ("broadcast " if b["reached"].startswith("0/") else "")
                + "never reached the threshold"
            )
        elif cm + ch < bm - bh:
            word = f"FEWER trajectories: {cm:.1f} ± {ch:.1f} vs {bm:.1f} ± {bh:.1f} (intervals apart)"
        elif cm - ch > bm + bh:
            word = f"MORE trajectories: {cm:.1f} ± {ch:.1f} vs {bm:.1f} ± {bh:.1f} (intervals apart)"
        else:
            word = f"no difference shown: {cm:.1f} ± {ch:.1f} vs {bm:.1f} ± {bh:.1f} (intervals overlap)"
        out.append(
            f"CALL-CREDIT vs broadcast, trajectories to threshold: {word}; "
            f"reached by {c['reached']} vs {b['reached']} seeds; "
            f"ratio {cm / bm:.2f}" if bm == bm and bm > 0 and cm == cm else
            f"CALL-CREDIT vs broadcast, trajectories to threshold: {word}"
        )  # fmt: skip
    p = summary.get("call_credit_per_request")
    sh = (c or {}).get("per_request_shadow")
    if c and sh and not p:
        same = sh["weights_rel_diff_max"] < 1e-3
        out.append(
            "per_request + CALL-CREDIT as a twin learner on the prefix_merging policy's own batches (not independent "
            f"rollouts): weights differ by up to {sh['weights_rel_diff_max']:.2e} relative L2 (last step, mean over "
            f"seeds {sh['weights_rel_diff_last']:.2e}; loss |Δ| ≤ {sh['loss_abs_diff_max']:.1e}): "
            + (
                "the same updates, so prefix_merging keeps per_request's final reward (≥ 95 %)"
                if same
                else "NOT the same updates, and the twin is not rolled out, so whether prefix_merging + CALL-CREDIT "
                "reaches ≥ 95 % of per_request + CALL-CREDIT's final reward is NOT measured here"
            )
            + f"; tokens run forward per step {c['tokens_forward_per_step']:.0f} (prefix_merging) vs "
            f"{sh['tokens_forward_per_step']:.0f} (per_request, {sh['rows_per_step']:.0f} rows), trained "
            f"{c['tokens_trained_per_step']:.0f} vs {sh['tokens_trained_per_step']:.0f}"
        )
    if c and p:
        (cm, ch), (pm, ph) = c["final_reward"], p["final_reward"]
        if pm > 0:
            ratio = cm / pm
            lo = (cm - ch) / (pm + ph) if pm + ph > 0 else float("nan")
            out.append(
                f"prefix_merging + CALL-CREDIT final reward {cm:.2f} ± {ch:.2f} vs per_request + CALL-CREDIT "
                f"{pm:.2f} ± {ph:.2f}: ratio {ratio:.2f} ({'≥' if ratio >= 0.95 else '<'} 0.95; "
                f"pessimistic end of the intervals {lo:.2f})"
            )
        else:
            out.append(f"per_request + CALL-CREDIT final reward {pm:.2f}: the 95 % ratio is undefined")
    return out


def table(summary: dict[str, Any], report: dict[str, Any], threshold: float) -> str:
    head = (
        f"| arm | seeds | reward step 1 | final reward (last 2 steps) | trajectories to {threshold:g} | reached | "
        "decisive-call share of credit | hacking rate 1st half → 2nd half | tokens trained / step | "
        "tokens forward / step | wall s / step (reload) |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for arm, s in summary.items():
        rows.append(
            f"| {arm} | {s['seeds']} | {_pm(s['reward_per_step'][0])} | {_pm(s['final_reward'])} | "
            f"{_pm(s['trajectories_to_threshold'], 1)} | {s['reached']} | {_pm(s['decisive_share'])} | "
            f"{_pm(s['hack_rate_first_half'])} → {_pm(s['hack_rate_second_half'])} | "
            f"{s['tokens_trained_per_step']:.0f} | {s['tokens_forward_per_step']:.0f} | "
            f"{s['wall_s_per_step']:.1f} ({s['reload_s_per_step']:.1f}) |"
        )
    steps = report["steps"]
    curve = "| step | " + " | ".join(summary) + " |\n|---|" + "---|" * len(summary) + "\n"
    for k in range(steps):
        curve += f"| {k + 1} | " + " | ".join(_pm(s["reward_per_step"][k]) for s in summary.values()) + " |\n"
    return head + "\n".join(rows) + "\n\nReward per step (mean ± 95 % interval over seeds):\n\n" + curve


def svg(summary: dict[str, Any], steps: int, threshold: float) -> str:
    w, h, ml, mr, mt, mb = 640, 360, 50, 170, 20, 40
    pw, ph = w - ml - mr, h - mt - mb

    def x(k: int) -> float:
        return ml + (pw * (k - 1) / max(1, steps - 1))

    def y(v: float) -> float:
        return mt + ph * (1 - max(0.0, min(1.0, v)))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw}" y2="{mt + ph}" stroke="black"/>',
        f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="black"/>',
        f'<line x1="{ml}" y1="{y(threshold):.1f}" x2="{ml + pw}" y2="{y(threshold):.1f}" stroke="#999" '
        'stroke-dasharray="4 3"/>',
        f'<text x="{ml + pw + 4}" y="{y(threshold) + 4:.1f}" fill="#666">threshold</text>',
        f'<text x="{ml + pw / 2}" y="{h - 8}" text-anchor="middle">GRPO step</text>',
        f'<text x="12" y="{mt + ph / 2}" transform="rotate(-90 12 {mt + ph / 2})" text-anchor="middle">'
        "mean reward (95 % interval over seeds)</text>",
    ]
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="{ml - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for k in range(1, steps + 1):
        parts.append(f'<text x="{x(k):.1f}" y="{mt + ph + 14}" text-anchor="middle">{k}</text>')
    for i, (arm, s) in enumerate(summary.items()):
        color = COLORS.get(arm, "#333")
        pts = s["reward_per_step"]
        upper = [f"{x(k + 1):.1f},{y(m + hw):.1f}" for k, (m, hw) in enumerate(pts)]
        lower = [f"{x(k + 1):.1f},{y(m - hw):.1f}" for k, (m, hw) in reversed(list(enumerate(pts)))]
        parts.append(f'<polygon points="{" ".join(upper + lower)}" fill="{color}" fill-opacity="0.15" stroke="none"/>')
        line = " ".join(f"{x(k + 1):.1f},{y(m):.1f}" for k, (m, _) in enumerate(pts))
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{ml + pw + 10}" y="{mt + 14 + 16 * i}" fill="{color}">{arm}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def problems(report: dict[str, Any]) -> list[str]:
    bad = []
    for name, pol in report["policies"].items():
        for s in pol["steps"]:
            if s["record_policy_versions"] != [s["policy_version"]]:
                bad.append(f"{name} step {s['step']}: records at {s['record_policy_versions']}, "
                           f"policy at {s['policy_version']}")  # fmt: skip
            if not s["reward_matches_choice"]:
                bad.append(f"{name} step {s['step']}: rewards {s['rewards']} disagree with choices {s['choices']}")
            if s["masked"] == len(s["rewards"]):
                bad.append(f"{name} step {s['step']}: every sample masked (rollout failures)")
            diff = s.get("served_vs_trainer_logprob_diff")
            if diff is not None and diff > 1e-3:  # float32 on both sides: 1e-6 when the refit took
                bad.append(
                    f"{name} step {s['step']}: vLLM serves other weights than the trainer's (|Δ logprob| {diff:.3g})"
                )
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"of {', '.join(lc.ARMS)}")
    ap.add_argument("--group", type=int, default=5, help="sessions per GRPO group (one prompt per step)")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument(
        "--shadow-per-request", default="", help="arms whose policies also train a per_request twin (e.g. call_credit)"
    )
    ap.add_argument(
        "--forced-tokens",
        choices=("canonical", "grammar"),
        default="canonical",
        help="how the proxy spells forced and chosen steps (canonical: the tokenizer's own spelling, scored)",
    )
    ap.add_argument("--threshold", type=float, default=0.6)
    ap.add_argument("--summarize", type=Path, default=None, help="only summarize this report (e.g. partial.json)")
    ap.add_argument("--max-minutes", type=float, default=30.0, help="start no step round after this (0: none)")
    ap.add_argument("--quick", action="store_true", help="1 seed, 3 steps, broadcast + call_credit")
    ap.add_argument("--work-dir", type=Path, default=None)
    ap.add_argument(
        "--json", type=Path, default=None, help="default benchmarks/learning_curve.json (work dir if --quick)"
    )
    ap.add_argument(
        "--svg", type=Path, default=None, help="default benchmarks/learning_curve.svg (work dir if --quick)"
    )
    ap.add_argument("--markdown", type=Path, default=None, help="also write the RESULTS.md section here")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.arms = 3, "0", "broadcast,call_credit"
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in lc.ARMS]
    if unknown:
        print(f"unknown arms {unknown}; known: {list(lc.ARMS)}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s]
    work = args.work_dir or Path(lc.cache_run_dir()) / f"learning-curve-{int(time.time())}"
    out_dir = work if args.quick else HERE
    args.json = args.json or out_dir / "learning_curve.json"
    args.svg = args.svg or out_dir / "learning_curve.svg"
    t0 = time.monotonic()
    if args.summarize:
        report = json.loads(args.summarize.read_text())
        report["policies"] = {k: p for k, p in report["policies"].items() if len(p["steps"]) == report["steps"]}
    else:
        report = lc.run(
            work, arms=arms, seeds=seeds, steps=args.steps, group=args.group, lr=args.lr,
            max_minutes=args.max_minutes or None, partial=work / "partial.json",
            shadow_per_request=[a for a in args.shadow_per_request.split(",") if a],
            forced_tokens=args.forced_tokens,
        )  # fmt: skip
    report["threshold"] = args.threshold
    summary = summarize(report, args.threshold)
    report["summary"] = summary
    report["verdicts"] = verdicts(summary)
    report.setdefault("command_wall_s", round(time.monotonic() - t0, 1))
    args.json.write_text(json.dumps(report, indent=1, default=str))
    args.svg.write_text(svg(summary, report["steps"], args.threshold))
    text = table(summary, report, args.threshold)
    print(text)
    for v in report["verdicts"]:
        print("-", v)
    print(f"harness: {report['harness']}; refit: {report['refit']}; setup {report['setup_s']}; "
          f"wall time {report['command_wall_s']} s")  # fmt: skip
    md = text + "\n" + "\n".join(f"- {v}" for v in report["verdicts"]) + "\n"
    md += f"\nWall time {report['command_wall_s']:.0f} s; setup {report['setup_s']}; plot `{args.svg.name}`.\n"
    if args.markdown:
        args.markdown.write_text(md)
    if os.environ.get("POLAR_BENCH_TABLES"):  # `make bench` collects it into RESULTS.md
        with open(os.environ["POLAR_BENCH_TABLES"], "a", encoding="utf-8") as f:
            f.write(md + "\n")
    bad = problems(report)
    if bad:
        print("learning-curve did not do its job: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


def _in_nemo_rl_venv() -> int | None:
    """Re-run this script under the NeMo RL venv when started elsewhere (e.g. by `make bench`); None if here."""
    if importlib.util.find_spec("nemo_rl") is not None:
        return None
    venv = subprocess.run(
        ["bash", str(HERE.parent / "scripts" / "nemo_rl_venv.sh")], capture_output=True, text=True, check=False
    )
    lines = venv.stdout.strip().splitlines()
    if venv.returncode != 0 or not lines:
        print(f"learning_curve needs the NeMo RL venv (make nemo-rl): {venv.stderr.strip()[-500:]}", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([str(Path(lines[-1]) / "bin" / "python"), __file__, *sys.argv[1:]], env=env).returncode


if __name__ == "__main__":
    rc = _in_nemo_rl_venv()
    sys.exit(main() if rc is None else rc)

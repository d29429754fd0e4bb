# SPDX-License-Identifier: Apache-2.0
"""`polar credit RUN_DIR`: CALL-CREDIT over a run directory, `credit.jsonl` written, tables printed.

Prints per harness: the reward-hacking rate (CALL-CREDIT vs outcome broadcast), per-role credit
distributions, and the weakness report (unused reads, unverified edits, uncorrected failures). `--json`
prints the same as JSON. `--config` takes a YAML or JSON `CallCreditConfig`. The work is `runio.py`'s.

`--counterfactual URL` calibrates the selected AE calls by counterfactual replay through the rollout server at URL
(`polar serve --upstream …`; the config key `counterfactual.rollout_url` does the same): each session's task from
`RUN_DIR/tasks.jsonl` re-runs with the recorded calls before k replayed and `--alternative` at k (`next_best`, or
`plan` with `--plans FILE`: a JSON object mapping record ids to plan steps, e.g. `{"edit": {path, old, new}}`;
`second_best` needs a proxy that serves the `second_best` plan step). Calibration is off by default (budget 0):
`--budget N` turns it on; `--select uncertain` spends the budget where rule credit and a cheap estimate disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nemo_polar.rundir import RunDir

__all__ = ["export_dpo", "register", "register_export_dpo"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "credit",
        help="CALL-CREDIT: roles, causal graph and call-level credit for a run directory",
        description="Annotate every session of RUN_DIR, write RUN_DIR/credit.jsonl and print metrics.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    p.add_argument("--out", default=RunDir(".").credit.name, help="output file name inside RUN_DIR")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    _counterfactual_arguments(p)
    p.add_argument("--dpo", type=Path, default=None, help="also write DPO pairs of the calibrated calls here")
    p.set_defaults(func=_main)


def register_export_dpo(export_subparsers: argparse._SubParsersAction) -> None:
    """`polar export dpo RUN_DIR --out FILE --counterfactual URL --budget N`: DPO pairs (original vs counterfactual
    action of AE calls with Δ > θ_AE) for an auxiliary objective. `polar export`'s parser calls this."""
    q = export_subparsers.add_parser(
        "dpo", help="DPO pairs from counterfactually calibrated AE calls (needs --counterfactual URL --budget N)"
    )
    q.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    q.add_argument("--out", required=True, type=Path)
    _counterfactual_arguments(q)
    q.set_defaults(func=_export_dpo_main)


def _counterfactual_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="CallCreditConfig as YAML or JSON")
    p.add_argument("--counterfactual", metavar="URL", default=None, help="calibrate through this rollout server")
    p.add_argument(
        "--alternative", choices=("next_best", "second_best", "plan"), default=None, help="what replaces call k"
    )
    p.add_argument("--plans", type=Path, default=None, help="JSON object: record id -> plan step (alternative plan)")
    p.add_argument("--budget", type=int, default=None, help="counterfactual runs in all")
    p.add_argument(
        "--select", choices=("credit", "uncertain"), default=None, help="which AE calls get the replay budget"
    )


def _load_config(path: Path | None) -> Any:
    from .config import CallCreditConfig

    if path is None:
        return CallCreditConfig()
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    return CallCreditConfig.model_validate(data)


def _resolve(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    """The config with the command line's counterfactual options applied, and the --plans mapping.

    Raises:
        ValueError, OSError, pydantic.ValidationError: a bad config, plans file or option combination.
    """
    cfg = _load_config(args.config)
    update = {
        k: v
        for k, v in (
            ("rollout_url", args.counterfactual),
            ("alternative", args.alternative),
            ("budget", args.budget),
            ("select", args.select),
        )
        if v is not None
    }
    if update:
        cf = cfg.counterfactual.model_validate({**cfg.counterfactual.model_dump(), **update})
        cfg = cfg.model_copy(update={"counterfactual": cf})
    plans = json.loads(args.plans.read_text()) if args.plans is not None else None
    if plans is not None and not isinstance(plans, dict):
        raise ValueError("--plans must hold a JSON object: record id -> plan step")
    cf = cfg.counterfactual
    if cf.rollout_url and cf.budget == 0:
        raise ValueError(
            "counterfactual calibration is off by default (counterfactual.budget = 0; it did not improve credit "
            "on the fidelity benchmark): pass --budget N to run N replays"
        )
    if cf.rollout_url and cf.alternative == "plan" and not plans:
        raise ValueError("alternative 'plan' needs --plans (record id -> the plan step that replaces it)")
    return cfg, plans


def export_dpo(
    run_dir: Path,
    out: Path,
    config: Any,
    *,
    runner: Any = None,
    plans: dict[str, Any] | None = None,
) -> int:
    """Calibrate `run_dir` (through `runner`, or the config's `counterfactual.rollout_url`), write the DPO pairs of
    the measured AE calls with Δ > θ_AE to `out` (`curation.dpo_pairs`); returns how many.

    Raises:
        ValueError: nothing was measured (no runner or URL, budget 0, or no successful trajectory).
    """
    from .runio import credit_run_dir

    result = credit_run_dir(run_dir, config, runner=runner, plans=plans)
    return _write_dpo(result, run_dir, out, config)


def _write_dpo(result: Any, run_dir: Path, out: Path, config: Any) -> int:
    from .curation import dpo_pairs, write_dpo_jsonl
    from .runio import load_records

    if not result.measurements:
        raise ValueError(
            "no counterfactual measurements: DPO pairs need calibrated calls (--counterfactual URL --budget N, "
            "and successful trajectories with AE calls)"
        )
    return write_dpo_jsonl(dpo_pairs(result.measurements, load_records(Path(run_dir)), config.curation), out)


def _main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from .runio import credit_run_dir

    try:
        cfg, plans = _resolve(args)
        if args.dpo is not None and not cfg.counterfactual.rollout_url:
            raise ValueError("--dpo needs counterfactual measurements: --counterfactual URL --budget N")
    except (ValidationError, ValueError, OSError) as exc:
        print(f"polar credit: bad config: {exc}", file=sys.stderr)
        return 2
    try:
        result = credit_run_dir(args.run_dir, cfg, out_name=args.out, plans=plans)
    except FileNotFoundError as exc:
        print(f"polar credit: {exc}", file=sys.stderr)
        return 2
    n_pairs = None
    if args.dpo is not None:
        try:
            n_pairs = _write_dpo(result, args.run_dir, args.dpo, cfg)
        except ValueError as exc:
            print(f"polar credit: {exc}", file=sys.stderr)
            return 1
    summary = result.summary()
    if args.json:
        print(json.dumps(summary | ({"dpo_pairs": n_pairs} if n_pairs is not None else {}), indent=2, default=str))
        return 0
    _print_tables(summary, args.run_dir / args.out)
    if "counterfactual" in summary:
        cf = summary["counterfactual"]
        print(f"counterfactual: {cf['runs']} run(s), mean Δ = {cf['mean_delta']:.3g}")
        for m in cf["measured"]:
            print(f"  {m['session_id']} {m['record_id']} {m['role']}: Δ = {m['delta']:.3g}")
    if n_pairs is not None:
        print(f"DPO pairs: {n_pairs} → {args.dpo}")
    return 0


def _export_dpo_main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        cfg, plans = _resolve(args)
        if not cfg.counterfactual.rollout_url:
            raise ValueError("DPO pairs need counterfactual measurements: --counterfactual URL --budget N")
    except (ValidationError, ValueError, OSError) as exc:
        print(f"polar export dpo: bad config: {exc}", file=sys.stderr)
        return 2
    try:
        n = export_dpo(args.run_dir, args.out, cfg, plans=plans)
    except FileNotFoundError as exc:
        print(f"polar export dpo: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"polar export dpo: {exc}", file=sys.stderr)
        return 1
    print(f"DPO pairs: {n} → {args.out}")
    return 0


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _print_tables(summary: dict[str, Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]CALL-CREDIT[/bold]: {summary['sessions']} sessions, {summary['calls']} calls → {out}")
    hk, hb = summary["reward_hacking"], summary["reward_hacking_broadcast"]
    t = Table(title="Reward-hacking rate (successful trajectories where IG credit significantly exceeds AE)")
    for col in ("harness", "successful", "CALL-CREDIT", "outcome broadcast"):
        t.add_column(col)
    for h, d in sorted(hk["per_harness"].items()):
        t.add_row(h, str(d["n_successful"]), _fmt(d["rate"]), _fmt(hb["per_harness"].get(h, {}).get("rate")))
    t.add_row("all", str(hk["n_successful"]), _fmt(hk["rate"]), _fmt(hb["rate"]))
    con.print(t)
    t = Table(title="Per-role credit Â_v")
    for col in ("harness", "role", "n", "mean", "std", "p10", "p50", "p90", "mass share"):
        t.add_column(col)
    for h, roles in sorted(summary["role_distributions"].items()):
        for role, d in roles.items():
            t.add_row(
                h,
                role,
                _fmt(int(d["n"])),
                *(_fmt(d[k]) for k in ("mean", "std", "p10", "p50", "p90")),
                _fmt(d["mass_share"]),
            )
    con.print(t)
    t = Table(title="Weaknesses")
    for col in ("harness", "sessions", "unused reads", "unverified edits", "failed verifications not corrected"):
        t.add_column(col)
    for h, w in sorted(summary["weaknesses"].items()):
        t.add_row(
            h,
            str(w["sessions"]),
            f"{w['unused_reads']['count']}/{w['reads']} ({_fmt(w['unused_reads']['rate'])})",
            f"{w['unverified_edits']['count']}/{w['edits']} ({_fmt(w['unverified_edits']['rate'])})",
            f"{w['uncorrected_failures']['count']}/{w['failed_verifications']} "
            f"({_fmt(w['uncorrected_failures']['rate'])})",
        )
    con.print(t)

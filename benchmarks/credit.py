# SPDX-License-Identifier: Apache-2.0
"""CALL-CREDIT cost: annotation + assignment + fusion for a GRPO batch (issue 8's bar: 64 × 50 calls, 32k rows).

    .venv/bin/python benchmarks/credit.py [--trajectories 64] [--calls 50] [--row-tokens 32768] [--repeat 3]

What runs: synthetic but realistic coding-agent sessions built as real `CompletionRecord`s (Claude-Code-style
tools: Grep/Read/Glob/Edit/Bash with sed/pytest/cat/git; observations of 0.3–3 KB with file content, grep hits,
pytest output; OpenAI-Chat history repeated in every request as the proxy stores it). Timed: `annotate` of
every session (roles + causal graph), `assign` (GRPO Â_τ over groups of 8 + propagation), and `fuse_batch` into a
[B, row_tokens] float32 advantage tensor with each call's span (prefix_merging layout: generation tokens
trainable, interstitial tokens masked). Building the records is not timed. The bar is ≤ 10 s (wall) for the
full batch on this CPU, with linear scaling: printed as CPU seconds per trajectory at 1/4, 1/2 and the full
batch, and per call at half and double the calls per trajectory, for `graph.source` `all` (the default: an
artifact links every earlier call that introduced it, so a file touched by many calls gives O(n²) edges) and
`latest` (one edge per reference).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch
from nemo_polar.credit import annotate, assign, fuse_batch
from nemo_polar.credit.config import CallCreditConfig

from nemo_polar.types import CompletionRecord

_CODE = "\n".join(f"{k + 1:>6}\tdef helper_{k}(x):\n        return compute_{k % 7}(x) + {k}" for k in range(40))
_PYTEST_FAIL = (
    "F..\n=================================== FAILURES ===================================\n"
    "E   AssertionError: assert 3 == 4\nsrc/pkg/mod{m}.py:42: AssertionError\n"
    "FAILED tests/test_mod{m}.py::test_case_{m} - AssertionError\n1 failed, 2 passed in 0.31s"
)


def _step(rng: random.Random, k: int, n: int) -> tuple[str, dict[str, Any], str]:
    m = rng.randrange(12)
    frac = k / max(n - 1, 1)
    r = rng.random()
    if frac < 0.4 or r < 0.35:
        kind = rng.choice(["grep", "read", "glob", "cat", "git"])
        if kind == "grep":
            hits = "\n".join(
                f"src/pkg/mod{rng.randrange(12)}.py:{rng.randrange(300)}: compute_{m}(x)" for _ in range(15)
            )
            return "Grep", {"pattern": f"compute_{m}", "path": "src"}, hits
        if kind == "read":
            return "Read", {"file_path": f"/repo/src/pkg/mod{m}.py"}, _CODE[: rng.randrange(800, 3000)]
        if kind == "glob":
            return "Glob", {"pattern": "**/*.py"}, "\n".join(f"/repo/src/pkg/mod{i}.py" for i in range(12))
        if kind == "cat":
            return "Bash", {"command": f"cat src/pkg/mod{m}.py | head -80"}, _CODE[:1500]
        return (
            "Bash",
            {"command": "git diff --stat && git status --short"},
            f" src/pkg/mod{m}.py | 4 ++--\n M src/pkg/mod{m}.py",
        )
    if r < 0.7:
        if rng.random() < 0.5:
            return (
                "Edit",
                {
                    "file_path": f"/repo/src/pkg/mod{m}.py",
                    "old_string": f"compute_{m}(x) + {m}",
                    "new_string": f"compute_{m}(x) - {m}",
                },
                f"The file /repo/src/pkg/mod{m}.py has been updated.",
            )
        return "Bash", {"command": f"sed -i 's/compute_{m}(x)/compute_{m}(x, y)/' src/pkg/mod{m}.py"}, ""
    if rng.random() < 0.5:
        return "Bash", {"command": f"python -m pytest tests/test_mod{m}.py -q"}, _PYTEST_FAIL.format(m=m)
    return "Bash", {"command": "cd /repo && pytest -q 2>&1 | tail -5"}, "........\n8 passed in 1.02s"


def make_batch(
    n_traj: int, n_calls: int, row_tokens: int, seed: int = 0
) -> tuple[list[list[CompletionRecord]], list[float]]:
    rng = random.Random(seed)
    per_call = row_tokens // n_calls
    gen_len = max(1, int(per_call * 0.6))
    sessions, rewards = [], []
    for t in range(n_traj):
        sid = f"s{t}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "agent"},
            {"role": "user", "content": "Fix it."},
        ]
        recs = []
        for k in range(n_calls):
            tool, args, obs = _step(rng, k, n_calls) if k < n_calls - 1 else (None, {}, "")
            cid = f"c{t}_{k}"
            tcs = (
                []
                if tool is None
                else [{"id": cid, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]
            )
            recs.append(
                CompletionRecord(
                    id=f"{sid}-r{k}",
                    session_id=sid,
                    seq=k,
                    dialect="openai_chat",
                    request={"messages": list(messages)},
                    response={"content": "" if tool else "done", "reasoning": None, "tool_calls": tcs},
                    generation_token_ids=[1] * gen_len,
                    generation_log_probs=[-0.1] * gen_len,
                )
            )
            messages = [*messages, {"role": "assistant", "content": "", "tool_calls": tcs}]
            if tool is not None:
                messages.append({"role": "tool", "tool_call_id": cid, "content": obs})
        sessions.append(recs)
        rewards.append(float(rng.random() < 0.5))
    return sessions, rewards


def run_once(
    sessions: list[list[CompletionRecord]], rewards: list[float], row_tokens: int, cfg: CallCreditConfig
) -> dict[str, float]:
    c0 = time.process_time()
    t0 = time.perf_counter()
    graphs = [annotate(recs, harness="claude_code", config=cfg) for recs in sessions]
    t1 = time.perf_counter()
    groups = [i // 8 for i in range(len(sessions))]
    assigns = assign(graphs, rewards, cfg, group_ids=groups)
    t2 = time.perf_counter()
    b = len(sessions)
    n_calls = len(sessions[0])
    per_call = row_tokens // n_calls
    gen_len = len(sessions[0][0].generation_token_ids)
    mask = torch.zeros(b, row_tokens, dtype=torch.int8)
    spans = []
    for _ in range(b):
        row = []
        for k in range(n_calls):
            s = k * per_call
            row.append((s, s + gen_len, k))
        spans.append(row)
    # the mask is the trainer's input, not our work: build it outside the timed region
    t2b = time.perf_counter()
    c2b = time.process_time()
    for i in range(b):
        for s, e, _ in spans[i]:
            mask[i, s:e] = 1
    t3 = time.perf_counter()
    c3 = time.process_time()
    adv = fuse_batch(
        mask, spans, torch.tensor([a.advantage for a in assigns]), [a.credit for a in assigns], cfg.fusion.alpha
    )
    t4 = time.perf_counter()
    c4 = time.process_time()
    assert adv.shape == (b, row_tokens)
    return {
        "annotate_s": t1 - t0,
        "assign_s": t2 - t1,
        "fuse_s": t4 - t3,
        "total_s": (t2b - t0) + (t4 - t3),
        "cpu_s": (c2b - c0) + (c4 - c3),
    }


def measure(n_traj: int, n_calls: int, row_tokens: int, repeat: int, cfg: CallCreditConfig) -> dict[str, float]:
    sessions, rewards = make_batch(n_traj, n_calls, row_tokens)
    runs = [run_once(sessions, rewards, row_tokens, cfg) for _ in range(repeat)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--row-tokens", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = CallCreditConfig()
    T, C, S = args.trajectories, args.calls, args.row_tokens
    full = measure(T, C, S, args.repeat, cfg)
    print(f"CALL-CREDIT, {T} trajectories × {C} calls, rows of {S} tokens (median of {args.repeat}, 1 thread):")
    print(
        f"  wall: annotate {full['annotate_s']:.3f} s   assign {full['assign_s']:.3f} s   fuse {full['fuse_s']:.3f} s"
        f"   total {full['total_s']:.3f} s   (bar ≤ 10 s: {'PASS' if full['total_s'] <= 10 else 'FAIL'})"
    )
    print(f"  CPU of this process: {full['cpu_s']:.3f} s (the machine is shared: scaling below uses CPU seconds)")
    per_traj = {}
    for t in (max(1, T // 4), max(1, T // 2)):
        per_traj[t] = measure(t, C, S, args.repeat, cfg)["cpu_s"] / t
    per_traj[T] = full["cpu_s"] / T
    print("  scaling in trajectories (CPU per trajectory):")
    for t, v in per_traj.items():
        print(f"    {t:>4} trajectories: {v * 1e3:8.2f} ms/trajectory   ratio to the full batch {v / per_traj[T]:.2f}")
    tq = max(1, T // 4)
    per_call: dict[str, dict[int, float]] = {}
    for source in ("all", "latest"):
        c_cfg = cfg.model_copy(update={"graph": cfg.graph.model_copy(update={"source": source})})
        per_call[source] = {
            c: measure(tq, c, S, args.repeat, c_cfg)["cpu_s"] / (tq * c) for c in (max(2, C // 2), C, 2 * C)
        }
        print(f"  scaling in calls per trajectory, graph.source={source!r} (CPU per call, {tq} trajectories):")
        for c, v in per_call[source].items():
            print(f"    {c:>4} calls: {v * 1e6:8.1f} µs/call   ratio to {C} calls {v / per_call[source][C]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"full": full, "per_trajectory_cpu_s": per_traj, "per_call_cpu_s": per_call}, f, indent=2)


if __name__ == "__main__":
    main()

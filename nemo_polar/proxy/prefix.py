# SPDX-License-Identifier: Apache-2.0
"""Prefix-preserving generation against stock vLLM (docs/contracts.md): the proxy splices the chain tip itself.

Chat templates re-render history (Qwen3 drops `<think>` blocks; with thinking off every generation prompt ends in an
empty `<think>\\n\\n</think>\\n\\n` that the re-rendered history lacks), so the prompt of call n+1 rendered from
messages does not start with prompt n + generation n. Here the new prompt is built as

    chain tip (the previous main call's prompt ids + generation ids, EOT appended when the generation was cut)
    + the tokens of the template's *new tail* (everything the template renders after the assistant turn that the
      tip ended with: tool results, a new user turn, the generation prompt),

and generated from token ids with `/v1/completions`; tool calls are parsed from the text (Hermes format). The tail
is found by rendering the history up to the last assistant message and locating, in the full rendering, the end of
that many end-of-turn markers, so re-rendering differences inside earlier turns do not matter.

Needs `transformers` (the model's own tokenizer and chat template, from the model directory); imported lazily.
Against NeMo RL's exposed vLLM server this module is not used: the engine sends `required_prefix_token_ids`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_polar.errors import PolarError

__all__ = ["PrefixSplicer", "SpliceError"]


class SpliceError(PolarError, RuntimeError):
    """The new request cannot be spliced onto the chain tip (the caller falls back to a normal generation)."""


class PrefixSplicer:
    """Renders the new tail of a conversation with the model's chat template and splices it onto a chain tip.

    Args:
        model_dir: a folder with `tokenizer.json` and `tokenizer_config.json` (with `chat_template`).
        chat_template: a template file overriding the tokenizer's (what vLLM was started with).
        eot_token_ids: end-of-turn ids; default: the tokenizer's `eos_token` and `<|im_end|>` when present.
    """

    def __init__(
        self, model_dir: str | Path, *, chat_template: str | Path | None = None, eot_token_ids: list[int] | None = None
    ):
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        self.chat_template = Path(chat_template).read_text() if chat_template else None
        if eot_token_ids:
            self.eot_token_ids = list(eot_token_ids)
        else:
            ids = []
            for tok in (self.tokenizer.eos_token, "<|im_end|>"):
                if tok:
                    tid = self.tokenizer.convert_tokens_to_ids(tok)
                    if isinstance(tid, int) and tid >= 0 and tid != self.tokenizer.unk_token_id and tid not in ids:
                        ids.append(tid)
            self.eot_token_ids = ids
        if not self.eot_token_ids:
            raise ValueError(f"no end-of-turn token found for {model_dir}")
        self.eot_texts: list[str] = [str(self.tokenizer.convert_ids_to_tokens(i)) for i in self.eot_token_ids]
        self._turn_end: int | None = None

    def turn_end_id(self) -> int:
        """The end-of-turn id the template closes an assistant turn with (ChatML: `<|im_end|>`)."""
        if self._turn_end is None:
            msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
            text = self.render(msgs, None, add_generation_prompt=False)
            after = text[text.rfind("a") + 1 :]
            hits = [(after.find(t), i) for i, t in enumerate(self.eot_texts) if t in after]
            self._turn_end = self.eot_token_ids[min(hits)[1]] if hits else self.eot_token_ids[0]
        return self._turn_end

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        out = self.tokenizer.apply_chat_template(
            _for_template(messages),
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            chat_template=self.chat_template,
            **(chat_template_kwargs or {}),
        )
        return str(out)

    def splice(
        self,
        tip: list[int],
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The spliced prompt ids: `tip` (+EOT when missing) followed by the template's new tail."""
        last_asst = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        if last_asst < 0:
            raise SpliceError("no assistant turn in the request: nothing to splice onto")
        hist = self.render(
            messages[: last_asst + 1], tools, add_generation_prompt=False, chat_template_kwargs=chat_template_kwargs
        )
        full = self.render(messages, tools, add_generation_prompt=True, chat_template_kwargs=chat_template_kwargs)
        # the template's own turn terminator is the end-of-turn token it renders most (ChatML: <|im_end|>)
        n_turns, k = max((hist.count(t), i) for i, t in enumerate(self.eot_texts))
        if n_turns == 0:
            raise SpliceError("the template renders none of the end-of-turn tokens")
        eot_text = self.eot_texts[k]
        pos = -len(eot_text)
        for _ in range(n_turns):
            pos = full.find(eot_text, pos + len(eot_text))
            if pos < 0:
                raise SpliceError("the full rendering has fewer turns than the history")
        tail = full[pos + len(eot_text) :]
        tail_ids = self.tokenizer.encode(tail, add_special_tokens=False)
        prefix = list(tip)
        if not prefix or prefix[-1] not in self.eot_token_ids:
            prefix.append(self.eot_token_ids[k])  # a generation cut by max_tokens: close its turn as the template does
        return prefix + list(tail_ids)


def _for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Templates (Qwen3's, Hermes) expect tool-call arguments as objects and string contents."""
    out = []
    for m in messages:
        m2 = dict(m)
        content = m2.get("content")
        if isinstance(content, list):
            m2["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if m2.get("tool_calls"):
            calls = []
            for tc in m2["tool_calls"]:
                fn = dict(tc.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args) if args else {}
                    except ValueError:
                        pass
                calls.append({**tc, "function": fn})
            m2["tool_calls"] = calls
        out.append(m2)
    return out

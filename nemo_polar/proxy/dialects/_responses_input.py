# SPDX-License-Identifier: Apache-2.0
"""OpenAI Responses input, normalised: the `input` items and `tools` of a stateless Responses request as OpenAI-Chat
messages and tools (`nemo_polar.proxy.dialects.openai_responses.parse_request` uses it).

Message items with input_text/output_text parts; reasoning items → `reasoning_content` of the assistant turn they
open; function_call / function_call_output and custom_tool_call(_output) items → tool calls / tool messages with
canonical ids; `additional_tools` items add tools. Tools: `function`; `namespace` (inner tools flattened to
`<namespace>__<name>`, with the map back for rendering); `custom` (freeform: a function with one string argument
`input`); hosted tools are dropped and listed. Does no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_polar.proxy.dialects import _common as common

HOSTED_TOOLS = {
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "local_shell",
    "mcp",
    "tool_search",
}


def flat_name(namespace: str, name: str) -> str:
    """The flattened name of a namespace's inner tool (`mcp__srv` + `ls` → `mcp__srv__ls`, `ns` + `f` → `ns__f`)."""
    return namespace + name if namespace.endswith(("_", ".", "/")) else f"{namespace}__{name}"


class ToolSet:
    """Tools in OpenAI-Chat form plus the map from flattened names back to Responses tool kinds."""

    def __init__(self, extra: dict[str, Any]):
        self.tools: list[dict[str, Any]] = []
        self.map: dict[str, dict[str, Any]] = {}  # flat name → {"kind", "name", "namespace"?}
        self.extra = extra

    def add(self, v: Any, path: str, namespace: str | None = None) -> None:
        if v is None:
            return
        if not isinstance(v, list):
            common.bad(f"{path}: expected an array", param=path)
        for i, t in enumerate(v):
            self._one(common.as_dict(t, f"{path}[{i}]"), f"{path}[{i}]", namespace)

    def _one(self, t: dict[str, Any], path: str, namespace: str | None) -> None:
        kind = t.get("type")
        if kind == "namespace" and namespace is None:
            ns = common.check_tool_name(t.get("name"), f"{path}.name")
            inner = common.opt_list(t, "tools", f"{path}.tools", required=True)
            self.add(inner, f"{path}.tools", ns)
            return
        if kind in ("function", "custom"):
            name, desc = common.tool_header(t, path)
            flat = flat_name(namespace, name) if namespace else name
            if kind == "function":
                params = common.schema_dict(t.get("parameters"), f"{path}.parameters")
            else:
                params = _custom_schema(common.opt_dict(t, "format", f"{path}.format"), f"{path}.format")
            self.tools.append(common.function_tool(flat, desc, params))
            if kind == "custom" or namespace:
                entry: dict[str, Any] = {"kind": kind, "name": name}
                if namespace:
                    entry["namespace"] = namespace
                self.map[flat] = entry
            return
        if isinstance(kind, str) and (kind in HOSTED_TOOLS or kind.startswith("web_search")):
            self.extra.setdefault("dropped_tools", []).append(kind)
            return
        common.bad(f"{path}.type: unsupported tool type {kind!r}", param=f"{path}.type")


def _custom_schema(fmt: dict[str, Any] | None, path: str) -> dict[str, Any]:
    """A freeform custom tool as a function with one string argument; a grammar format goes into its description."""
    prop: dict[str, Any] = {"type": "string"}
    if fmt is not None and fmt.get("type") == "grammar":
        syntax = common.opt_str(fmt, "syntax", f"{path}.syntax") or "grammar"
        definition = common.opt_str(fmt, "definition", f"{path}.definition") or ""
        prop["description"] = f"Freeform input matching this {syntax} grammar:\n{definition}"
    return {"type": "object", "properties": {"input": prop}, "required": ["input"]}


# -------------------------------------------------------------------------------------------- normalise


class InputItems:
    """Walks input items; reasoning, assistant messages and calls accumulate into one assistant turn."""

    def __init__(self, ids: common.CallIds, tools: ToolSet, system_texts: list[str], extra: dict[str, Any]):
        self.ids = ids
        self.tools = tools
        self.system_texts = system_texts
        self.extra = extra
        self.out: list[dict[str, Any]] = []
        self._parts: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []
        self._reasoning: list[str] = []
        self._pending = False

    def run(self, items: list[Any]) -> list[dict[str, Any]]:
        for i, it in enumerate(items):
            self._item(common.as_dict(it, f"input[{i}]"), f"input[{i}]")
        self._flush()
        return self.out

    def _flush(self) -> None:
        if not self._pending:
            return
        reasoning = "\n".join(self._reasoning) if self._reasoning else None
        self.out.append(common.assistant_message(common.collapse_parts(self._parts), self._calls, reasoning))
        self._parts, self._calls, self._reasoning, self._pending = [], [], [], False

    def _item(self, it: dict[str, Any], path: str) -> None:
        kind = it.get("type")
        if kind is None or kind == "message":
            self._message(it, path)
        elif kind == "reasoning":
            self._pending = True
            texts = [
                common.req_str(common.as_dict(c, f"{path}.content[{k}]"), "text", f"{path}.content[{k}].text")
                for k, c in enumerate(common.opt_list(it, "content", f"{path}.content") or [])
            ]
            if not texts:
                texts = [
                    common.req_str(common.as_dict(s, f"{path}.summary[{k}]"), "text", f"{path}.summary[{k}].text")
                    for k, s in enumerate(common.opt_list(it, "summary", f"{path}.summary") or [])
                ]
            if texts:
                self._reasoning.append("\n".join(texts))
        elif kind in ("function_call", "custom_tool_call"):
            self._call(it, path, kind)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self._flush()
            cid = self.ids.result(common.req_str(it, "call_id", f"{path}.call_id", nonempty=True))
            self.out.append(common.tool_message(cid, self.ids, _content(it.get("output"), f"{path}.output")))
        elif kind == "additional_tools":
            self.tools.add(common.opt_list(it, "tools", f"{path}.tools", required=True), f"{path}.tools")
        elif kind == "web_search_call":
            self.extra.setdefault("dropped_items", []).append(kind)
        else:
            common.bad(f"{path}.type: unsupported input item type {kind!r}", param=f"{path}.type")

    def _message(self, it: dict[str, Any], path: str) -> None:
        role = it.get("role")
        content = _content(it.get("content"), f"{path}.content")
        if role in ("system", "developer"):
            if not isinstance(content, str):
                common.bad(f"{path}.content: {role} messages take text only", param=f"{path}.content")
            self.system_texts.append(content)
        elif role == "user":
            self._flush()
            self.out.append({"role": "user", "content": content})
        elif role == "assistant":
            self._pending = True
            if isinstance(content, str):
                if content:
                    self._parts.append(common.text_part(content))
            else:
                self._parts.extend(content)
        else:
            common.bad(
                f"{path}.role: must be user, assistant, system or developer; got {role!r}", param=f"{path}.role"
            )

    def _call(self, it: dict[str, Any], path: str, kind: str) -> None:
        self._pending = True
        call_id = common.req_str(it, "call_id", f"{path}.call_id", nonempty=True)
        name = common.check_tool_name(it.get("name"), f"{path}.name")
        ns = common.opt_str(it, "namespace", f"{path}.namespace")
        if ns:
            name = flat_name(ns, name)
        if kind == "function_call":
            args = common.canonical_arguments(common.req_str(it, "arguments", f"{path}.arguments") or "{}")
        else:
            args = json.dumps({"input": common.req_str(it, "input", f"{path}.input")}, ensure_ascii=False)
        self._calls.append(common.tool_call_dict(self.ids.new_call(call_id, name), name, args))


_TEXT_PARTS = ("input_text", "output_text", "text")


def _image(p: dict[str, Any], ppath: str) -> dict[str, Any]:
    url = common.opt_str(p, "image_url", f"{ppath}.image_url")
    if not url:
        common.bad(f"{ppath}.image_url: an image URL is required (file ids are not supported)", param=ppath)
    return common.image_part(url, common.opt_str(p, "detail", f"{ppath}.detail"))


def _content(v: Any, path: str) -> str | list[dict[str, Any]]:
    return "" if v is None else common.content_parts(v, path, _TEXT_PARTS, ("input_image", _image))

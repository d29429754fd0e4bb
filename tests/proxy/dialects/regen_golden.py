# SPDX-License-Identifier: Apache-2.0
"""Golden normal forms of the requests captured from the real CLIs: computing them, and the command that rewrites them.

For each capture `tests/data/cli_requests/<variant>.json` (see that folder's README for how the captures were taken),
`tests/data/cli_requests/expected/<variant>.json` holds what the proxy's dialect parser makes of every model request
in it: the record's `request` (`model`, `messages`, `tools`, `tool_choice`, `response_format`, the caller's
`sampling`) plus `stream`, `include_usage` and `reasoning`. `test_golden.py` compares against these files and never
writes them. After a deliberate change to the normal form, or after a re-capture, rewrite them and review the diff
by eye (system prompt placement, tool schemas, no `cache_control`, no billing header, part arrays collapsed, …):

    .venv/bin/python -m tests.proxy.dialects.regen_golden            # every capture
    .venv/bin/python -m tests.proxy.dialects.regen_golden codex pi   # some

This is a test-data tool, not part of the product.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nemo_polar.proxy.dialects import detect

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "cli_requests"
GOLDEN = CAPTURES / "expected"
# the first request of each of the six real CLIs must be covered (issue 4); variants and extra harnesses may add more
SIX_CLIS = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi")
REGEN = ".venv/bin/python -m tests.proxy.dialects.regen_golden"


def captured_variants() -> list[str]:
    """Every capture file's stem (the variant name), sorted."""
    return sorted(p.stem for p in CAPTURES.glob("*.json"))


def model_requests(variant: str) -> list[tuple[int, dict[str, Any], Any]]:
    """(index in the capture, captured request, parsed ChatRequest) for each request a dialect serves."""
    data = json.loads((CAPTURES / f"{variant}.json").read_text())
    out = []
    for i, req in enumerate(data["requests"]):
        query = "&".join(f"{k}={v}" for k, v in req["query"].items())
        hit = detect(req["method"], req["path"] + (f"?{query}" if query else ""), req["headers"])
        if hit is None:
            continue
        module, route = hit
        body = req["body"]
        out.append((i, req, module.parse_request(body.encode() if isinstance(body, str) else body, route)))
    return out


def normal_forms(variant: str) -> dict[str, Any]:
    """The golden document of one capture."""
    data = json.loads((CAPTURES / f"{variant}.json").read_text())
    entries = []
    for i, req, parsed in model_requests(variant):
        entries.append(
            {
                "index": i,
                "method": req["method"],
                "path": req["path"],
                "dialect": parsed.dialect,
                "stream": parsed.stream,
                "include_usage": parsed.include_usage,
                "reasoning": parsed.reasoning,
                "request": parsed.normalized_dict(),
            }
        )
    return {
        "capture": f"{variant}.json",
        "harness": data["harness"],
        "version": data["version"],
        "first_model_request": data["first_model_request"],
        "regenerate": REGEN + " " + variant,
        "requests": entries,
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="*", help="capture names (default: all)")
    args = parser.parse_args(argv)
    names = args.variants or captured_variants()
    GOLDEN.mkdir(exist_ok=True)
    for name in names:
        path = GOLDEN / f"{name}.json"
        new = dumps(normal_forms(name))
        old = path.read_text() if path.exists() else None
        path.write_text(new)
        print(f"{name}: {'unchanged' if old == new else 'written'} -> {path.relative_to(CAPTURES.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

# SPDX-License-Identifier: Apache-2.0
"""A scripted model client run as a harness through the `shell` adapter (test helper, stdlib only): it makes N
OpenAI Chat calls to the proxy (`POLAR_BASE_URL`, `POLAR_API_KEY`), streaming every third one, never retrying, and
prints one JSON summary line: how many calls got a reply, an HTTP error, a stream cut before its end (its headers came
early: `stream_headers_after_s`), or no answer within its client timeout.

    python chat_loop.py N
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    n = int(sys.argv[1])
    url = os.environ["POLAR_BASE_URL"].rstrip("/") + "/v1/chat/completions"
    key = os.environ["POLAR_API_KEY"]
    out = {"calls": 0, "ok": 0, "http_error": 0, "cut": 0, "client_timeout": 0, "other": 0}
    for i in range(n):
        stream = i % 3 == 2
        body = {
            "model": os.environ.get("POLAR_MODEL", "m"),
            "max_tokens": 8,
            "stream": stream,
            "messages": [{"role": "user", "content": f"call {i}: say hi"}],
        }
        req = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        out["calls"] += 1
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                try:
                    data = resp.read()
                except (http.client.IncompleteRead, ConnectionError):
                    if not stream:
                        raise
                    out["cut"] += 1  # a 200 whose stream was dropped: the proxy's answer to a failure after headers
                    continue
            if stream and b"[DONE]" not in data:
                out["other"] += 1  # a stream that ended without its terminal event
            else:
                out["ok"] += 1
        except urllib.error.HTTPError:
            out["http_error"] += 1
        except TimeoutError:
            out["client_timeout"] += 1
        except (urllib.error.URLError, ConnectionError):
            out["other"] += 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

# SPDX-License-Identifier: Apache-2.0
"""SIGKILL durability: `polar proxy` killed with -9 mid-session loses nothing a client received.

The proxy runs as a real subprocess (`python -m nemo_polar.cli proxy …`) in front of a FAKE upstream subprocess that
streams slowly (so a stream is reliably in flight at the kill). After a restart on the same store: every record
whose terminal part a client received is there, the stream that was cut mid-way is a failure record, the session
and its key survived, and sequence numbers continue. Streams delivered before the kill end with each dialect's own
terminal part (`[DONE]`, `message_stop`, `response.completed`, the Google chunk carrying `finishReason`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from nemo_polar.backend.server import free_port
from tests.proxy.conftest import http_json

TOKEN = "durability-control-token"


def _wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up in {timeout_s}s")


def _start_proxy(port: int, upstream: str, store: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "POLAR_CONTROL_TOKEN": TOKEN}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nemo_polar.cli",
            "proxy",
            "--upstream",
            upstream,
            "--port",
            str(port),
            "--store",
            store,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_http(f"http://127.0.0.1:{port}/")
    return p


# complete streams in the other three dialects: (path, key header, body, terminal part, text of a data payload)
STREAMS = [
    (
        "/v1/messages?beta=true",
        "x-api-key",
        {"model": "claude-x", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "a0"}]},
        b"event: message_stop",
        lambda d: d.get("delta", {}).get("text", "") if d.get("type") == "content_block_delta" else "",
    ),
    (
        "/v1/responses",
        "authorization",
        {"model": "m", "input": "r0", "stream": True},
        b"event: response.completed",
        lambda d: d.get("delta", "") if d.get("type") == "response.output_text.delta" else "",
    ),
    (
        "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
        "x-goog-api-key",
        {"contents": [{"role": "user", "parts": [{"text": "g0"}]}]},
        b'"finishReason"',
        lambda d: "".join(p.get("text", "") for c in d.get("candidates", []) for p in c["content"].get("parts", [])),
    ),
]


def _stream_text(url: str, header: str, key: str, body: dict[str, object], terminal: bytes, text_of) -> str:
    value = f"Bearer {key}" if header == "authorization" else key
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={header: value, "content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()  # the whole stream, terminal part included
    assert terminal in raw, raw[-300:]
    payloads = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    return "".join(text_of(json.loads(d)) for d in payloads if d != "[DONE]")


@pytest.mark.slow
def test_sigkill_mid_session_loses_no_delivered_record(tmp_path):
    up_port, px_port = free_port(), free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "polar_lab.fake_upstream", "--port", str(up_port), "--chunk-delay-s", "0.05"],
        cwd=Path(__file__).resolve().parents[2],  # polar_lab lives at the repository root
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs = [upstream]
    try:
        _wait_http(f"http://127.0.0.1:{up_port}/health")
        base = f"http://127.0.0.1:{px_port}"
        store = str(tmp_path / "store")
        proxy = _start_proxy(px_port, f"http://127.0.0.1:{up_port}", store)
        procs.append(proxy)
        status, s = http_json(
            "POST", base + "/sessions", {"task_id": "dur"}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 201
        client = openai.OpenAI(base_url=base + "/v1", api_key=s["api_key"], max_retries=0, timeout=60)
        delivered = []
        for i in range(4):
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
            delivered.append(r.choices[0].message.content)
        for i in range(2):  # complete streams: the client saw [DONE]
            text = "".join(
                ch.choices[0].delta.content or ""
                for ch in client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"s{i}"}], stream=True
                )
                if ch.choices
            )
            delivered.append(text)
        for path, header, body, terminal, text_of in STREAMS:
            delivered.append(_stream_text(base + path, header, s["api_key"], body, terminal, text_of))
        assert all(delivered)

        got_chunks = threading.Event()
        outcome: dict[str, object] = {}

        def cut_stream() -> None:
            try:
                n = 0
                for _ in client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "cut"}], stream=True
                ):
                    n += 1
                    if n >= 3:
                        got_chunks.set()
                outcome["finished"] = True
            except Exception as exc:  # the proxy dies under this client
                outcome["error"] = exc
            finally:
                got_chunks.set()

        t = threading.Thread(target=cut_stream)
        t.start()
        assert got_chunks.wait(30)
        proxy.send_signal(signal.SIGKILL)
        proxy.wait(10)
        t.join(30)
        assert "finished" not in outcome  # the client did not get the terminal part

        proxy2 = _start_proxy(px_port, f"http://127.0.0.1:{up_port}", store)
        procs.append(proxy2)
        status, page = http_json(
            "GET", f"{base}/sessions/{s['session_id']}/records?limit=100", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 200
        recs = page["records"]
        ok = [r for r in recs if r["error"] is None]
        assert [r["response"]["content"] for r in ok] == delivered
        assert all(r["prompt_token_ids"] and r["generation_token_ids"] for r in ok)
        failed = [r for r in recs if r["error"] is not None]
        assert len(failed) == 1 and failed[0]["error"]["type"] == "interrupted"
        assert failed[0]["original_request"]["messages"][0]["content"] == "cut"
        # the session and its key survived; numbering continues after the interrupted call
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "after"}])
        status, page = http_json(
            "GET",
            f"{base}/sessions/{s['session_id']}/records?after_seq={recs[-1]['seq']}",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert [r["seq"] for r in page["records"]] == [recs[-1]["seq"] + 1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)

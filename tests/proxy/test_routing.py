# SPDX-License-Identifier: Apache-2.0
"""Upstream routing modes: `round_robin` (the reference design) spreads one session's requests over every endpoint
and still fails over on connect errors; an unknown mode is refused at start-up. Sticky routing is covered in
`test_app.py`. Upstreams are the proxy's FAKE vLLM responders (routing only; nothing here depends on a model)."""

from __future__ import annotations

import openai
import pytest

from nemo_polar.proxy.app import Proxy, ProxyConfig
from nemo_polar.proxy.engines.base import Upstreams

MSG = [{"role": "user", "content": "hi"}]


def _oa(h, key):
    return openai.OpenAI(base_url=h.base_url + "/v1", api_key=key, max_retries=0)


def test_round_robin_alternates_endpoints_within_a_session_and_fails_over(fake_upstream, make_proxy, loop_thread):
    a, b = fake_upstream(), fake_upstream()
    h = make_proxy([a.base_url, b.base_url], routing="round_robin")
    s = h.session()
    for _ in range(4):
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
    endpoints = [r.upstream["endpoint"] for r in sorted(h.records(s.session_id), key=lambda r: r.seq)]
    assert endpoints in ([a.base_url, b.base_url] * 2, [b.base_url, a.base_url] * 2)
    assert len(a.requests) == len(b.requests) == 2
    loop_thread.run(a.stop())  # A goes away: every request lands on B, the failed connect recorded
    for _ in range(2):
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
    last = sorted(h.records(s.session_id), key=lambda r: r.seq)[-2:]
    assert all(r.upstream["endpoint"] == b.base_url for r in last)
    assert sum(1 for r in last if r.upstream.get("failover")) == 1  # one of the two started at A
    assert len(b.requests) == 4


def test_order_per_mode_and_unknown_mode_refused(tmp_path):
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    sticky = Upstreams(urls)
    assert len({tuple(sticky.order("session-x")) for _ in range(5)}) == 1
    rr = Upstreams(urls, routing="round_robin")
    firsts = [rr.order("session-x")[0] for _ in range(6)]
    assert firsts == urls * 2
    assert sorted(rr.order("session-x")) == urls  # every endpoint stays a failover candidate
    with pytest.raises(ValueError, match="unknown routing"):
        Upstreams(urls, routing="random")
    with pytest.raises(ValueError, match="unknown routing"):
        Proxy(ProxyConfig(upstreams=urls, store_dir=str(tmp_path), routing="least_loaded"))

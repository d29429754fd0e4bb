# SPDX-License-Identifier: Apache-2.0
"""`GET /sessions/{id}/records`: plain JSON arrays for token ids and logprobs by default, the store's compact
base64 form with `?encoding=compact`, a 400 for any other encoding (issue 22 item 5).

The upstream is the FAKE vLLM server (`polar_lab.fake_upstream`): its answers carry known ids and logprobs.
"""

from __future__ import annotations

from typing import Any

import openai

from nemo_polar.types import decode_array

MSG = [{"role": "user", "content": "hi"}]


def test_records_are_plain_arrays_by_default_and_compact_on_request(fake_upstream: Any, make_proxy: Any) -> None:
    h = make_proxy([fake_upstream(n_prompt=20, n_gen=6).base_url], served_model="m")
    s = h.session()
    client = openai.OpenAI(base_url=h.base_url + "/v1", api_key=s.api_key, max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model="m", messages=MSG)
    stored = h.records(s.session_id)
    url = f"/sessions/{s.session_id}/records"

    status, plain = h.admin("GET", url)
    assert status == 200 and len(plain["records"]) == 2
    for rec, want in zip(plain["records"], stored, strict=True):
        assert rec["prompt_token_ids"] == want.prompt_token_ids and len(want.prompt_token_ids) == 20
        assert rec["generation_token_ids"] == want.generation_token_ids and len(want.generation_token_ids) == 6
        assert rec["generation_log_probs"] == want.generation_log_probs
        assert all(type(t) is int for t in rec["prompt_token_ids"] + rec["generation_token_ids"])
    assert h.admin("GET", url + "?encoding=plain&limit=1")[1]["records"] == plain["records"][:1]

    status, compact = h.admin("GET", url + "?encoding=compact")
    assert status == 200
    for rec, want in zip(compact["records"], stored, strict=True):
        assert rec["prompt_token_ids"].startswith("b64:i32:")
        assert rec["generation_log_probs"].startswith("b64:f64:")
        assert decode_array(rec["generation_token_ids"]) == want.generation_token_ids
        assert decode_array(rec["generation_log_probs"]) == want.generation_log_probs
    assert compact["next_after_seq"] == plain["next_after_seq"] is None

    status, err = h.admin("GET", url + "?encoding=b64")
    assert status == 400 and "encoding" in err["error"]["message"]

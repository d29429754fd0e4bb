# SPDX-License-Identifier: Apache-2.0
"""`check_token_data`: token ids an engine returns are ints in [0, 2**31) (the stored int32 range; no bools) and
logprobs finite numbers, or the call is an engine failure; every bad kind is caught, good lists pass. (tests/
test_arrays.py holds the C check and its Python fallback to the same decisions.)"""

from __future__ import annotations

from typing import Any

import pytest

from nemo_polar.proxy.engines.base import UpstreamError, check_token_data


@pytest.mark.parametrize("ids", [[], [0, 1, 151_000], [2**31 - 1]])
def test_good_ids_pass(ids: list[int]) -> None:
    check_token_data(ids, ids, [-0.5] * len(ids), None)


@pytest.mark.parametrize("bad", [None, -1, 2.0, "7", 2**31, 2**32, 2**64, True, [1]])
@pytest.mark.parametrize("where", ["prompt", "generation"])
def test_a_bad_id_anywhere_is_an_engine_failure(bad: Any, where: str) -> None:
    ids = [5] * 8000
    ids[4321] = bad
    prompt, gen = (ids, [1]) if where == "prompt" else ([1], ids)
    with pytest.raises(UpstreamError, match=f"{where} token ids that are not non-negative integers"):
        check_token_data(prompt, gen, [-0.5] * len(gen), "http://engine")


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), "x"])
def test_a_bad_logprob_is_an_engine_failure(bad: Any) -> None:
    with pytest.raises(UpstreamError, match="logprobs that are not finite numbers"):
        check_token_data([1], [2, 3], [-0.5, bad], None)

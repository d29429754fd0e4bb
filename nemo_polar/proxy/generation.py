# SPDX-License-Identifier: Apache-2.0
"""What the proxy generates for one harness call: one strategy per plan-step kind, and prefix preservation.

A call's plan step (or none) picks its strategy: `live` (the engine samples), `forced` (a `tool`/`text` step: the
engine generates the exact text under a grammar, then the tokens are re-scored), `choose` (a live sample that a
grammar restricts to one of several `tool`/`text` steps' texts: the policy's own choice, re-scored the same way), `replay` (a stored record's answer,
no model call), `next_best` (n seeded samples, the best that differs from an excluded record). Prefix-preserving
generation (docs/contracts.md) has its two mechanisms here and nowhere else: `splice` (the prompt is built from the
session's chain tip and sent as token ids to stock vLLM) and `nemo_rl` (the chain tip is sent as
`required_prefix_token_ids` to NeMo RL's server); the chain tip advances after every main-agent generation.

Strategies read the call's context and return a `Generation`; they change only the `EngineCall` they were given
(what was actually sent), never the record: the HTTP layer writes the record once, from the call and the outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any

from nemo_polar.proxy import plans
from nemo_polar.proxy.config import ProxyConfig
from nemo_polar.proxy.engines.base import Engine, EngineCall, Generation
from nemo_polar.proxy.normalized import ChatResult, ProviderError, StreamEvent
from nemo_polar.proxy.sessions import Session
from nemo_polar.proxy.store import RecordStore
from nemo_polar.types import CallKind, Origin, id_list, mixed_thinking

__all__ = ["CallContext", "Generator", "plan_kind"]

log = logging.getLogger(__name__)

LIVE, FORCED, REPLAY, NEXT_BEST, CHOOSE = "live", "forced", "replay", "next_best", "choose"
_ORIGIN = {
    LIVE: Origin.LIVE.value,
    NEXT_BEST: Origin.LIVE.value,
    CHOOSE: Origin.LIVE.value,
    FORCED: Origin.FORCED.value,
}


def plan_kind(step: dict[str, Any] | None, tool_call_format: str) -> tuple[str, str | None]:
    """The strategy for a plan step, and the exact text a forced step generates."""
    if step is None:
        return LIVE, None
    if "replay" in step:
        return REPLAY, None
    if "next_best" in step:
        return NEXT_BEST, None
    if "choose" in step:
        return CHOOSE, None
    try:
        text = plans.forced_text(step, tool_call_format)
    except ValueError as exc:  # the plan is the operator's, not the harness's: a server-side error
        raise ProviderError(500, "api_error", f"plan step {step!r}: {exc}") from None
    return (FORCED, text) if text is not None else (LIVE, None)


@dataclass(slots=True)
class CallContext:
    """One harness call on its way to the engine: who asked, what the plan says, what will be sent."""

    session: Session
    call_kind: str
    call: EngineCall
    step: dict[str, Any] | None
    kind: str = LIVE
    forced_text: str | None = None

    @property
    def origin(self) -> str:
        return _ORIGIN.get(self.kind, Origin.REPLAYED.value)

    @property
    def main(self) -> bool:
        return self.call_kind == CallKind.MAIN.value


class Generator:
    """Runs the strategy a call's plan step asks for against one engine (and the store, for replays)."""

    def __init__(self, config: ProxyConfig, engine: Engine, store: RecordStore):
        self.config = config
        self.engine = engine
        self.store = store
        self.splicer: Any = None  # the PrefixSplicer, made on first use (it loads the model's tokenizer)

    # -- the two entry points -----------------------------------------------------------------------------------

    async def run(self, ctx: CallContext) -> Generation:
        """A complete (non-streaming) generation for this call."""
        if ctx.kind == REPLAY:
            return await self._replay(ctx)
        if ctx.kind == NEXT_BEST:
            return await self._next_best(ctx)
        if ctx.kind == FORCED:
            assert ctx.forced_text is not None
            return await self._forced(ctx, ctx.forced_text)
        if ctx.kind == CHOOSE:
            assert ctx.step is not None
            options = [plans.forced_text(o, self.config.tool_call_format) for o in ctx.step["choose"]]
            return await self._forced(ctx, [o for o in options if o is not None])
        return await self._live(ctx)

    async def events(self, ctx: CallContext, gen: Generation) -> AsyncGenerator[list[StreamEvent], None]:
        """The reply's events, in lists (each list is what arrived together); at the end `gen` holds the outcome.

        Only a live call that is not spliced streams from the engine; every other answer is generated whole and
        then sent as events.
        """
        if ctx.kind == LIVE and not self._splices(ctx):
            async for batch in self.engine.stream_batches(self._with_required_prefix(ctx, ctx.call), gen):
                yield batch
            self._advance_tip(ctx, gen)
            return
        gen.adopt(await self.run(ctx))
        assert gen.result is not None
        out = gen.result.as_events()
        if out:
            yield out

    # -- prefix preservation: the one place -------------------------------------------------------------------------

    def _splices(self, ctx: CallContext) -> bool:
        return self.config.prefix_preserving == "splice" and ctx.main and bool(ctx.session.chain_tip)

    def _with_required_prefix(self, ctx: CallContext, call: EngineCall) -> EngineCall:
        """NeMo RL's server continues the chain tip token for token when it is sent as `required_prefix_token_ids`."""
        if self.config.prefix_preserving == "nemo_rl" and ctx.main and ctx.session.chain_tip:
            call.extra["required_prefix_token_ids"] = ctx.session.chain_tip
        return call

    def _advance_tip(self, ctx: CallContext, gen: Generation) -> None:
        if self.config.prefix_preserving and ctx.main and gen.result is not None:
            ctx.session.chain_tip = list(gen.result.prompt_token_ids) + list(gen.result.generation_token_ids)

    def splicer_for(self) -> Any:
        if self.splicer is None:
            from nemo_polar.proxy.prefix import PrefixSplicer

            if not self.config.model_dir:
                raise ProviderError(500, "api_error", "prefix_preserving=splice needs model_dir")
            self.splicer = PrefixSplicer(
                self.config.model_dir, chat_template=self.config.chat_template, eot_token_ids=self.config.eot_token_ids
            )
        return self.splicer

    async def _spliced_prompt(self, ctx: CallContext) -> list[int] | None:
        """Prompt ids spliced onto the session's main-chain tip (stock vLLM), or None when not applicable."""
        if not self._splices(ctx):
            return None
        from nemo_polar.proxy.prefix import SpliceError

        splicer = self.splicer_for()
        call = ctx.call
        try:
            ids: list[int] = await asyncio.to_thread(
                splicer.splice,
                ctx.session.chain_tip,
                call.request.messages,
                call.request.tools,
                call.sampling.get("chat_template_kwargs"),
            )
        except SpliceError as exc:
            log.info("session %s: no splice (%s)", ctx.session.session_id, exc)
            return None
        return ids

    async def _complete_spliced(self, call: EngineCall, prompt: list[int], extra: dict[str, Any] | None) -> Generation:
        splicer = self.splicer_for()
        completion = replace(call, extra={"stop_token_ids": splicer.eot_token_ids, **(extra or {})})
        gen, text = await self.engine.complete_ids(completion, prompt)
        content, reasoning, calls = plans.parse_hermes(text)
        res = gen.result
        assert res is not None
        res.content, res.reasoning, res.tool_calls = content, reasoning, calls
        if calls and res.finish_reason == "stop":
            res.finish_reason = "tool_calls"
        gen.extra["spliced"] = True
        return gen

    async def _sample(self, ctx: CallContext, call: EngineCall, prompt: list[int] | None) -> Generation:
        """One sample from the model: from the spliced prompt when there is one, else a chat call."""
        if prompt is not None:
            return await self._complete_spliced(call, prompt, extra=None)
        return await self.engine.chat(self._with_required_prefix(ctx, call))

    # -- strategies ---------------------------------------------------------------------------------------------------

    async def _live(self, ctx: CallContext) -> Generation:
        gen = await self._sample(ctx, ctx.call, await self._spliced_prompt(ctx))
        self._advance_tip(ctx, gen)
        return gen

    async def _forced(self, ctx: CallContext, text: str | list[str]) -> Generation:
        """A forced step (one text), or a `choose` step (a live sample the grammar restricts to these texts)."""
        choices = [text] if isinstance(text, str) else text
        assert ctx.step is not None
        steps = [ctx.step] if isinstance(text, str) else ctx.step["choose"]
        if mixed_thinking(steps):  # a Plan built in Python skips Plan.parse's check
            raise ProviderError(500, "api_error", "a choose step's options must all think or all not (plan error)")
        call = ctx.call
        # thinking on only where the step forces a reasoning block: the template then opens the turn bare and the
        # grammar writes `<think>…</think>`; otherwise the template closes an empty block before the forced text
        thinking = plans.thinks(steps[0])
        ctk = {**(call.sampling.get("chat_template_kwargs") or {}), "enable_thinking": thinking}
        # the grammar ends the generation with the forced text: a max_tokens cap could only truncate it
        call.sampling = {k: v for k, v in call.sampling.items() if k != "max_tokens"}
        call.sampling["chat_template_kwargs"] = ctk
        if self.config.forced_tokens == "canonical":
            return await self._canonical(ctx, text)
        extra: dict[str, Any] = {"structured_outputs": {"choice": choices}}
        # the grammar may spell the text with any tokenization, at worst one token per byte: that bound always
        # leaves room for the whole text and its end of turn (and /v1/completions would default to 16 tokens)
        bound = max(len(c.encode()) for c in choices) + 8
        prompt = await self._spliced_prompt(ctx)
        if prompt is not None:
            extra["max_tokens"] = bound
            gen = await self._complete_spliced(call, prompt, extra=extra)
        else:
            call.extra.update(extra)
            if thinking:  # an engine that lets the model reason unconstrained stops at the bound, not 40k
                call.sampling["max_tokens"] = bound
            if call.request.tools and call.request.tool_choice not in (None, "auto"):
                call.request.tool_choice = "auto"  # the grammar decides; a named/required choice would conflict
            gen = await self.engine.chat(call)  # the grammar fixes the text: no required prefix is sent
        res = gen.result
        assert res is not None
        if thinking:
            if (res.reasoning or "").strip("\n") not in {plans.parse_hermes(c)[1] for c in choices}:
                raise ProviderError(
                    502,
                    "api_error",
                    "the engine returned no reasoning equal to the plan step's think text: serve the model with a "
                    "reasoning parser (vLLM --reasoning-parser) and the grammar applied inside the reasoning block "
                    "(--structured-outputs-config.enable_in_reasoning true); polar backend does both for tiny-qwen3",
                )
            # what follows `</think>` starts with the template's blank line: the answer a harness sees is the step's
            # text alone, as on the spliced path (`plans.parse_hermes`); the token ids keep every generated token
            if res.content is not None:
                res.content = res.content.strip() if res.tool_calls else res.content.lstrip()
        gen.extra["forced_text" if isinstance(text, str) else "choices"] = text
        gen.extra["grammar_log_probs"] = res.generation_log_probs
        limit = self.config.rescore_forced_max_prompt_tokens
        if len(res.prompt_token_ids) > limit:
            gen.extra["log_probs_source"] = (
                f"grammar (prompt of {len(res.prompt_token_ids)} tokens is over the re-scoring limit {limit})"
            )
        else:
            try:
                res.generation_log_probs = await self.engine.score(
                    id_list(res.prompt_token_ids), res.generation_token_ids, call.served_model, call.route_key
                )
                gen.extra["log_probs_source"] = "prompt_logprobs"
            except ProviderError as exc:
                gen.extra["log_probs_source"] = f"grammar (re-scoring failed: {exc.message})"
        self._advance_tip(ctx, gen)
        return gen

    async def _canonical(self, ctx: CallContext, text: str | list[str]) -> Generation:
        """`forced_tokens: canonical`: each text in the tokenizer's own spelling plus the template's end of turn,
        scored by the engine (teacher forcing); a `choose` step samples one option by those scores.

        Sampling an option with probability proportional to exp(log p(option) / temperature) is the model's own
        distribution restricted to the options' canonical spellings, so a policy that learns to prefer one option
        sees it at the same token positions in every sample (a grammar lets a model spell a text in many ways).
        """
        choices = [text] if isinstance(text, str) else text
        call, splicer = ctx.call, self.splicer_for()
        gen = Generation(sent_at=time.time())
        prompt = await self._spliced_prompt(ctx)
        if prompt is None:
            prompt = await self.engine.tokenize(call)
        else:
            gen.extra["spliced"] = True
        turn_end = splicer.turn_end_id()
        options = [[*splicer.tokenizer.encode(c, add_special_tokens=False), turn_end] for c in choices]
        scores = await asyncio.gather(
            *(self.engine.score(prompt, ids, call.served_model, call.route_key) for ids in options)
        )
        gen.first_byte_at = gen.finished_at = time.time()
        totals = [sum(s) for s in scores]
        chosen = plans.sample_option(totals, call.sampling.get("temperature"), call.sampling.get("seed"))
        content, reasoning, calls = plans.parse_hermes(choices[chosen])
        gen.result = ChatResult(
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            prompt_tokens=len(prompt),
            completion_tokens=len(options[chosen]),
            prompt_token_ids=list(prompt),
            generation_token_ids=options[chosen],
            generation_log_probs=list(scores[chosen]),
            served_model=call.served_model,
            response_id=f"polar-canonical-{uuid.uuid4().hex[:16]}",
        )
        gen.usage = {"prompt_tokens": len(prompt), "completion_tokens": len(options[chosen])}
        gen.extra["log_probs_source"] = "prompt_logprobs (canonical spelling)"
        if isinstance(text, str):
            gen.extra["forced_text"] = text
        else:
            gen.extra["choices"] = text
            gen.extra["choice"] = {"chosen": chosen, "log_probs": totals, "tokens": [len(o) for o in options]}
        self._advance_tip(ctx, gen)
        return gen

    async def _replay(self, ctx: CallContext) -> Generation:
        step, call = ctx.step, ctx.call
        assert step is not None
        record_id = step["replay"]
        src = self.store.get_record(record_id)
        if src is None and isinstance(step.get("record"), dict):
            src = plans.record_from_inline(record_id, step["record"])
        if src is None or src.error is not None:
            raise ProviderError(500, "api_error", f"plan replays record {record_id!r}, which is missing or failed")
        res = plans.result_from_record(src)
        gen = Generation(result=res, sent_at=time.time(), extra={"replayed_from": record_id})
        if "sampling" in src.request:  # render the prompt as the recorded call was rendered (its thinking setting)
            ctk = src.request["sampling"].get("chat_template_kwargs")
            call.sampling = {k: v for k, v in call.sampling.items() if k != "chat_template_kwargs"}
            if ctk:
                call.sampling["chat_template_kwargs"] = ctk
        try:
            prompt = await self._spliced_prompt(ctx)
            res.prompt_token_ids = prompt if prompt is not None else await self.engine.tokenize(call)
            res.prompt_tokens = len(res.prompt_token_ids)
            # later calls splice onto the replayed turn, as they did onto the recorded one
            self._advance_tip(ctx, gen)
        except ProviderError as exc:
            gen.extra["prompt_ids_error"] = exc.message
        gen.first_byte_at = gen.finished_at = time.time()
        return gen

    async def _next_best(self, ctx: CallContext) -> Generation:
        """`n` seeded samples from this call's context; the best one that differs from the excluded record."""
        assert ctx.step is not None
        call = ctx.call
        try:
            opts = plans.next_best_options(ctx.step)
        except ValueError as exc:
            raise ProviderError(500, "api_error", f"plan step: {exc}") from exc
        exclude, ctk = opts.exclude_response, opts.chat_template_kwargs
        src = self.store.get_record(opts.exclude_record) if opts.exclude_record is not None else None
        if src is not None:
            exclude = src.response if exclude is None else exclude
            if ctk is None:
                ctk = (src.request.get("sampling") or {}).get("chat_template_kwargs")
        if ctk is not None:  # the context the excluded call was sampled in (a forced call: its step's thinking)
            call.sampling = {**call.sampling, "chat_template_kwargs": dict(ctk)}
        prompt = await self._spliced_prompt(ctx)
        gens: list[Generation] = []
        for i in range(opts.n):  # one after another: a seed's sample does not depend on what it is batched with
            sampling = {**call.sampling, "temperature": opts.temperature, "seed": opts.seed + i}
            one = EngineCall(call.request, call.served_model, sampling, call.route_key, dict(call.extra))
            gens.append(await self._sample(ctx, one, prompt))
        results = [g.result for g in gens if g.result is not None]
        best, same = plans.pick_next_best(results, exclude)
        gen = gens[best]
        call.sampling = {**call.sampling, "temperature": opts.temperature, "seed": opts.seed + best}
        gen.extra["next_best"] = {
            "seed": opts.seed,
            "n": opts.n,
            "temperature": opts.temperature,
            "exclude_record": opts.exclude_record,
            "chosen": best,
            "identical": same[best],
            "candidates": [
                {
                    "seed": opts.seed + i,
                    "log_prob": sum(r.generation_log_probs),
                    "tokens": len(r.generation_token_ids),
                    "identical": same[i],
                }
                for i, r in enumerate(results)
            ],
        }
        self._advance_tip(ctx, gen)
        return gen

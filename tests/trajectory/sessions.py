# SPDX-License-Identifier: Apache-2.0
"""A simulated harness session over a toy ChatML-like template, with ground truth for the builders' tests.

Token ids: IM_START=1, IM_END=2, NL=3; role ids SYSTEM=10, USER=11, ASSISTANT=12, TOOL=13; every content token
is fresh (>= 1000, never reused), so no two calls share tokens by accident. A message renders as
`[IM_START, role, *content, IM_END, NL]`; a generation prompt is `[IM_START, ASSISTANT]`; a stopped turn samples
`content + [IM_END]`, a truncated one (`finish_reason=length`) only `content`. This is a fake template (named as
one): the real-template tests use the Qwen3 tokenizer.

`SessionSim` records the ground truth the exact builder must recover: chains, split reasons, chain kinds,
forced calls and injected drift.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from nemo_polar.types import CompletionRecord

IM_START, IM_END, NL = 1, 2, 3
SYSTEM, USER, ASSISTANT, TOOL = 10, 11, 12, 13
GEN_PROMPT = [IM_START, ASSISTANT]


def block(role: int, content: list[int]) -> list[int]:
    return [IM_START, role, *content, IM_END, NL]


@dataclass
class Agent:
    name: str
    kind: str  # main | subagent | side
    msgs: list[list[int]] = field(default_factory=list)
    started: bool = False
    next_reason: str | None = None  # split reason the next call will start a chain with
    pending_canon_drift: int = 0
    chain_kind: str = "main"
    twin: Agent | None = None  # a subagent spawned with the identical first prompt

    def prompt(self) -> list[int]:
        return [t for b in self.msgs for t in b] + GEN_PROMPT


class SessionSim:
    def __init__(self) -> None:
        self.records: list[CompletionRecord] = []
        self.seq = 0
        self.fresh = 1000
        self.splits: Counter[str] = Counter()
        self.chains = 0
        self.side_chains = 0
        self.canonical_drift = 0
        self.forced = 0
        self.last_finish: dict[tuple[int, ...], str] = {}  # prompt -> finish_reason of its latest call
        self.previous_finish: str | None = None
        self.kind_of: dict[str, str] = {}  # record id -> expected kind of the chain it starts
        self.starts: set[str] = set()  # record ids that start a chain in exact mode
        self.main = Agent("main", "main", [block(SYSTEM, [900, 901, 902]), block(USER, self.tok(4))])
        self.agents: list[Agent] = [self.main]

    def tok(self, n: int) -> list[int]:
        out = list(range(self.fresh, self.fresh + n))
        self.fresh += n
        return out

    def _record(self, agent: Agent, prompt: list[int], gen: list[int], finish: str, **kw: object) -> CompletionRecord:
        rid = f"r{self.seq}"
        lps = [-(0.01 * (i + 1) + 0.001 * self.seq) for i in range(len(gen))]
        rec = CompletionRecord(
            id=rid,
            session_id="s",
            seq=self.seq,
            dialect="openai_chat",
            finish_reason=finish,
            prompt_token_ids=list(prompt),
            generation_token_ids=gen,
            generation_log_probs=lps,
            call_kind="main" if agent.kind == "main" else agent.kind,
            **kw,  # type: ignore[arg-type]
        )
        self.seq += 1
        self.records.append(rec)
        if prompt:
            self.previous_finish = self.last_finish.get(tuple(prompt))
            self.last_finish[tuple(prompt)] = finish
        return rec

    def _start_accounting(self, agent: Agent, rid: str) -> None:
        if agent.kind == "side":
            self.chains += 1
            self.side_chains += 1
            self.starts.add(rid)
            self.kind_of[rid] = "side"
            return
        if not agent.started and agent.twin is not None and agent.twin.started:
            # the other twin already used this exact prompt; if that call was truncated, the tokens cannot tell a
            # twin from a retry, and the builder (rightly) says `truncated`
            agent.next_reason = "truncated" if self.previous_finish == "length" else "sibling"
            agent.started = True
        if not agent.started or agent.next_reason is not None:
            self.chains += 1
            self.starts.add(rid)
            self.kind_of[rid] = agent.chain_kind
            if agent.started and agent.next_reason is not None:
                self.splits[agent.next_reason] += 1
        agent.started = True
        agent.next_reason = None
        self.canonical_drift += agent.pending_canon_drift
        agent.pending_canon_drift = 0

    # -- actions ------------------------------------------------------------------------------------------------

    def turn(self, agent: Agent, *, truncated: bool = False, drift: bool = False, forced: bool = False) -> None:
        """One call; the harness appends the assistant turn (re-rendered, perturbed when `drift`) and a tool result."""
        p = agent.prompt()
        content = self.tok(3)
        gen = content if truncated else [*content, IM_END]
        rec = self._record(agent, p, gen, "length" if truncated else "stop", origin="forced" if forced else "live")
        self._start_accounting(agent, rec.id)
        if forced:
            self.forced += 1
        if agent.kind == "side":
            return
        hist = list(content)
        if drift and not truncated:
            hist[-1] = self.tok(1)[0]
            agent.next_reason = "drift"
            agent.pending_canon_drift = 1
        agent.msgs.append(block(ASSISTANT, hist))
        agent.msgs.append(block(TOOL, self.tok(2)))

    def siblings(self, agent: Agent) -> None:
        """Two calls with the identical prompt (n>1 / a duplicate); the harness continues with the first."""
        p = agent.prompt()
        c1, c2 = self.tok(2), self.tok(2)
        r1 = self._record(agent, p, [*c1, IM_END], "stop")
        self._start_accounting(agent, r1.id)
        r2 = self._record(agent, p, [*c2, IM_END], "stop")
        self.chains += 1
        self.starts.add(r2.id)
        self.kind_of[r2.id] = agent.chain_kind
        self.splits["sibling"] += 1
        agent.msgs.append(block(ASSISTANT, c1))
        agent.msgs.append(block(TOOL, self.tok(2)))

    def truncated_retry(self, agent: Agent) -> None:
        """A truncated call the harness discards and retries with the same prompt."""
        p = agent.prompt()
        r1 = self._record(agent, p, self.tok(3), "length")
        self._start_accounting(agent, r1.id)
        content = self.tok(2)
        r2 = self._record(agent, p, [*content, IM_END], "stop")
        self.chains += 1
        self.starts.add(r2.id)
        self.kind_of[r2.id] = agent.chain_kind
        self.splits["truncated"] += 1
        agent.msgs.append(block(ASSISTANT, content))
        agent.msgs.append(block(TOOL, self.tok(2)))

    def failed_then_retry(self, agent: Agent) -> None:
        self._record(agent, [], [], "error", error={"kind": "upstream", "status": 503})
        self.turn(agent)

    def compact(self) -> None:
        if not self.main.started:
            return
        self.main.msgs = [self.main.msgs[0], block(USER, self.tok(5))]
        self.main.next_reason = "compaction"
        self.main.pending_canon_drift = 0
        self.main.chain_kind = "post_compaction"

    def spawn_subagent(self, twins: bool = False) -> None:
        sys_block = block(SYSTEM, [800 + len(self.agents), 801])
        task = block(USER, self.tok(3))
        a = Agent(f"sub{len(self.agents)}", "subagent", [sys_block, task], chain_kind="subagent")
        self.agents.append(a)
        if twins:
            b = Agent(f"sub{len(self.agents)}", "subagent", [sys_block, task], chain_kind="subagent", twin=a)
            a.twin = b
            self.agents.append(b)

    def side_call(self, replay_main: bool) -> None:
        side = Agent("side", "side")
        base = self.main.msgs if replay_main else [block(SYSTEM, [700, 701])]
        side.msgs = [*base, block(USER, self.tok(3))]
        self.turn(side)

# SPDX-License-Identifier: Apache-2.0
"""Typed, validated options for the trajectory builders.

`BuildOptions` is a frozen pydantic model: `build(records, **options)` validates every option at call time and
reports all errors at once. It carries what a pure builder cannot know by itself: the end-of-turn terminator(s)
of the served model's tokenizer, the fidelity mode, the side-call / forced-call policies, an optional call
classifier and the reward to stamp on traces. This module does not build anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_polar.types import CallKind, CompletionRecord

__all__ = ["BuildOptions", "CallClassifier"]

CallClassifier = Callable[[CompletionRecord], "str | None"]
"""Maps a record to a call kind (`main|subagent|side`), or None to keep the record's own `call_kind`."""


class BuildOptions(BaseModel):
    """Options shared by all builders (unknown keys are rejected).

    Attributes:
        eot_token_ids: the end-of-turn terminators, from the tokenizer or the engine (never guessed). Each item
            is one terminator that ends a turn on its own: an int for a single-token one (so a flat list such as
            the backend's `[<|im_end|>, <|endoftext|>]` lists alternatives, like vLLM's `stop_token_ids`), or
            a list of ints for a multi-token one (`[[end, newline]]`). Required by `fidelity="canonical"` (the
            splice point); used in `exact` mode only to fingerprint system turns.
        fidelity: `exact` (default): a record extends a chain only if the chain's whole stitched sequence is a
            token prefix of its prompt. `canonical` (opt-in, lossy): the previous prompt is a prefix and the
            sampled turn replaces the template's re-rendering up to the terminator; deviations are counted.
        side_calls: what happens to side calls (`call_kind=side`): `keep` trains them (with `side_reward`, or
            the task reward if that is unset: an explicit opt-in), `mask` (default) keeps them as untrained
            traces, `drop` leaves them out.
        forced_policy: `mask` (default) never trains forced/replayed tokens; `keep` trains them.
        classifier: optional callable overriding a record's `call_kind` (returns None to keep it).
        reward: reward stamped on every non-side trace (and on side traces when `side_calls="keep"` and no
            `side_reward` is given).
        side_reward: reward for side traces kept by policy.
        drift_window_tokens: a new chain whose prompt agrees with an existing call's prompt on all but its last
            `drift_window_tokens` tokens is classified as `drift` (re-rendered generation prompt), not a new
            conversation.
        verify: after building, re-check token by token that every call's left context in its trace equals the
            prompt its record saw (exact mode; doubles the compare work, so off by default: the merge itself
            only ever appends after a full prefix compare, and span lengths are always checked).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    eot_token_ids: tuple[tuple[int, ...], ...] = ()
    fidelity: Literal["exact", "canonical"] = "exact"
    side_calls: Literal["keep", "mask", "drop"] = "mask"
    forced_policy: Literal["mask", "keep"] = "mask"
    classifier: Callable[[CompletionRecord], Any] | None = None
    reward: float | None = Field(default=None, allow_inf_nan=False)
    side_reward: float | None = Field(default=None, allow_inf_nan=False)
    drift_window_tokens: int = Field(default=32, ge=0)
    verify: bool = False

    @field_validator("eot_token_ids", mode="before")
    @classmethod
    def _normalise_eot(cls, value: Any) -> Any:
        if value is None:
            return ()
        if isinstance(value, int):
            return ((value,),)
        return tuple((v,) if isinstance(v, int) else tuple(v) for v in value)

    @field_validator("eot_token_ids")
    @classmethod
    def _check_eot(cls, value: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        for term in value:
            if not term:
                raise ValueError("an end-of-turn terminator must have at least one token id")
            if any(t < 0 for t in term):
                raise ValueError("end-of-turn token ids must be non-negative")
        return value

    @model_validator(mode="after")
    def _check_fidelity(self) -> BuildOptions:
        if self.fidelity == "canonical" and not self.eot_token_ids:
            raise ValueError(
                "fidelity='canonical' needs eot_token_ids (take them from the tokenizer or engine; never guessed)"
            )
        return self

    def call_kind(self, record: CompletionRecord) -> str:
        """The record's call kind after the optional classifier."""
        if self.classifier is not None:
            kind = self.classifier(record)
            if kind is not None:
                kind = str(getattr(kind, "value", kind))
                if kind not in CallKind._value2member_map_:
                    raise ValueError(
                        f"classifier returned {kind!r} for record {record.id}; expected main|subagent|side"
                    )
                return kind
        return record.call_kind

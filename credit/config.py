# SPDX-License-Identifier: Apache-2.0
"""`CallCreditConfig`: every free choice of CALL-CREDIT as a documented, validated option.

The proposal (docs/call_credit.md) fixes the formulas; this module names every choice it leaves open and
gives it a default. It does no computation. Load from a dict/YAML/JSON with `CallCreditConfig.model_validate`;
pydantic reports every bad field at once and unknown keys are rejected.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CallCreditConfig",
    "CoevolutionConfig",
    "CounterfactualConfig",
    "CurationConfig",
    "FusionConfig",
    "GraphConfig",
    "JudgeConfig",
    "MetricsConfig",
    "PropagationConfig",
    "RoleConfig",
]

ROLES = ("IG", "AE", "RV", "OTHER")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JudgeConfig(_Strict):
    """The optional LLM judge for calls the rules leave ambiguous (off by default)."""

    enabled: bool = Field(default=False, description="Ask the judge about ambiguous calls (needs a judge callable).")
    base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (only for the built-in judge).",
    )
    model: str | None = Field(default=None, description="Model name sent to the endpoint.")
    api_key_env: str | None = Field(default=None, description="Name of the environment variable holding the API key.")
    timeout_s: float = Field(default=30.0, gt=0, description="Per-request timeout of the built-in judge.")
    max_chars: int = Field(
        default=4000, gt=0, description="Action and observation are truncated to this many characters."
    )


class RoleConfig(_Strict):
    """How each call gets its role IG / AE / RV / OTHER (docs/call_credit.md)."""

    tool_roles: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description=(
            "Per-harness tool-name → role hint overrides, merged over the built-in tables "
            "(`roles.DEFAULT_TOOL_ROLES`). Hints: IG, AE, RV, OTHER, or SHELL (the arguments hold a shell command)."
        ),
    )
    effect_order: list[str] = Field(
        default_factory=lambda: ["SUBMIT", "AE", "RV", "EXEC", "IG", "SETUP", "NEUTRAL"],
        description=(
            "Strongest effect first: a compound command or a call with several tool calls takes the first "
            "effect of this list that any part has. SUBMIT (a harness's submit sentinel) makes the call OTHER; "
            "EXEC (running a program of unknown purpose) is resolved by the observation and the position prior."
        ),
    )
    scratch_prefixes: list[str] = Field(
        default_factory=lambda: ["/tmp/", "/dev/", "/var/tmp/"],
        description="Redirections and `tee` into these paths do not count as edits (scratch output).",
    )
    submit_sentinels: list[str] = Field(
        default_factory=lambda: ["COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT"],
        description="Strings whose presence in a shell command marks a submission (role OTHER).",
    )
    use_observation: bool = Field(
        default=True, description="Use the tool result (test output, diff, …) for ambiguous calls."
    )
    position_prior: bool = Field(
        default=True,
        description=(
            "IG→AE→RV prior for calls still ambiguous: running code before the session's first edit is IG, "
            "after an edit it is RV."
        ),
    )
    text_shell_blocks: bool = Field(
        default=True, description="Read ```bash blocks in a reply without tool calls as the action (mini-swe-agent)."
    )
    side_calls: Literal["other", "classify"] = Field(
        default="other",
        description="Side calls (call_kind=side: titles, routers, memory) are OTHER, or classified too.",
    )
    judge: JudgeConfig = Field(default_factory=JudgeConfig)


Artifact = Literal["path", "symbol", "test"]


def _all_artifacts() -> list[Artifact]:
    return ["path", "symbol", "test"]


class GraphConfig(_Strict):
    """Causal edges i→j: call j's action references what call i's observation introduced."""

    artifacts: list[Artifact] = Field(
        default_factory=_all_artifacts, description="Which kinds of references make an edge."
    )
    source: Literal["all", "latest", "first"] = Field(
        default="all",
        description=(
            "When several earlier calls introduced the referenced artifact: edge from all of them, only the most "
            "recent, or only the first."
        ),
    )
    include_action_paths: bool = Field(
        default=True,
        description="A call's own read/written paths count as introduced by its observation (a read shows the file).",
    )
    ae_rv: Literal["covers", "after", "none"] = Field(
        default="covers",
        description=(
            "AE→RV edges: `covers` = the verification names an edited path, its test file matches an edited "
            "module, its output mentions an edited path, or it is unscoped (whole suite); `after` = every "
            "verification after an edit; `none` = only generic reference edges."
        ),
    )
    unscoped_rv_covers_all: bool = Field(
        default=True, description="`pytest` with no target covers every earlier edit."
    )
    min_symbol_len: int = Field(default=4, ge=1, description="Shorter identifiers never make symbol edges.")
    max_observation_chars: int = Field(
        default=20000, gt=0, description="Observations are scanned up to this many characters (head and tail kept)."
    )


class PropagationConfig(_Strict):
    """Â_v = Â_τ · ω_role(r(v)) · d(v)/Σ_j d(v_j) · γ^(|τ|−pos(v)), d from `structure`, and how Â_τ is computed."""

    omega: dict[str, float] = Field(
        default_factory=lambda: {"AE": 1.0, "IG": 0.6, "RV": 0.3, "OTHER": 0.1},
        description="Initial role weights ω_role; the proposal requires ω(AE) > ω(IG) > ω(RV).",
    )
    gamma: float = Field(
        default=0.95, gt=0, le=1, description="Temporal discount γ; pos(v) is 1-based, the last call gets 1."
    )
    structure: Literal["direct", "outdegree"] = Field(
        default="direct",
        description=(
            "The causal-contribution share d(v)/Σd. `direct` (docs/call_credit.md, propagation): the outcome is a "
            "node of the graph; the edits whose changes survive into the final diff are its direct causes and "
            "keep credit; reads (and the reverts and failing verifications that led to an edit) earn credit "
            "through the edits that used them, verifications through the edits they verified. `outdegree`: the "
            "seed's literal outdeg(v)/Σ outdeg (see `leaf_mode`), kept for comparison."
        ),
    )
    source_weight: Literal["kinds", "edge"] = Field(
        default="kinds",
        description=(
            "`direct`: how an edit splits the credit it passes on among its sources: ω_role of each source times "
            "the number of evidence kinds of the edge (path, symbol, test: a read whose code the edit quotes counts "
            "more than a listing that only named the file), or ω_role alone (`edge`)."
        ),
    )
    unverified_weight: float = Field(
        default=0.25,
        ge=0,
        description=(
            "`direct`: the outcome's weight on a surviving edit that no verification covers, relative to a covered "
            "one (1: all surviving edits alike; the sweep over 1, 0.5, 0.25, 0 on benchmarks/credit_fidelity.py and "
            "why 0.25: docs/call_credit.md §3)."
        ),
    )
    leaf_mode: Literal["epsilon", "literal"] = Field(
        default="epsilon",
        description=(
            "`outdegree` only. Out-degree-0 calls: `epsilon` gives them degree ε; `literal` gives them zero credit. "
            "If every call has degree 0 the share is uniform in both modes."
        ),
    )
    epsilon: float = Field(
        default=0.1, ge=0, description="The degree given to leaves in `epsilon` mode (a tenth of one dependency)."
    )
    rescale: Literal["none", "mean", "token_mean", "max"] = Field(
        default="mean",
        description=(
            "Bring Â_v to Â_τ's scale: `none` (the literal product: Σ shares = 1, so values are ~Â_τ/|τ|); "
            "`mean` (mean over calls of Â_v = Â_τ); `token_mean` (token-weighted mean = Â_τ); `max` "
            "(max |Â_v| = |Â_τ|). All keep the sign of Â_τ and map 0 to 0."
        ),
    )
    baseline: Literal["leave_one_out", "mean"] = Field(
        default="leave_one_out",
        description="GRPO baseline per group: leave-one-out (RLOO, NeMo RL's default) or the mean.",
    )
    normalize_std: bool = Field(default=True, description="Divide by the group std (where it is > 0), as GRPO does.")
    std_eps: float = Field(default=1e-6, ge=0, description="Added to the std before dividing.")
    rv_reward_weight: float = Field(
        default=0.0,
        description=(
            "λ: add λ·r_RV to each RV call's credit. 0 keeps Â_v a pure decomposition of Â_τ (zero advantage → "
            "zero credit); r_RV is still computed and reported."
        ),
    )

    @model_validator(mode="after")
    def _check_omega(self) -> PropagationConfig:
        missing = [r for r in ROLES if r not in self.omega]
        if missing:
            raise ValueError(f"omega lacks roles {missing}")
        if any(v < 0 for v in self.omega.values()):
            raise ValueError("omega values must be >= 0")
        return self


class FusionConfig(_Strict):
    """Ã_t = α·A_t^GRPO + (1−α)·Â_{v(t)}; interstitial tokens (loss mask 0) get 0."""

    alpha: float = Field(default=0.5, ge=0, le=1, description="α = 1 reproduces GRPO's token advantages exactly.")
    unspanned: Literal["trajectory", "zero"] = Field(
        default="trajectory",
        description="Trainable tokens outside every call span use Â_τ as their call credit, or 0.",
    )
    apply_sampling_weights: bool = Field(
        default=False,
        description=(
            "Multiply each call's fused advantages by its curation sampling weight (ignored at α = 1, which is "
            "GRPO exactly)."
        ),
    )


class CurationConfig(_Strict):
    """Causal-aware curation: DPO pairs, damping of low-credit IG calls, the RV self-correction reward."""

    theta_ae: float = Field(default=0.5, description="θ_AE: AE calls with Δ_k > θ_AE give DPO pairs.")
    k_variants: int = Field(default=1, ge=1, description="K counterfactual variants per selected AE call.")
    swap_negative: bool = Field(
        default=False, description="Also emit a pair with the counterfactual as `chosen` when Δ_k < −θ_AE."
    )
    theta_ig: float = Field(
        default=0.1,
        description=(
            "θ_IG: an IG call whose causal effect (its measured Δ, else its credit share Â_v/Â_τ) is below θ_IG "
            "is damped."
        ),
    )
    ig_damping: float = Field(
        default=0.3, ge=0, le=1, description="Sampling weight of a damped IG call (others get 1)."
    )
    rv_pass: float = Field(
        default=1.0, description="r_RV term for a passing verification: 𝟙[test passed] coefficient."
    )
    rv_fail_identified: float = Field(
        default=-1.0,
        description=(
            "Coefficient of 𝟙[test failed but the bug was identified] (the proposal writes r_RV = 𝟙[pass] − "
            "𝟙[fail ∧ identified]; set +1 to reward self-correction instead)."
        ),
    )
    rv_fail_unidentified: float = Field(default=0.0, description="Coefficient of 𝟙[test failed and nothing fixed it].")
    identified_by: Literal["graph", "any_after"] = Field(
        default="graph",
        description=(
            "A failure counts as identified when a later AE call depends on it in the graph, or when any AE "
            "call follows it."
        ),
    )


class CoevolutionConfig(_Strict):
    """Adapting ω_role from the drift of per-role causal effects after each step."""

    estimator: Literal["counterfactual", "observational", "auto"] = Field(
        default="auto",
        description=(
            "Per-role causal effect: mean Δ of measured counterfactuals; or the within-group regression slope of "
            "reward on the number of the role's graph-connected calls; `auto` uses Δ where a role has any."
        ),
    )
    rule: Literal["literal", "symmetric", "proportional"] = Field(
        default="literal",
        description=(
            "`literal`: AE effect falls → raise ω(IG); RV effect rises → raise ω(RV). `symmetric` also applies "
            "the reverse moves. `proportional`: ω_r ← (1−η)ω_r + η·ω_AE·e_r/e_AE."
        ),
    )
    eta: float = Field(default=0.1, gt=0, le=1, description="Step size η (multiplicative: ω ← ω·(1±η)).")
    threshold: float = Field(default=0.02, ge=0, description="Drifts smaller than this are ignored.")
    ema: float = Field(default=0.5, ge=0, lt=1, description="Effects are smoothed: e ← ema·e_prev + (1−ema)·e_new.")
    omega_min: float = Field(default=0.01, ge=0)
    omega_max: float = Field(default=2.0, gt=0)
    keep_order: bool = Field(default=False, description="Clamp so that ω(AE) ≥ ω(IG) ≥ ω(RV) always holds.")


class CounterfactualConfig(_Strict):
    """Counterfactual calibration of AE calls within a budget (off by default: `budget` 0)."""

    budget: int = Field(
        default=0,
        ge=0,
        description=(
            "Counterfactual runs per batch (one run = one replayed session). 0 (default): calibration is off — on "
            "benchmarks/credit_fidelity.py it moved ρ by < 0.005 at 8 and at 120 runs per batch of 80 sessions, "
            "with any alternative and selection (docs/call_credit.md §5); set it to calibrate."
        ),
    )
    max_per_trajectory: int = Field(default=1, ge=1, description="At most this many calibrated calls per trajectory.")
    only_successful: bool = Field(default=True, description="Only trajectories with reward ≥ success_threshold.")
    alternative: Literal["next_best", "second_best", "plan"] = Field(
        default="next_best",
        description=(
            "What replaces call k: `next_best` the most likely of n seeded samples that differs from the recorded "
            "call; `second_best` the model's second-most-likely output (the highest-ranked first token other than "
            "the recorded one, then greedy; needs a proxy that serves the `second_best` plan step); `plan` a given "
            "plan step."
        ),
    )
    select: Literal["credit", "uncertain"] = Field(
        default="credit",
        description=(
            "Which AE calls get the budget: the highest |Â_v| (`credit`), or where the rule credit is least "
            "certain (`uncertain`): the largest disagreement between the call's credit relative to its "
            "trajectory's best call and a cheap observational estimate of Δ_k (the group's reward without an "
            "edit to the same files, `counterfactual.observational_delta`)."
        ),
    )
    mode: Literal["scale", "replace", "additive"] = Field(
        default="scale",
        description=(
            "How Δ_k corrects Â_{v_k}: `scale` Â·(1 + β(Δ/R − δ₀)); `replace` Â_τ·s·Δ/R where s is the "
            "trajectory's rescale factor; `additive` Â + β·|Â_τ|·Δ/R."
        ),
    )
    strength: float = Field(default=1.0, ge=0, description="β.")
    expected_delta: float = Field(default=0.5, description="δ₀: the Δ/R the structural prior already implies.")
    reward_range: float = Field(default=1.0, gt=0, description="R: max reward − min reward (binary rewards: 1).")
    concurrency: int = Field(default=2, ge=1, description="Counterfactual sessions run at once.")
    timeout_s: float = Field(
        default=1800.0, gt=0, description="Timeout of one counterfactual run; a timeout skips the call."
    )
    seed: int = Field(default=0, description="Seed for `next_best` sampling (n>1) and tie-breaking.")
    next_best_n: int = Field(default=4, ge=2, le=64, description="`next_best`: samples drawn from call k's context.")
    next_best_temperature: float = Field(
        default=1.0, gt=0, description="`next_best`: their sampling temperature (seeded, so repeatable)."
    )
    rollout_url: str | None = Field(
        default=None,
        description=(
            "Rollout server that runs the counterfactual sessions (`polar serve --upstream …`); with it, `polar "
            "credit RUN_DIR` calibrates (same as `--counterfactual URL`)."
        ),
    )


class MetricsConfig(_Strict):
    """Reward-hacking rate and diagnostics."""

    success_threshold: float = Field(default=1.0, description="A trajectory is successful when its reward ≥ this.")
    hacking_aggregate: Literal["mean", "sum", "max"] = Field(
        default="mean",
        description=(
            "IG vs AE credit of a trajectory, compared per call: the mean credit of an IG call against the mean "
            "credit of an AE call (the proposal's definition); `sum` compares the role's credit mass (a trajectory "
            "with more reads than edits looks hacked even under equal per-call credit), `max` the best call of each."
        ),
    )
    hacking_test: Literal["ratio", "zscore"] = Field(
        default="ratio",
        description=(
            "`ratio`: IG > (1+margin)·AE + abs_margin (on credit magnitudes in the direction of Â_τ); `zscore`: "
            "(mean_IG − mean_AE)/SE > z (needs ≥ 2 calls of each)."
        ),
    )
    hacking_margin: float = Field(default=0.25, ge=0, description="Relative margin that makes 'significantly' exceed.")
    hacking_abs_margin: float = Field(default=1e-6, ge=0, description="Absolute margin (guards against 0 vs 0).")
    hacking_z: float = Field(default=1.645, gt=0, description="z threshold of the `zscore` test (one-sided 5%).")
    max_examples: int = Field(default=5, ge=0, description="Examples listed per weakness in reports.")


class CallCreditConfig(_Strict):
    """All CALL-CREDIT options (see each sub-model). `CallCreditConfig()` is the documented default."""

    roles: RoleConfig = Field(default_factory=RoleConfig)
    graph: GraphConfig = Field(default_factory=GraphConfig)
    propagation: PropagationConfig = Field(default_factory=PropagationConfig)
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    curation: CurationConfig = Field(default_factory=CurationConfig)
    coevolution: CoevolutionConfig = Field(default_factory=CoevolutionConfig)
    counterfactual: CounterfactualConfig = Field(default_factory=CounterfactualConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

# SPDX-License-Identifier: Apache-2.0
"""Every shipped recipe: loads with OmegaConf, takes Hydra-style overrides, validates against the pinned schema."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from nemo_polar.credit.nemo_rl import NEMO_RL_COMMIT
from nemo_polar.credit.nemo_rl.options import ESTIMATOR_TARGET, selects_call_credit
from nemo_polar.credit.nemo_rl.recipe import OverrideError, apply_overrides, load_recipe, load_with_overrides, to_plain
from nemo_polar.credit.nemo_rl.schema import SCHEMA_COMMIT, validate_recipe
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_recipes_exist_and_commit_is_pinned() -> None:
    names = {p.name for p in RECIPES}
    assert {
        "grpo_polar_swe_qwen3_5_4b.yaml",
        "grpo_polar_swe_qwen3_5_4b_call_credit.yaml",
        "grpo_polar_swe_smoke.yaml",
    } <= names
    pinned_file = (ROOT / "credit" / "nemo_rl" / "NEMO_RL_COMMIT").read_text().strip()
    assert pinned_file == NEMO_RL_COMMIT == SCHEMA_COMMIT and len(NEMO_RL_COMMIT) == 40


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_starts_with_its_exact_launch_command(recipe: Path) -> None:
    first = recipe.read_text().splitlines()[0]
    assert first.startswith(f"# python -m nemo_polar.credit.nemo_rl.launch --config recipes/{recipe.name}")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_validates_with_overrides(recipe: Path) -> None:
    config = load_with_overrides(
        recipe,
        [
            "polar.harness=codex",
            "grpo.num_prompts_per_step=8",
            "+grpo.adv_estimator.my_plugin_key=1",  # new keys need '+' (struct mode)
            "++logger.wandb.tags=[polar,test]",
            "policy.optimizer.kwargs.lr=2e-6",  # Hydra reads 2e-6 as a float
        ],
    )
    checked = validate_recipe(config)
    assert checked.grpo.num_prompts_per_step == 8
    assert checked.policy.train_global_batch_size == 8 * checked.grpo.num_generations_per_prompt  # ${mul:…} resolved
    assert config["env"]["nemo_gym"]["polar_agent"]["responses_api_agents"]["polar_agent"]["harness"] == "codex"
    assert config["grpo"]["adv_estimator"]["my_plugin_key"] == 1
    assert config["logger"]["wandb"]["tags"] == ["polar", "test"]
    assert config["policy"]["optimizer"]["kwargs"]["lr"] == 2e-6
    adv = config["grpo"]["adv_estimator"]
    assert adv["name"] == "grpo"  # shipped YAML: name grpo (+ _target_ where CALL-CREDIT is used)
    if "call_credit" in recipe.name or "smoke" in recipe.name:
        assert adv["_target_"] == ESTIMATOR_TARGET and selects_call_credit(adv)
        assert adv["call_credit"]["harness"] == "codex"
    else:
        assert not selects_call_credit(adv)


def test_paper_setup_is_what_the_paper_says() -> None:
    c = load_with_overrides(ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b.yaml")
    assert c["policy"]["model_name"] == "Qwen/Qwen3.5-4B"
    assert (c["grpo"]["num_prompts_per_step"], c["grpo"]["num_generations_per_prompt"]) == (4, 16)
    assert (
        c["policy"]["optimizer"]["kwargs"]["lr"] == 1e-6 and c["policy"]["optimizer"]["kwargs"]["weight_decay"] == 0.1
    )
    assert c["grpo"]["max_num_epochs"] == 1 and c["grpo"]["async_grpo"]["enabled"] is True
    assert c["loss_fn"]["use_importance_sampling_correction"] is True
    assert c["loss_fn"]["truncated_importance_sampling_type"] == "tis"
    assert c["polar"]["builder"] == "prefix_merging"
    assert "resources_servers/polar_swe/configs/polar_swe.yaml" in c["env"]["nemo_gym"]["config_paths"]
    vllm = c["policy"]["generation"]["vllm_cfg"]
    assert vllm["async_engine"] is True and vllm["expose_http_server"] is True


def test_override_errors_nemo_rl_parser_and_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_polar.credit.nemo_rl import recipe

    path = ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b.yaml"
    # NeMo RL's own parser (Hydra, struct mode): each bad override is refused with Hydra's message
    for bad, message in (
        ("grpo.no_such_key=1", "+grpo.no_such_key=1"),
        ("+grpo.num_prompts_per_step=3", "num_prompts_per_step"),
        ("garbage", "garbage"),
    ):
        with pytest.raises(OverrideError, match=re.escape(message)):
            apply_overrides(load_recipe(path), [bad])
    # the fallback for environments without NeMo RL reports every bad override at once
    monkeypatch.setattr(recipe, "nemo_rl_config", lambda: None)
    with pytest.raises(OverrideError) as info:
        apply_overrides(
            load_recipe(path), ["grpo.no_such_key=1", "+grpo.num_prompts_per_step=3", "~policy.nope", "garbage"]
        )
    text = str(info.value)
    assert "prefix with '+'" in text and "already exists" in text and "cannot delete" in text and "garbage" in text


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_loading_is_nemo_rl_own_and_the_fallback_agrees(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_polar.credit.nemo_rl import recipe
    from nemo_rl.utils.config import load_config, parse_hydra_overrides, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    overrides = ["polar.harness=codex", "grpo.max_num_steps=3", "+grpo.adv_estimator.extra_key=1e-6"]
    register_omegaconf_resolvers()
    theirs = OmegaConf.to_container(parse_hydra_overrides(load_config(path), list(overrides)), resolve=True)
    assert load_with_overrides(path, overrides) == theirs
    monkeypatch.setattr(recipe, "nemo_rl_config", lambda: None)
    assert load_with_overrides(path, overrides) == theirs


def test_delete_override_and_defaults_override_marker(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("a: {x: 1, y: 2}\nb: {k: 1}\n")
    (tmp_path / "child.yaml").write_text("defaults: base.yaml\na: {x: 5}\nb: {_override_: true, z: 3}\n")
    c = to_plain(apply_overrides(load_recipe(tmp_path / "child.yaml"), ["~a.y"]))
    assert c == {"a": {"x": 5}, "b": {"z": 3}}


def test_schema_rejects_what_nemo_rl_would_reject() -> None:
    base = load_with_overrides(ROOT / "recipes" / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml")
    bad = copy.deepcopy(base)
    bad["loss_fn"]["use_importance_sampling_correction"] = False  # async GRPO asserts this at start-up
    bad["policy"]["generation"]["vllm_cfg"]["async_engine"] = False
    del bad["policy"]["tokenizer"]["name"]
    bad["grpo"]["adv_estimator"]["call_credit"]["alpha"] = 2.0
    bad["grpo"]["adv_estimator"]["call_credit"]["propagation"]["no_such"] = 1
    with pytest.raises(ValidationError) as info:
        validate_recipe(bad)
    text = str(info.value)
    assert "policy.tokenizer.name" in text and "grpo.adv_estimator" in text and "alpha" in text
    bad2 = copy.deepcopy(base)
    bad2["loss_fn"]["use_importance_sampling_correction"] = False
    with pytest.raises(ValidationError, match="use_importance_sampling_correction"):
        validate_recipe(bad2)
    bad3 = copy.deepcopy(base)
    bad3["grpo"]["adv_estimator"]["call_credit"]["propagation"]["no_such"] = 1
    with pytest.raises(ValidationError, match="no_such"):
        validate_recipe(bad3)
    bad4 = copy.deepcopy(base)
    bad4["grpo"]["adv_estimator"] = {"name": "not_an_estimator"}
    with pytest.raises(ValidationError, match="not_an_estimator"):
        validate_recipe(bad4)
    ok = copy.deepcopy(base)
    ok["grpo"]["adv_estimator"] = {"name": "call_credit", "call_credit": {"alpha": 0.3}}  # the pinned `name: str`
    validate_recipe(ok)


def _required(model: type) -> set[str]:
    return {name for name, field in model.model_fields.items() if field.is_required()}


def test_schema_agrees_with_the_pinned_commits_config_keys() -> None:
    """Every model of `schema.py` against the keys extracted from NeMo RL's source at the pinned commit."""
    from nemo_polar.credit.nemo_rl import schema
    from nemo_polar.credit.nemo_rl.pinned_keys import load

    extracted = load()
    assert extracted["commit"] == NEMO_RL_COMMIT
    up = {name: set(c["keys"]) for name, c in extracted["classes"].items()}  # type: ignore[union-attr]
    # pydantic models upstream: the same fields (ours adds only the `polar:` section to MasterConfig)
    assert set(schema.MasterConfigSchema.model_fields) == up["MasterConfig"] | {"polar"}
    assert set(schema.GRPOSchema.model_fields) == up["GRPOConfig"]
    assert set(schema.AsyncGRPOSchema.model_fields) == up["AsyncGRPOConfig"]
    assert set(schema.RewardScalingSchema.model_fields) == up["RewardScalingConfig"]
    assert set(schema.AdvEstimatorSchema.model_fields) == up["AdvEstimatorConfig"]
    assert set(schema.LossFnSchema.model_fields) == up["ClippedPGLossConfig"]
    # TypedDicts upstream: their required keys are exactly the schema's required fields
    assert _required(schema.PolicySchema) == up["PolicyConfig"]
    assert _required(schema.TokenizerSchema) == up["TokenizerConfig"]
    assert {"enabled", *schema.DTensorSchema.REQUIRED_WHEN_ENABLED} == up["DTensorConfig"]
    assert _required(schema.GenerationSchema) == up["GenerationConfig"]
    assert _required(schema.ColocationSchema) == up["ColocationConfig"]
    assert _required(schema.VllmSpecificSchema) == up["VllmSpecificArgs"]
    assert _required(schema.DataSchema) == up["DataConfig"]
    assert _required(schema.ClusterSchema) == up["ClusterConfig"]
    assert _required(schema.CheckpointingSchema) == up["CheckpointingConfig"]
    assert _required(schema.LoggerSchema) == up["LoggerConfig"] | up["GRPOLoggerConfig"]
    assert _required(schema.MasterConfigSchema) == up["MasterConfig"] - {
        "reward_penalties",
        "data_plane",
        "on_policy_distillation",
    }

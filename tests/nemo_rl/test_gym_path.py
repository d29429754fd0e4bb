# SPDX-License-Identifier: Apache-2.0
"""The Gym side of a NeMo RL launch, against the real NeMo RL and the Gym it pins (0.5.1), in the NeMo RL env:

- rows written by `polar data swe-gym` (and the shipped example rows) load through NeMo RL's `NemoGymDataset` and
  `nemo_gym_data_processor` and carry the `agent_ref` NeMo RL dispatches on;
- `polar_swe`'s configs validate as server configs under Gym 0.5.1 (this env) and Gym 0.7 (the Gym venv of
  `scripts/gym_venv.sh`), and both servers import under 0.5.1;
- a masked `polar_agent` result arrives masked in NeMo RL (`_extract_mask_sample_flags` reads `instance_config`);
- the recipes' data paths are the converter's output; the recipe schema refuses what the Gym path cannot deliver.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nemo_polar.credit.nemo_rl.recipe import load_with_overrides
from nemo_polar.credit.nemo_rl.schema import validate_recipe
from pydantic import ValidationError

from nemo_polar.data.swe_gym import DEFAULT_AGENT, convert_file

ROOT = Path(__file__).resolve().parents[2]
POLAR_SWE = ROOT / "environments" / "resources_servers" / "polar_swe"
POLAR_AGENT = ROOT / "environments" / "responses_api_agents" / "polar_agent"
SAMPLE = ROOT / "tests" / "gym" / "data" / "swe_gym_sample.jsonl"
RECIPES = ROOT / "recipes"

CONFIG_CHECK = """
import sys
from omegaconf import OmegaConf
from nemo_gym.config_types import maybe_get_server_instance_config
for path in sys.argv[1:]:
    doc = OmegaConf.load(path)
    for name in doc:
        cfg, err = maybe_get_server_instance_config(name, doc[name])
        print(path.rsplit("/", 1)[-1], name, "ok" if cfg is not None else f"INVALID: {err}")
"""


def _nemo_rl_rows(path: Path) -> list[dict]:
    from nemo_rl.data.datasets.response_datasets.nemogym_dataset import NemoGymDataset
    from nemo_rl.data.processors import nemo_gym_data_processor

    dataset = NemoGymDataset(str(path)).dataset
    return [nemo_gym_data_processor(dataset[i], None, None, None, i)["extra_env_info"] for i in range(len(dataset))]


def test_polar_data_rows_load_through_nemo_rl_gym_dataset_with_agent_ref(tmp_path: Path) -> None:
    gym_rows, _ = convert_file(SAMPLE, tmp_path / "swe_gym")
    loaded = _nemo_rl_rows(tmp_path / "swe_gym" / "gym.jsonl")
    assert len(loaded) == len(gym_rows) > 0
    assert [row["agent_ref"]["name"] for row in loaded] == [DEFAULT_AGENT] * len(loaded)
    assert [row["instance_id"] for row in loaded] == [row["instance_id"] for row in gym_rows]
    example = _nemo_rl_rows(POLAR_SWE / "data" / "example.jsonl")
    assert example and all(row["agent_ref"]["name"] == DEFAULT_AGENT for row in example)


def test_polar_swe_configs_are_valid_under_the_pinned_gym_0_5_1() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", CONFIG_CHECK, str(POLAR_SWE / "configs" / "polar_swe.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines == ["polar_swe.yaml polar_swe ok", "polar_swe.yaml polar_agent ok"], out.stdout


def test_polar_swe_configs_are_valid_under_gym_0_7() -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gym_venv.sh")], capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        pytest.skip(f"the Gym 0.7 venv could not be built (scripts/gym_venv.sh): {proc.stderr[-1500:]}")
    python = Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python"
    configs = sorted(str(p) for p in (POLAR_SWE / "configs").glob("*.yaml"))
    out = subprocess.run([str(python), "-W", "ignore", "-c", CONFIG_CHECK, *configs], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "INVALID" not in out.stdout and out.stdout.count(" ok") == 3, out.stdout


@pytest.mark.parametrize("server", [POLAR_SWE, POLAR_AGENT], ids=lambda p: p.name)
def test_servers_import_under_the_pinned_gym(server: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import app; print(app.__name__)"],
        cwd=server,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_masked_polar_agent_result_arrives_masked_in_nemo_rl(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_rl.experience.rollouts import _extract_mask_sample_flags

    monkeypatch.syspath_prepend(str(POLAR_AGENT))
    import app as polar_agent

    def verify(mask: bool | None) -> dict:
        out = polar_agent.PolarAgentVerifyResponse.model_validate(
            {
                "responses_create_params": {"input": []},
                "response": {
                    "id": "r",
                    "created_at": 0,
                    "model": "m",
                    "object": "response",
                    "output": [],
                    "parallel_tool_calls": True,
                    "tool_choice": "auto",
                    "tools": [],
                },
                "reward": 0.0,
            }
        )
        if mask is not None:
            out.mask_sample = mask
        return json.loads(polar_agent.with_instance_config(out).model_dump_json())

    results = [{"full_result": verify(True)}, {"full_result": verify(False)}, {"full_result": verify(None)}]
    assert _extract_mask_sample_flags(results).tolist() == [True, False, False]
    # a flag only at the top level (the old shape) is what NeMo RL does not see
    assert _extract_mask_sample_flags([{"full_result": {"mask_sample": True}}]).tolist() == [False]


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_recipe_data_paths_are_the_converter_output(recipe: Path) -> None:
    path = Path(load_with_overrides(recipe)["data"]["train"]["data_path"])
    # the converter's output (`polar data swe-gym ... --out DIR` writes DIR/gym.jsonl), or the shipped example rows
    assert path.name == "gym.jsonl" or (ROOT / path) == POLAR_SWE / "data" / "example.jsonl", path


def test_smoke_recipe_runs_a_real_harness_with_prefix_preservation() -> None:
    config = load_with_overrides(RECIPES / "grpo_polar_swe_smoke.yaml")
    assert config["polar"]["harness"] in ("qwen_code", "codex")
    server = config["env"]["nemo_gym"]["polar_swe"]["resources_servers"]["polar_swe"]
    assert server["prefix_preserving"] == "nemo_rl"
    validate_recipe(config)


def test_schema_refuses_what_the_gym_path_cannot_deliver() -> None:
    recipe = RECIPES / "grpo_polar_swe_qwen3_5_4b_call_credit.yaml"
    with pytest.raises(ValidationError, match=r"only the\s+first model call"):
        validate_recipe(load_with_overrides(recipe, ["polar.builder=per_request"]))
    with pytest.raises(ValidationError, match="command_line"):
        validate_recipe(load_with_overrides(recipe, ["polar.harness=shell"]))


@pytest.mark.parametrize("name", ["grpo_polar_swe_qwen3_5_4b.yaml", "grpo_polar_swe_smoke.yaml"])
def test_the_hosted_stack_is_sized_from_the_recipe(name: str) -> None:
    config = load_with_overrides(RECIPES / name)
    server = config["env"]["nemo_gym"]["polar_swe"]["resources_servers"]["polar_swe"]
    samples = config["grpo"]["num_prompts_per_step"] * config["grpo"]["num_generations_per_prompt"]
    assert server["run_slots"] * server["gateways"] == samples
    assert server["ready_buffer"] == server["init_workers"] == server["postrun_workers"] == server["run_slots"]

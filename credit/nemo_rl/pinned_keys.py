# SPDX-License-Identifier: Apache-2.0
"""Config keys of the pinned NeMo RL commit, extracted from its source: what `schema.py` must agree with.

`python -m nemo_polar.credit.nemo_rl.pinned_keys --repo PATH_TO_NEMO_RL_GIT [--commit HASH]` reads the config
classes at the commit with `ast` (no import, no NeMo RL install) and rewrites `nemo_rl_config_keys.json` next to
this file: for pydantic models every field, for TypedDicts the required keys (those not `NotRequired[...]`).
A test checks the schema's models against that file, so a version bump shows exactly which keys moved.

Does not: run at import time, or import `nemo_rl`.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path

from .pinned import NEMO_RL_COMMIT

KEYS_FILE = Path(__file__).with_name("nemo_rl_config_keys.json")

# (file at the commit, class name, kind): kind "model" = pydantic (all fields), "typeddict" = required keys
SOURCES: list[tuple[str, str, str]] = [
    ("nemo_rl/algorithms/grpo.py", "MasterConfig", "model"),
    ("nemo_rl/algorithms/grpo.py", "GRPOConfig", "model"),
    ("nemo_rl/algorithms/grpo.py", "AsyncGRPOConfig", "model"),
    ("nemo_rl/algorithms/grpo.py", "RewardScalingConfig", "model"),
    ("nemo_rl/algorithms/advantage_estimator.py", "AdvEstimatorConfig", "model"),
    ("nemo_rl/algorithms/loss/loss_functions.py", "ClippedPGLossConfig", "model"),
    ("nemo_rl/models/policy/__init__.py", "PolicyConfig", "typeddict"),
    ("nemo_rl/models/policy/__init__.py", "TokenizerConfig", "typeddict"),
    ("nemo_rl/models/policy/__init__.py", "DTensorConfig", "typeddict"),
    ("nemo_rl/models/generation/interfaces.py", "GenerationConfig", "typeddict"),
    ("nemo_rl/models/generation/interfaces.py", "ColocationConfig", "typeddict"),
    ("nemo_rl/models/generation/vllm/config.py", "VllmSpecificArgs", "typeddict"),
    ("nemo_rl/data/__init__.py", "DataConfig", "typeddict"),
    ("nemo_rl/distributed/virtual_cluster.py", "ClusterConfig", "typeddict"),
    ("nemo_rl/utils/checkpoint.py", "CheckpointingConfig", "typeddict"),
    ("nemo_rl/utils/logger.py", "LoggerConfig", "typeddict"),
    ("nemo_rl/algorithms/grpo.py", "GRPOLoggerConfig", "typeddict"),
]


def _class_keys(source: str, name: str, kind: str) -> list[str]:
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            keys = []
            for stmt in node.body:
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                    continue
                annotation = ast.unparse(stmt.annotation)
                if kind == "typeddict" and annotation.startswith("NotRequired"):
                    continue
                keys.append(stmt.target.id)
            return keys
    raise LookupError(f"class {name} not found")


def extract(repo: str, commit: str = NEMO_RL_COMMIT) -> dict[str, object]:
    """The keys of every class in `SOURCES` at `commit` of the NeMo RL git repository `repo`."""
    classes: dict[str, dict[str, object]] = {}
    for path, name, kind in SOURCES:
        source = subprocess.run(
            ["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True, timeout=60
        ).stdout
        classes[name] = {"file": path, "kind": kind, "keys": _class_keys(source, name, kind)}
    return {"commit": commit, "classes": classes}


def load() -> dict[str, object]:
    """The committed extraction."""
    return json.loads(KEYS_FILE.read_text())  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a NeMo RL git directory (bare is fine)")
    parser.add_argument("--commit", default=NEMO_RL_COMMIT)
    args = parser.parse_args()
    KEYS_FILE.write_text(json.dumps(extract(args.repo, args.commit), indent=1) + "\n")
    print(f"wrote {KEYS_FILE}")


if __name__ == "__main__":
    main()

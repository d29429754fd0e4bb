# SPDX-License-Identifier: Apache-2.0
"""The credit-fidelity simulator (issue 13): coding-agent sessions with a known causal model. Not shipped: it
serves `benchmarks/credit_fidelity.py` and `tests/credit_sim/`, which import it from the repository root.

docs/credit_sim_model.md is the specification (written before the code). Modules:
- `model`: the structural causal model (state, policy, transitions) and the exact ground truth δ per call;
- `render`: abstract actions → a harness vocabulary's tool calls and tool results;
- `records`: sessions → real `CompletionRecord`s (tiny-qwen3's chat template and tokenizer);
- `runner`: `SimulatorRunner`, the simulator's `CounterfactualRunner` (re-simulates from call k);
- `fidelity`: the experiment behind `benchmarks/credit_fidelity.py` (five credit arms, three metrics).

Pure: imports `nemo_polar.types`, `nemo_polar.trajectory`, `nemo_polar.credit`, torch/numpy, jinja2, `tokenizers`.
It never changes a CALL-CREDIT option.
"""

from .model import IRRELEVANT, SCENARIOS, Model, Scenario, SimSession, State, Task
from .records import ChatTokenizer, TokenizerMissing, session_records
from .render import HELD_IN, HELD_OUT, VOCABULARIES, make_repo
from .runner import SimulatorRunner

__all__ = [
    "HELD_IN",
    "HELD_OUT",
    "IRRELEVANT",
    "SCENARIOS",
    "VOCABULARIES",
    "ChatTokenizer",
    "Model",
    "Scenario",
    "SimSession",
    "SimulatorRunner",
    "State",
    "Task",
    "TokenizerMissing",
    "make_repo",
    "session_records",
]

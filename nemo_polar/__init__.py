# SPDX-License-Identifier: Apache-2.0
"""nemo-polar: train any coding-agent harness with RL without modifying it.

The core package. Subpackages: proxy, trajectory, rollout, runtime, evaluators, backend; the harness
adapters and CALL-CREDIT import as `nemo_polar.harness_adapters` and `nemo_polar.credit`.
"""

__version__ = "0.1.0"

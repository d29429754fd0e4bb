# SPDX-License-Identifier: Apache-2.0
"""CALL-CREDIT (imported as `nemo_polar.credit`): call-level causal credit for agentic RL.

Pure: imports only `nemo_polar.types` and `nemo_polar.trajectory`. The only NeMo RL touch point is
`nemo_polar.credit.nemo_rl`, which imports `nemo_rl` lazily.
"""

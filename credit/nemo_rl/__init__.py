# SPDX-License-Identifier: Apache-2.0
"""NeMo RL integration for CALL-CREDIT: the advantage estimator, `install()` and the launcher.

The only package of nemo-polar that imports `nemo_rl`, and only lazily.
"""

# SPDX-License-Identifier: Apache-2.0
"""Tests of the embedded vLLM backend (nemo_polar.backend)."""

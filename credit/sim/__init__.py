# SPDX-License-Identifier: Apache-2.0
"""The credit-fidelity simulator: coding-agent sessions with a known causal model."""

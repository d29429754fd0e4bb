# SPDX-License-Identifier: Apache-2.0
"""Tests for nemo_polar.evaluators."""

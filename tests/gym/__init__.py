# SPDX-License-Identifier: Apache-2.0
"""Tests for the NeMo Gym environment (environments/) and nemo_polar.data."""

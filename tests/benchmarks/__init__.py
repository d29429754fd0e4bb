# SPDX-License-Identifier: Apache-2.0
"""Tests for the benchmark scripts (arguments, arithmetic, plumbing; never timings)."""

# SPDX-License-Identifier: Apache-2.0
"""Tests of the four provider dialects (pure: no server, no engine)."""

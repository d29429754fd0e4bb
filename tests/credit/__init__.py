# SPDX-License-Identifier: Apache-2.0
"""Tests of CALL-CREDIT (nemo_polar.credit)."""

# SPDX-License-Identifier: Apache-2.0
"""Harness adapters (imported as `nemo_polar.harness_adapters`): one module per coding CLI."""

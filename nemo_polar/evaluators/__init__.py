# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.evaluators (see DESIGN §1)."""

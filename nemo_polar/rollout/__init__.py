# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.rollout (see DESIGN §1)."""

# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.trajectory (see DESIGN §1)."""

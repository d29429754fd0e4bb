# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.backend (see DESIGN §1)."""

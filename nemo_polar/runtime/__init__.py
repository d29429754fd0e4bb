# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.runtime (see DESIGN §1)."""

# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.proxy (see DESIGN §1)."""

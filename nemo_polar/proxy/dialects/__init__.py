# SPDX-License-Identifier: Apache-2.0
"""One module per provider dialect (parse → normalise → render response → render stream)."""

# SPDX-License-Identifier: Apache-2.0
"""The main job and its face: `polar collect` (tasks × harnesses × samples through the rollout service into a
run directory, resumable, with a live progress display), `summary.json`, `polar export sft` and `polar view`
(a self-contained HTML session viewer).

Submodules: `collect` (the run), `progress` (rich display), `summary` (Table-2 numbers), `export` (SFT JSONL),
`viewer` + `report.html.jinja` (the report), `cli` (`register(subparsers)`). Nothing here is imported by the core.
"""

from nemo_polar.collect import collect as _run
from nemo_polar.collect.collect import *  # noqa: F403  (the run's API: its __all__)
from nemo_polar.collect.export import export_sft, sft_lines
from nemo_polar.collect.summary import summarize, write_summary
from nemo_polar.collect.viewer import render_report, write_report

__all__ = ["export_sft", "render_report", "sft_lines", "summarize", "write_report", "write_summary"]
__all__ += _run.__all__

# SPDX-License-Identifier: Apache-2.0
"""Dataset converters: SWE-Gym / SkyRL-v0-293 rows → NeMo Gym rows for `polar_swe` and Polar `TaskSpec`s.

`swe_gym` holds the pure conversion (and the Gym-row → TaskSpec mapping the `polar_agent` uses); `cli` adds
`polar data swe-gym`. Nothing here imports NeMo Gym or touches the network.
"""

from nemo_polar.data.swe_gym import (
    SweGymError,
    SweGymRow,
    convert_file,
    convert_row,
    gym_row,
    task_from_gym_row,
    task_spec,
)

__all__ = [
    "SweGymError",
    "SweGymRow",
    "convert_file",
    "convert_row",
    "gym_row",
    "task_from_gym_row",
    "task_spec",
]

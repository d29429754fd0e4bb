# SPDX-License-Identifier: Apache-2.0
"""The NeMo Gym names `polar_swe` uses that differ between the Gym NeMo RL runs (0.5.1, the commit NeMo RL pins) and
PyPI's 0.7.

Gym 0.7 adds Environment Servers, which seed and close a resources server's state by a caller-assigned
`resources_session_id` (`ResourcesSeedSessionRequest` … `ResourcesCloseSessionResponse`, and a `/close_session`
route). Gym 0.5.1 has none of them: a NeMo RL launch reaches `polar_swe` only through `polar_agent`'s own
`/seed_session` call. Here, under 0.5.1, the four models are declared with 0.7's fields so the server's code and
schema are the same under both; nothing in 0.5.1 ever sends them. `HAS_ENVIRONMENT_SERVERS` says which Gym this is.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

try:
    from nemo_gym.base_resources_server import (
        ResourcesCloseSessionRequest,
        ResourcesCloseSessionResponse,
        ResourcesSeedSessionRequest,
        ResourcesSeedSessionResponse,
    )

    HAS_ENVIRONMENT_SERVERS = True
except ImportError:  # Gym 0.5.1 (the Gym NeMo RL pins)
    HAS_ENVIRONMENT_SERVERS = False

    class ResourcesSeedSessionRequest(BaseModel):  # type: ignore[no-redef]
        """Gym 0.7's Environment-Server seed request (never sent under Gym 0.5.1)."""

        model_config = ConfigDict(extra="forbid")

        resources_session_id: str = Field(min_length=1)
        episode_id: str
        task_id: str
        task_data: dict[str, Any]

    class ResourcesSeedSessionResponse(BaseModel):  # type: ignore[no-redef]
        model_config = ConfigDict(extra="forbid")

        resources_session_id: str

    class ResourcesCloseSessionRequest(BaseModel):  # type: ignore[no-redef]
        model_config = ConfigDict(extra="forbid")

        resources_session_id: str
        episode_id: str

    class ResourcesCloseSessionResponse(BaseModel):  # type: ignore[no-redef]
        model_config = ConfigDict(extra="forbid")

        resources_session_id: str


__all__ = [
    "HAS_ENVIRONMENT_SERVERS",
    "ResourcesCloseSessionRequest",
    "ResourcesCloseSessionResponse",
    "ResourcesSeedSessionRequest",
    "ResourcesSeedSessionResponse",
]

# SPDX-License-Identifier: Apache-2.0
"""Fixtures for tests on the real container engines (Docker, Podman), installed by `make setup`.

`container_engine` (parametrised over both engines) starts what the engine needs the way the runtime does: a
private dockerd under the cache dir (stopped at the end of the session when this fixture started it), Podman with
the project's containers.conf. `base_image` builds (or finds, cached by content hash) `polar-base` on that engine.
An engine that is not installed is a failure under CI (`docker` is not on the skip allow-list), a skip elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nemo_polar.runtime import engines
from nemo_polar.runtime.engines import ENGINES, Engine, engine_available, get_engine, stop_docker


@pytest.fixture(scope="session")
def _docker_started_here() -> Iterator[list[bool]]:
    started: list[bool] = []
    yield started
    if started:
        stop_docker()


@pytest.fixture(scope="session", params=ENGINES)
def container_engine(request: pytest.FixtureRequest, _docker_started_here: list[bool]) -> Engine:
    kind = str(request.param)
    why = engine_available(kind)
    if why is not None:
        pytest.skip(f"container engine {kind} unusable: {why}")
    if kind == "docker":
        was_running = engines._pid_of(engines._docker_paths()["pid"]) is not None
        engine = get_engine(kind)
        if not was_running:
            _docker_started_here.append(True)
        return engine
    return get_engine(kind)


@pytest.fixture(scope="session")
def base_image(container_engine: Engine) -> str:
    from nemo_polar.runtime.images import ensure_base

    return ensure_base(container_engine).tag

# SPDX-License-Identifier: Apache-2.0
"""The smoke drivers' seed call to polar_swe (`polar_lab.gym_grpo_smoke.seed_hosted_stack`): a connection the
server closes before answering is made again, an answer that refuses is not, and a server that is gone is named
as gone. Real sockets on loopback; the server here is a plain socket server, not polar_swe."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
from collections.abc import Iterator

import pytest

from nemo_polar.backend.server import free_port
from polar_lab.gym_grpo_smoke import seed_hosted_stack

REPLY = {"proxy_url": "http://127.0.0.1:1/polar", "rollout_url": "http://127.0.0.1:2", "served_model": "m"}


def _read_request(conn: socket.socket) -> dict[str, object] | None:
    """The JSON body of one request; None for a connection closed without one (the driver's liveness probe)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    return dict(json.loads(body))


def _serve(listener: socket.socket, plan: list[str], seen: list[dict[str, object]]) -> None:
    steps = iter(plan)
    step = next(steps)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # the listener closed: the test is over
            return
        with conn:
            body = _read_request(conn)
            if body is None:
                continue
            seen.append(body)
            if step != "close":  # "close": closed without a response
                status, payload = ("200 OK", REPLY) if step == "ok" else ("409 Conflict", {"detail": "other upstream"})
                raw = json.dumps(payload).encode()
                conn.sendall(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
                    f"Connection: close\r\n\r\n".encode()
                    + raw
                )
            step = next(steps, "ok")


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[tuple[int, list[dict[str, object]]]]:
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[dict[str, object]] = []
    thread = threading.Thread(target=_serve, args=(listener, request.param, seen), daemon=True)
    thread.start()
    yield listener.getsockname()[1], seen
    listener.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept()
    listener.close()
    thread.join(timeout=5)


@pytest.mark.parametrize("server", [["close", "ok"]], indirect=True)
def test_a_seed_closed_without_an_answer_is_made_again(server: tuple[int, list[dict[str, object]]]) -> None:
    port, seen = server
    lines: list[str] = []
    assert seed_hosted_stack(port, "http://up/v1", "m", log=lines.append) == REPLY
    assert seen == [{"upstream_url": "http://up/v1", "model": "m"}] * 2
    assert len(lines) == 1 and "RemoteDisconnected" in lines[0] and "still accepts connections" in lines[0]


@pytest.mark.parametrize("server", [["refuse", "ok"]], indirect=True)
def test_a_seed_polar_swe_refuses_is_not_made_again(server: tuple[int, list[dict[str, object]]]) -> None:
    port, seen = server
    with pytest.raises(urllib.error.HTTPError) as refused:
        seed_hosted_stack(port, "http://up/v1", "m", log=lambda _: None)
    assert refused.value.code == 409 and len(seen) == 1


def test_a_polar_swe_that_is_gone_is_named_as_gone() -> None:
    port = free_port()  # nothing listens there
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="accepts no connection: its process is gone"):
        seed_hosted_stack(port, "http://up/v1", "m", log=lines.append)
    assert len(lines) == 1  # no second try against a port nobody listens on

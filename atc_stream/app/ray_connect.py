"""Joining Ray for a command: the address checked with a gRPC handshake first, then
``ray.init``; one ``RunError`` line when either fails."""

from __future__ import annotations

import socket
from typing import Any

from atc_stream.app.console import RunError
from atc_stream.app.extras import require
from atc_stream.core.errors import first_line

#: Seconds a ``--ray-address`` has to answer the handshake (``ray.init`` itself retries a
#: wrong address for minutes).
HANDSHAKE_TIMEOUT_S = 5.0

#: An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS) answers
#: with a SETTINGS frame of its own.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def check_address(address: str | None) -> None:
    """``RunError`` (one line) unless ``ray.init`` can use ``address`` at once: None,
    ``auto`` or ``local``, or a ``[ray://]HOST:PORT`` where a gRPC server (a Ray head)
    answers."""
    if address is None or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RunError(f"--ray-address {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    why = _not_grpc(host.strip("[]"), int(port))
    if why is not None:
        raise RunError(
            f"cannot reach the Ray cluster at {address!r} ({why}): give the head's address "
            "(`ray start --head` prints it), or leave out --ray-address for a local one"
        )


def _not_grpc(host: str, port: int) -> str | None:
    """Why no gRPC server answers at ``host:port``; None when one does."""
    try:
        with socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT_S) as sock:
            sock.sendall(_HTTP2_HELLO)
            reply = sock.recv(9)
    except OSError as exc:
        return first_line(exc)
    if len(reply) < 4 or reply[3] != 4:  # the 4th byte of a frame header is its type
        return "it does not answer like a Ray head (no gRPC)"
    return None


def connect(address: str | None, command: str, **options: Any) -> bool:
    """Ray initialised for ``command`` (``address`` None or ``local``: a new local
    instance), ``options`` passed to ``ray.init``; whether this call started it (the
    caller then shuts it down)."""
    require("ray", command)
    check_address(address)
    import ray

    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, **options)
    except Exception as exc:  # Ray raises many types for a cluster it cannot start or join
        where = f" at {address!r}" if address else ""
        raise RunError(f"cannot start or join the Ray cluster{where}: {first_line(exc)}") from None
    return True

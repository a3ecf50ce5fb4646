"""Redis at the wire level: RESP commands packed by hand, raw pipelines, replies parsed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

CRLF = b"\r\n"


class ReplyError(Exception):
    """An error reply from Redis (``-ERR ...``)."""


def bulk(data: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack_command(args: Sequence[bytes | str | int]) -> bytes:
    """One command in the Redis protocol (RESP). Much cheaper than redis-py's generic
    packing for commands with thousands of arguments."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        parts.append(bulk(arg))
    return b"".join(parts)


def fail_fast_client(
    url: str, socket_timeout: float | None = None, connect_timeout: float | None = None
) -> redis.Redis:
    """A client without redis-py's built-in retries: the caller owns the retry policy
    (``connectors.retry.Backoff``), and a lost reply must surface rather than be resent.
    ``connect_timeout`` defaults to ``socket_timeout`` (None: block)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout if connect_timeout is None else connect_timeout,
        retry=Retry(NoBackoff(), 0),
    )


def client_of(
    url_or_client: str | redis.Redis,
    socket_timeout: float | None = None,
    connect_timeout: float | None = None,
) -> redis.Redis:
    """``url_or_client`` when it is a client (the caller's own settings), else a
    ``fail_fast_client`` of the URL with these timeouts."""
    if isinstance(url_or_client, str):
        return fail_fast_client(url_or_client, socket_timeout, connect_timeout)
    return url_or_client


def send_packed(client: redis.Redis, commands: Sequence[bytes]) -> list[Any]:
    """Send pre-packed commands in one write and read their replies (a raw pipeline).

    Raises ``redis.ResponseError`` for the first error reply and ``redis.ConnectionError``
    when the server is unreachable; the connection is dropped on any failure so that
    no unread reply is left behind.
    """
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(list(commands))
        replies: list[Any] = []
        error: redis.ResponseError | None = None
        for _ in commands:
            try:
                replies.append(conn.read_response(disconnect_on_error=True))
            except redis.ResponseError as exc:  # keep reading: the stream stays in sync
                error = error or exc
                replies.append(exc)
        if error is not None:
            raise error
        return replies
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


async def read_reply(reader: asyncio.StreamReader) -> Any:
    """One reply in the Redis protocol (RESP2): int, bytes, None, list or ``ReplyError``."""
    line = await reader.readuntil(CRLF)
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body
    if kind == b"-":
        return ReplyError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        if size < 0:
            return None
        return (await reader.readexactly(size + 2))[:-2]
    if kind == b"*":
        size = int(body)
        return None if size < 0 else [await read_reply(reader) for _ in range(size)]
    raise ValueError(f"not a redis reply: {line[:40]!r}")

"""Which shard a symbol belongs to, and the Redis names of a shard (docs/design/cluster.md)."""

from __future__ import annotations

import zlib

#: The most shards a cluster may have: a Redis Cluster has 16,384 hash slots, and each
#: shard's keys share one (``shard_tag``), so more shards could not be spread further.
MAX_SHARDS = 16_384


def check_shards(shards: int) -> int:
    """A validated shard count (an int from 1 to ``MAX_SHARDS``)."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be an int from 1 to {MAX_SHARDS}, got {shards!r}")
    return shards


def shard_of(symbol: str, shards: int) -> int:
    """The shard (``0 .. shards - 1``) of every stream of ``symbol``.

    CRC-32 (zlib, IEEE polynomial) of the symbol's UTF-8 bytes, modulo ``shards``: the
    same on every machine, process and Python version (unlike ``hash``), and cheap
    enough for a router that sees every bar. Every parameter set and strategy of a
    symbol lives in the symbol's shard, so one bar goes to one shard.
    """
    check_shards(shards)
    if not isinstance(symbol, str) or not symbol:
        raise ValueError(f"symbol must be a non-empty str, got {symbol!r}")
    return zlib.crc32(symbol.encode()) % shards


def shard_tag(shard: int) -> str:
    """The Redis Cluster hash tag of a shard's keys: ``{shard-3}``; keys that share it
    live in one cluster slot, so one script may touch them together."""
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
        raise ValueError(f"shard must be an int >= 0, got {shard!r}")
    return f"{{shard-{shard}}}"


def bars_stream(prefix: str, shard: int) -> str:
    """The Redis Stream of a shard's incoming bars: ``atc:bars:{shard-3}``."""
    return f"{prefix}:bars:{shard_tag(shard)}"


def shard_namespace(shard: int) -> str:
    """The snapshot namespace of a shard (``--namespace``): ``shard-3``; a Redis snapshot
    store wraps it in a hash tag of its own (``{atc-stream:shard-3}``)."""
    shard_tag(shard)  # validates
    return f"shard-{shard}"

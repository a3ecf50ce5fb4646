"""The shard of a symbol and the Redis names of a shard."""

import zlib

import pytest

from atc_stream.core.shards import (
    MAX_SHARDS,
    bars_stream,
    check_shards,
    shard_namespace,
    shard_of,
    shard_tag,
)

FIXED = [1, 6, 3]


def test_shard_of_is_crc32_of_the_symbol_modulo_shards():
    # fixed values: the mapping must never change between versions
    assert [shard_of(s, 7) for s in ("BTCUSDT", "ETHUSDT", "SOLUSDT")] == FIXED
    for symbol in ("BTCUSDT", "ETHUSDT", "S0001USDT", "é"):
        for shards in (1, 2, 3, 16):
            assert shard_of(symbol, shards) == zlib.crc32(symbol.encode()) % shards
    assert shard_of("BTCUSDT", 1) == 0


def test_shards_spread_symbols_evenly():
    symbols = [f"S{i:05d}USDT" for i in range(30_000)]
    counts = [0] * 16
    for s in symbols:
        counts[shard_of(s, 16)] += 1
    assert max(counts) < 1.1 * len(symbols) / 16


def test_names_carry_one_hash_tag_per_shard():
    assert shard_tag(3) == "{shard-3}"
    assert bars_stream("atc", 3) == "atc:bars:{shard-3}"
    assert shard_namespace(3) == "shard-3"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", MAX_SHARDS + 1])
def test_bad_shard_counts_are_refused(bad):
    with pytest.raises(ValueError, match="shards"):
        check_shards(bad)
    with pytest.raises(ValueError, match="shards"):
        shard_of("BTCUSDT", bad)


def test_bad_symbols_and_shards_are_refused():
    with pytest.raises(ValueError, match="symbol"):
        shard_of("", 2)
    with pytest.raises(ValueError, match="shard"):
        shard_tag(-1)


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "BARS", "--shard-snapshots", "100000", "--snapshot-to", "SNAPS"],
        ["replay", "BARS", "--route-shards", "100000", "--redis", "redis://127.0.0.1:1"],
        ["cluster", "reshard", "--to", "100000", "--redis", "redis://127.0.0.1:1"],
    ],
    ids=["shard-snapshots", "route-shards", "reshard"],
)
def test_a_shard_count_past_the_redis_cluster_slots_is_one_line(tmp_path, run_main, args):
    """A typo of a shard count (a snapshot, a stream or a key per shard) is refused before
    anything is written, not a million snapshots."""
    bars = tmp_path / "bars.csv"
    bars.write_text("symbol,time,close\nA,1700000000000,1.0\n")
    snaps = tmp_path / "snaps"
    args = [str(bars) if a == "BARS" else str(snaps) if a == "SNAPS" else a for a in args]
    code, err = run_main(args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"must be at most {MAX_SHARDS}" in err
    assert not snaps.exists()

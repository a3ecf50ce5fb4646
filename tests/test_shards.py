"""The shard of a symbol and the Redis names of a shard."""

import zlib

import pytest

from atc_stream.core.shards import bars_stream, check_shards, shard_namespace, shard_of, shard_tag

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


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
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

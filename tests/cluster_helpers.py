"""Shared pieces of the cluster tests: bars, the single-process reference, output checks."""

from __future__ import annotations

import msgspec

from atc_stream import ATCParams, Engine
from atc_stream.connectors.redis.stream_output import read_outputs
from atc_stream.connectors.replay.player import random_walk_table
from atc_stream.core.messages import records_from_result


def bar_list(n_symbols: int, n_bars: int, seed: int = 11) -> list[tuple[str, int, float]]:
    """Bars of ``n_symbols`` random walks in time order (all symbols per time)."""
    table = random_walk_table(n_symbols=n_symbols, n_bars=n_bars, seed=seed)
    bars = list(
        zip(table.symbols.tolist(), table.times.tolist(), table.closes.tolist(), strict=True)
    )
    return sorted(bars, key=lambda b: (b[1], b[0]))


def fields(bar: tuple[str, int, float]) -> dict[str, object]:
    return {"symbol": bar[0], "time": bar[1], "close": repr(bar[2])}


def reference(bars, params=None) -> dict[tuple[str, int], dict]:
    """The records of one engine over every bar, by (stream key, time)."""
    engine = Engine(params or ATCParams(), backend="cpu", outputs="all")
    for symbol in dict.fromkeys(b[0] for b in bars):
        engine.add_symbol(symbol)
    records = [msgspec.to_builtins(r) for r in records_from_result(engine.step(bars))]
    return {(f"{r['symbol']}:{r['interval']}:{r['params_id']}", r["time"]): r for r in records}


def check_outputs(client, output_stream: str, expected: dict[tuple[str, int], dict]) -> None:
    """Every (stream, time) exactly once in the output stream, with the reference values."""
    got = read_outputs(client, output_stream)
    keys = [(e["key"], e["time"]) for e in got]
    assert len(keys) == len(set(keys)), "duplicated outputs"
    assert set(keys) == set(expected), (len(set(expected) - set(keys)), "missing outputs")
    for entry in got:
        assert entry["record"] == expected[(entry["key"], entry["time"])]

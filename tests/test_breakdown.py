"""A ready signal that turns na (an equity overflowed) is warned about once per stream."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import numpy as np

from atc_stream import ATCParams, Engine

BAR = 60_000
WARNING = "signal is na on a ready bar"


def walk(n_symbols: int, n_bars: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = rng.normal(0, 0.002, (n_symbols, n_bars))
    return np.round(100 * np.exp(np.cumsum(steps, axis=1)), 2)


def named(records) -> list[str]:
    """The symbols named in the breakdown warnings, in order (each may appear once)."""
    names: list[str] = []
    for record in records:
        message = record.getMessage()
        if WARNING in message:
            names += re.search(r"\(([^)]*)\)", message).group(1).split(", ")
    return names


def step_through(engine, symbols, closes, start, stop, caplog):
    """Step bar by bar; per symbol the first bar with a na signal while ready, and the
    warnings of the step that saw it."""
    first_na: dict[str, int] = {}
    warned_at: dict[str, int] = {}
    for t in range(start, stop):
        caplog.clear()
        result = engine.step([(s, t * BAR, float(closes[i, t])) for i, s in enumerate(symbols)])
        ready = result.fields["bar_index"] >= result.ready_from
        for symbol, signal, is_ready in zip(
            result.symbols, result.fields["signal"], ready, strict=True
        ):
            if is_ready and np.isnan(signal) and symbol not in first_na:
                first_na[symbol] = t
        for symbol in named(caplog.records):
            assert symbol not in warned_at, f"{symbol} warned twice"
            warned_at[symbol] = t
    return first_na, warned_at


def test_each_stream_is_warned_once_at_the_step_its_ready_signal_turns_na(caplog):
    symbols = ["AAA", "BBB", "CCC"]
    closes = walk(3, 1_200)
    engine = Engine(ATCParams(La=1000))
    engine.warmup({s: (np.arange(80) * BAR, closes[i, :80]) for i, s in enumerate(symbols)})
    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        first_na, warned_at = step_through(engine, symbols, closes, 80, 1_200, caplog)
    assert set(first_na) == set(symbols)  # La 1000: growth exp(i) overflows by bar 710
    assert warned_at == first_na


def test_a_stream_added_again_is_warned_about_again(caplog):
    closes = walk(1, 1_000)
    engine = Engine(ATCParams(La=1000))
    history = {"AAA": (np.arange(1_000) * BAR, closes[0])}
    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        engine.warmup(history)
        engine.warmup({"AAA": (np.arange(1_000, 1_010) * BAR, closes[0, -10:])})
        assert named(caplog.records) == ["AAA"]
        engine.remove_symbol("AAA")
        engine.warmup(history)
    assert named(caplog.records) == ["AAA", "AAA"]


def test_default_parameters_give_no_warning(caplog):
    closes = walk(4, 3_000, seed=5)
    engine = Engine()
    history = {f"S{i}": (np.arange(3_000) * BAR, closes[i]) for i in range(4)}
    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        result = engine.warmup(history)
    assert not np.isnan(result.fields["signal"]).any()
    assert named(caplog.records) == []


def test_replay_says_so_on_stderr(tmp_path):
    closes = walk(2, 900)
    bars = tmp_path / "bars.csv"
    lines = ["symbol,time,close"]
    for t in range(900):
        lines += [f"{s},{t * BAR},{closes[i, t]}" for i, s in enumerate(("AAA", "BBB"))]
    bars.write_text("\n".join(lines) + "\n")
    params = tmp_path / "params.json"
    params.write_text('{"La": 1000}')
    cmd = [sys.executable, "-m", "atc_stream", "replay", str(bars), "--params", str(params)]
    proc = subprocess.run(
        [*cmd, "-o", str(tmp_path / "signals.jsonl")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if WARNING in line]
    assert warnings and all(line.startswith("atc-stream: WARNING") for line in warnings)
    assert sorted(named(logging.makeLogRecord({"msg": w}) for w in warnings)) == ["AAA", "BBB"]
    assert "Traceback" not in proc.stderr


def test_compute_warns_too(caplog):
    from atc_stream import compute

    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        out = compute(walk(1, 900)[0], ATCParams(La=1000), symbol="AAA")
    assert np.isnan(out["signal"][out["ready"]]).any()
    assert named(caplog.records) == ["AAA"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="atc_stream"):
        compute(walk(1, 900)[0])
    assert named(caplog.records) == []

"""The ``plot`` job: chart one symbol of a signal file, or one stream of a sweep, into an image."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from atc_stream.app.console import OptionError, RunError, err
from atc_stream.app.extras import require
from atc_stream.core.errors import first_line
from atc_stream.core.params import ATCParams
from atc_stream.core.strategy import Strategy
from atc_stream.engine.backtest import backtest
from atc_stream.io.ohlc import read_ohlc
from atc_stream.io.readers import InputError

#: Columns of a sweep's trades.parquet that picking a stream and checking it needs.
TRADE_KEYS = ("exit_time", "symbol", "params_id", "strategy_id")


def run_plot(
    *, signals: Path, symbol: str | None, output: Path, params_id: int, title: str | None
) -> int:
    """Write the chart; the exit status (``RunError`` for an unusable file)."""
    require("plot", "atc-stream plot")
    from atc_stream.app.plot import PlotError, load_signals, plot_signals

    check_image_path(output)
    try:
        frame = load_signals(signals)
        if len(frame) == 0:
            raise PlotError(f"{signals}: no rows to draw")
        skipped = frame.attrs.get("skipped_lines", [])
        if skipped:
            line, reason = skipped[0]
            more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
            err(f"atc-stream: {signals}: skipped {len(skipped)} unreadable line(s): "
                f"line {line}: {reason}{more}")  # fmt: skip
        figure = plot_signals(frame, symbol=symbol, params_id=params_id, title=title)
    except PlotError as exc:
        raise RunError(str(exc)) from None
    _save(figure, output)
    return 0


def check_image_path(output: Path) -> None:
    """``OptionError`` naming the formats matplotlib writes when ``output``'s extension is
    none of them (it would fail only after the chart is drawn)."""
    from matplotlib.figure import Figure

    formats = sorted(Figure().canvas.get_supported_filetypes())
    if output.suffix.lower().lstrip(".") not in formats:
        known = ", ".join(f".{name}" for name in formats)
        raise OptionError(f"cannot tell the image format of {str(output)!r}: use {known}",
                          "--output")  # fmt: skip


def _save(figure, output: Path) -> None:
    try:
        figure.savefig(output, dpi=110)
    except OSError as exc:
        raise RunError(f"cannot write {output}: {exc.strerror or exc}") from None
    err(f"atc-stream: wrote {output}")


def run_plot_backtest(
    *,
    trades: Path,
    bars: Path | None,
    symbol: str | None,
    output: Path,
    params_id: int,
    strategy_id: int,
    title: str | None,
) -> int:
    """Chart one stream of a sweep: its bars run again with the set and strategy recorded
    beside ``trades`` (``params.parquet``, ``strategies.parquet``), checked against the
    recorded trades; the exit status."""
    require("plot", "atc-stream plot --trades")
    from atc_stream.app.plot import PlotError
    from atc_stream.app.plot_backtest import plot_backtest

    if bars is None:
        raise OptionError("--trades needs --bars (the data the sweep ran on)", "--bars")
    check_image_path(output)
    recorded, params, strategy = _sweep_stream(trades, params_id, strategy_id)
    table = _bars_of(bars, symbol, recorded)
    symbol = str(table.symbols[0])
    result = backtest(table.to_arrow(), [params], [strategy])
    again = result.trades_arrow()
    mine = recorded.filter(pc.equal(recorded.column("symbol"), symbol))
    if mine.column("exit_time").to_pylist() != again.column("exit_time").to_pylist():
        raise RunError(
            f"{bars} does not give the trades of {trades} for {symbol} (params_id "
            f"{params_id}, strategy_id {strategy_id}): not the data the sweep ran on?"
        )
    try:
        relabelled = _Relabelled(result, params_id, strategy_id)
        figure = plot_backtest(relabelled, table.to_arrow(), symbol, params_id, strategy_id,
                               title=title)  # fmt: skip
    except PlotError as exc:
        raise RunError(str(exc)) from None
    _save(figure, output)
    return 0


def _sweep_stream(trades: Path, params_id: int, strategy_id: int):
    """The trades of one (params_id, strategy_id) of a sweep's trades.parquet, and the
    parameter set and strategy its params.parquet and strategies.parquet hold for them."""
    if trades.is_dir() and (trades / "trades.parquet").exists():
        raise RunError(
            f"--trades {trades} is a directory: give its trades.parquet "
            f"({trades / 'trades.parquet'})"
        )
    folder = trades.parent
    try:
        recorded = pq.read_table(trades)
        missing = [c for c in TRADE_KEYS if c not in recorded.column_names]
        if missing:
            plural = "s" if missing[1:] else ""
            raise RunError(
                f"--trades {trades} is not a sweep's trades table (no column{plural} "
                f"{', '.join(missing)})"
            )
        params_rows = pq.read_table(folder / "params.parquet").to_pylist()
        strategy_rows = pq.read_table(folder / "strategies.parquet").to_pylist()
    except (OSError, pa.ArrowInvalid) as exc:
        raise RunError(f"cannot read the sweep beside {trades}: {first_line(exc)}") from None
    for name, rows, wanted, flag in (
        ("params_id", params_rows, params_id, "--params-id"),
        ("strategy_id", strategy_rows, strategy_id, "--strategy-id"),
    ):
        if not 0 <= wanted < len(rows):
            raise OptionError(f"the sweep has {name} 0..{len(rows) - 1}, not {wanted}", flag)
    params = ATCParams.from_dict({k: v for k, v in params_rows[params_id].items()
                                  if k != "params_id"})  # fmt: skip
    strategy = Strategy.from_dict({k: v for k, v in strategy_rows[strategy_id].items()
                                   if k != "strategy_id"})  # fmt: skip
    mine = pc.and_(
        pc.equal(recorded.column("params_id"), params_id),
        pc.equal(recorded.column("strategy_id"), strategy_id),
    )
    return recorded.filter(mine), params, strategy


def _bars_of(bars: Path, symbol: str | None, recorded):
    try:
        table = read_ohlc(bars)
    except InputError as exc:
        raise RunError(str(exc)) from None
    names = table.symbol_names
    if symbol is None:
        if len(names) != 1:
            raise OptionError(f"{bars} holds {len(names)} symbols: pick one", "--symbol")
        symbol = names[0]
    if symbol not in names:
        raise OptionError(f"{bars} has no symbol {symbol!r} ({', '.join(names[:10])})", "--symbol")
    return table.of_symbols([symbol])


class _Relabelled:
    """A one-stream result whose ids read as the sweep's (the rerun numbers them 0)."""

    def __init__(self, result, params_id: int, strategy_id: int) -> None:
        self.trades = result.trades.assign(params_id=params_id, strategy_id=strategy_id)
        self.equity = result.equity.assign(params_id=params_id, strategy_id=strategy_id)

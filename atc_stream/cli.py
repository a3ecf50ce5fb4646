"""The ``atc-stream`` command: replay bar files, run the demo (and, with extras, more).

Results go to JSONL (stdout by default) or Parquet; progress and the closing summary
go to stderr so stdout stays machine-readable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from .params import ATCParams

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Exact, incremental Adaptive Trend Classification (ATC) signals for many symbols.",
)


def _err(line: str) -> None:
    print(line, file=sys.stderr)


def load_param_sets(path: Path | None) -> list[ATCParams]:
    """Parameter sets from a JSON file: one object, or a list of objects (a sweep)."""
    if path is None:
        return [ATCParams()]
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise typer.BadParameter(f"cannot read parameters from {path}: {exc}") from exc
    items = data if isinstance(data, list) else [data]
    try:
        return [ATCParams.from_dict(item) for item in items]
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}") from exc


ParamsOption = Annotated[
    Path | None,
    typer.Option("--params", help="JSON file with ATC parameters (an object or a list of them)."),
]
OutputOption = Annotated[
    str,
    typer.Option(
        "--output", "-o", help="Where signals go: '-' (stdout), FILE.jsonl or FILE.parquet."
    ),
]
WarmupOption = Annotated[
    int, typer.Option("--warmup", help="Bars per symbol applied in one batched warmup first.")
]
ProgressOption = Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar.")]
BackendOption = Annotated[str, typer.Option("--backend", help="cpu, cuda or auto.")]
IntervalOption = Annotated[
    str, typer.Option("--interval", help="Bar interval label of the streams.")
]


def _replay_table(table, *, params, output, warmup, speed, progress, backend, interval) -> None:
    from .adapters.sinks import open_sink
    from .engine import Engine
    from .replay.player import BarPlayer

    engine = Engine(params, backend=backend, interval=interval, capacity=max(len(table), 1))
    with open_sink(output) as sink:
        player = BarPlayer(
            engine,
            table,
            warmup_bars=warmup,
            speed=speed,
            on_result=sink.write,
            progress=progress,
        )
        summary = player.run()
    _err(f"atc-stream: replay done ({engine.backend.name} backend)")
    for line in summary.lines():
        _err("  " + line)
    return engine, summary


@app.command()
def replay(
    bars: Annotated[Path, typer.Argument(help="CSV or Parquet file of bars.")],
    symbol_column: Annotated[str, typer.Option(help="Column with the symbol.")] = "symbol",
    time_column: Annotated[
        str, typer.Option(help="Column with the bar time (int or ISO).")
    ] = "time",
    close_column: Annotated[str, typer.Option(help="Column with the close.")] = "close",
    symbol: Annotated[
        str | None,
        typer.Option(help="Symbol for a file without a symbol column (default: file stem)."),
    ] = None,
    params: ParamsOption = None,
    output: OutputOption = "-",
    warmup: WarmupOption = 0,
    speed: Annotated[
        float | None,
        typer.Option(help="Play at SPEED x real time (bar times in ms); default: max."),
    ] = None,
    progress: ProgressOption = True,
    backend: BackendOption = "auto",
    interval: IntervalOption = "1m",
) -> None:
    """Feed a bar file through the engine and write one signal row per (stream, bar)."""
    from .replay.player import load_bars

    try:
        table = load_bars(
            bars,
            symbol_column=symbol_column,
            time_column=time_column,
            close_column=close_column,
            symbol=symbol,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="BARS") from exc
    _replay_table(
        table,
        params=load_param_sets(params),
        output=output,
        warmup=warmup,
        speed=speed,
        progress=progress,
        backend=backend,
        interval=interval,
    )


@app.command()
def demo(
    symbols: Annotated[int, typer.Option(help="Number of random-walk symbols.")] = 20,
    bars: Annotated[int, typer.Option(help="Bars per symbol.")] = 3000,
    seed: Annotated[int, typer.Option(help="Random seed (the data set is deterministic).")] = 7,
    warmup: WarmupOption = 1000,
    output: OutputOption = "atc_demo_signals.jsonl",
    params: ParamsOption = None,
    progress: ProgressOption = True,
    backend: BackendOption = "cpu",
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Compare with a full recomputation.")
    ] = True,
) -> None:
    """Generate a deterministic multi-symbol random walk and replay it (needs nothing else)."""
    import numpy as np

    from .replay.player import random_walk_table
    from .series import compute

    table = random_walk_table(symbols, bars, seed)
    param_sets = load_param_sets(params)
    _err(f"atc-stream demo: {symbols} symbols x {bars} bars, warmup {warmup}, output {output}")
    last_signal: dict[str, float] = {}

    def remember(result) -> None:
        for key, value in zip(result.keys, result.signal, strict=True):
            if key.params_id == 0:
                last_signal[key.symbol] = value

    from .adapters.sinks import open_sink

    with open_sink(output) as sink:

        def on_result(result) -> None:
            sink.write(result)
            remember(result)

        from .engine import Engine
        from .replay.player import BarPlayer

        engine = Engine(param_sets, backend=backend, capacity=max(symbols * len(param_sets), 1))
        summary = BarPlayer(
            engine, table, warmup_bars=warmup, on_result=on_result, progress=progress
        ).run()
    _err(f"atc-stream: demo done ({engine.backend.name} backend)")
    for line in summary.lines():
        _err("  " + line)
    if check:
        mismatches = 0
        for symbol in table.symbol_names:
            closes = table.closes[table.symbols == symbol]
            full = compute(closes, param_sets[0])["Average_Signal"][-1]
            same = np.array_equal(full, last_signal[symbol], equal_nan=True)
            mismatches += not same
        verdict = "identical" if mismatches == 0 else f"{mismatches} MISMATCHES"
        _err(f"  full recomputation check: last signal of {symbols} symbols {verdict}")
        if mismatches:
            raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""Paper trading options of the ``replay`` and ``live`` jobs (``--strategy``, ``--trades``,
``--positions``): checked once, and the strategies' summary lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from atc_stream.app.console import OptionError
from atc_stream.core.strategy import Strategy, strategies_from_specs
from atc_stream.io.writers import OutputError, output_format


@dataclass(frozen=True)
class PaperOptions:
    """Paper trading asked of a replay: the strategies and where their outputs go."""

    strategies: list[Strategy]
    trades: Path | None = None
    positions: Path | None = None


def check_paper_options(
    specs: Sequence[str],
    *,
    trades: Path | None,
    positions: Path | None,
) -> PaperOptions | None:
    """The ``PaperOptions`` of ``--strategy``/``--trades``/``--positions`` (None without
    ``--strategy``); ``OptionError`` naming the option for a value or combination refused."""
    if not specs:
        for name, given in (("--trades", trades), ("--positions", positions)):
            if given is not None:
                raise OptionError(f"{name} needs --strategy", param_hint=name)
        return None
    try:
        strategies = strategies_from_specs(list(specs))
    except ValueError as exc:
        raise OptionError(str(exc), param_hint="--strategy") from None
    if not strategies:
        raise OptionError("the TOML file holds no strategy", param_hint="--strategy")
    for name, path in (("--trades", trades), ("--positions", positions)):
        if path is not None and str(path) == "-":
            raise OptionError("give a file: stdout is the signal output's", param_hint=name)
        if path is not None and _format(path) not in ("jsonl", "parquet"):
            raise OptionError(f"{path}: use .jsonl or .parquet", param_hint=name)
    return PaperOptions(strategies, trades, positions)


def paper_lines(engine) -> list[str]:
    """Summary lines of the strategies: per strategy, trades closed and mean return."""
    metrics = engine.strategy_metrics()
    lines = []
    for k in range(len(engine.strategies)):
        mine = metrics["strategy_id"] == k
        trades = int(metrics["trades"][mine].sum())
        mean = float(metrics["total_return"][mine].mean()) if mine.any() else 0.0
        lines.append(f"strategy {k:<7} {trades} trades, mean total return {mean:+.4%}")
    return lines


def _format(path: Path) -> str | None:
    """The output format of ``path``'s extension; None for one no output has (the signal
    output's message would list formats these options refuse)."""
    try:
        return output_format(path)
    except OutputError:
        return None

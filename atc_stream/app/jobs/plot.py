"""The ``plot`` job: chart one symbol of a signal file (``app.plot``) into an image."""

from __future__ import annotations

from pathlib import Path

from atc_stream.app.console import RunError, err
from atc_stream.app.extras import require


def run_plot(
    *, signals: Path, symbol: str | None, output: Path, params_id: int, title: str | None
) -> int:
    """Write the chart; the exit status (``RunError`` for an unusable file)."""
    require("plot", "atc-stream plot")
    from atc_stream.app.plot import PlotError, load_signals, plot_signals

    try:
        frame = load_signals(signals)
        figure = plot_signals(frame, symbol=symbol, params_id=params_id, title=title)
    except PlotError as exc:
        raise RunError(str(exc)) from None
    figure.savefig(output, dpi=110)
    err(f"atc-stream: wrote {output}")
    return 0

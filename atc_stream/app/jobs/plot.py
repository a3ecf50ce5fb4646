"""The ``plot`` job: chart one symbol of a signal file (``atc_stream.plot``) into an image."""

from __future__ import annotations

from pathlib import Path

from atc_stream.app.console import err


def run_plot(
    *, signals: Path, symbol: str | None, output: Path, params_id: int, title: str | None
) -> int:
    """Write the chart; the exit status (2 for an unusable file or missing plot extra)."""
    from atc_stream.app.plot import (  # imports its extras lazily
        PlotError,
        load_signals,
        plot_signals,
    )

    try:
        frame = load_signals(signals)
        figure = plot_signals(frame, symbol=symbol, params_id=params_id, title=title)
    except PlotError as exc:
        err(f"atc-stream plot: {exc}")
        return 2
    except ImportError as exc:  # pandas/pyarrow/matplotlib not installed
        err(f"atc-stream plot: needs the plot extra (pip install 'atc-stream[plot]'): {exc}")
        return 2
    figure.savefig(output, dpi=110)
    err(f"atc-stream: wrote {output}")
    return 0

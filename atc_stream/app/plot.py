"""Charts of signal rows: close price with long/short events, the signal below it, and
bands over the bars that are not ready yet (docs/spec.md, "Warm-up and readiness").

``plot_signals`` works on anything in the one output schema (a ``compute`` result, a
``StepResult.to_pandas()`` frame, or a file read by ``load_signals``); ``atc-stream plot``
is the same from the command line. matplotlib and pandas are imported only when used
(the ``plot`` extra).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from atc_stream.app.extras import require


class PlotError(ValueError):
    """The rows cannot be drawn (missing file, columns or symbol)."""


def load_signals(path: str | Path):
    """Signal rows from a Parquet file or directory of parts (what ``-o x.parquet`` writes),
    a JSONL or a CSV file, as a pandas DataFrame.

    JSONL lines that are not a JSON object (a line cut short by a kill, a stray text) are
    left out, and listed in ``frame.attrs["skipped_lines"]`` as ``(line number, reason)``.
    """
    require("pandas", "load_signals")
    import pandas as pd

    path = Path(path)
    suffix = path.suffix.lower()
    if not (path.is_file() or (path.is_dir() and suffix in (".parquet", ".pq"))):
        raise PlotError(f"{path}: no such file")
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".json", ".ndjson"):
            return _read_jsonl(path)
        if suffix == ".csv":
            try:
                return pd.read_csv(path)
            except pd.errors.EmptyDataError:  # no header either: no rows, as an empty JSONL
                return pd.DataFrame()
    except (OSError, ValueError) as exc:
        raise PlotError(f"{path}: cannot read signal rows ({exc})") from None
    raise PlotError(f"{path}: unknown file type {suffix!r} (want .parquet, .jsonl or .csv)")


def _read_jsonl(path: Path):
    """``pd.read_json(lines=True)``; when it refuses the file, the same on its readable
    lines (``load_signals``)."""
    import pandas as pd

    try:
        return pd.read_json(path, lines=True)
    except ValueError:
        pass
    good: list[str] = []
    skipped: list[tuple[int, str]] = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                skipped.append((number, f"not JSON ({getattr(exc, 'msg', exc)})"))
                continue
            if not isinstance(row, dict):
                skipped.append((number, "not a JSON object"))
                continue
            good.append(line.rstrip("\n") + "\n")
    if not good:
        first = f"; line {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
        raise PlotError(f"{path}: no readable signal rows{first}")
    frame = pd.read_json(io.StringIO("".join(good)), lines=True)
    frame.attrs["skipped_lines"] = skipped
    return frame


def plot_signals(
    rows: Any,
    *,
    symbol: str | None = None,
    params_id: int | None = None,
    title: str | None = None,
    figsize: tuple[float, float] = (11.0, 6.0),
):
    """A matplotlib Figure of one stream's rows (a DataFrame or a ``compute`` dict).

    Top: close, long (▲) and short (▼) events; bottom: the signal around its zero line;
    grey bands over the rows where ``ready`` is false.
    ``symbol``/``params_id`` pick the stream when the rows hold several. Without the
    ``plot`` extra: ``MissingExtra`` (an ``ImportError``) naming it.
    """
    require("plot", "plot_signals")
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    try:  # a column of text where the schema has numbers: one line, not a traceback
        frame = _one_stream(_frame(rows), symbol, params_id)
        x = _x_axis(frame)
        close = frame["close"].to_numpy(float)
        signal = frame["signal"].to_numpy(float)
    except PlotError:
        raise
    except (ValueError, TypeError) as exc:
        raise PlotError(
            f"the rows do not hold the output schema's types ({' '.join(str(exc).split())})"
        ) from None
    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=figsize, height_ratios=(2, 1), layout="constrained"
    )
    top.plot(x, close, color="#1f4e79", linewidth=1.0, label="close", **few_points(x))
    for column, marker, colour in (("long", "^", "#2e7d32"), ("short", "v", "#c62828")):
        hit = frame[column].to_numpy(bool)
        if hit.any():
            top.scatter(x[hit], close[hit], marker=marker, color=colour, s=36, zorder=3,
                        label=f"{column} ({int(hit.sum())})")  # fmt: skip
    bottom.plot(x, signal, color="#6a1b9a", linewidth=1.0, label="signal", **few_points(x))
    bottom.axhline(0.0, color="0.5", linewidth=0.6)
    if "ready" in frame:
        _shade_not_ready(frame["ready"].to_numpy(bool), x, (top, bottom))
    fit_one_point(x, top)
    top.set_ylabel("close")
    bottom.set_ylabel("signal")
    top.legend(loc="upper left", fontsize=8)  # after the shading, so "not ready" is listed
    name = str(frame["symbol"].iloc[0]) if "symbol" in frame and len(frame) else "series"
    top.set_title(title or f"ATC signal: {name}")
    return fig


def _frame(rows: Any):
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(dict(rows))
    if len(frame) == 0:  # an empty file has no columns either: that is not the news
        raise PlotError("no rows to draw")
    missing = [c for c in ("close", "signal", "long", "short") if c not in frame]
    if missing:
        raise PlotError(
            f"rows lack column(s) {missing}; expected the atc-stream output schema "
            "(docs/messages.md)"
        )
    return frame


def _one_stream(frame, symbol: str | None, params_id: int | None):
    if "symbol" in frame:
        symbols = frame["symbol"].astype(str).unique()
        if symbol is None and len(symbols) > 1:
            listed = ", ".join(sorted(symbols)[:10])
            raise PlotError(
                f"rows hold {len(symbols)} symbols ({listed}...): pick one with --symbol"
            )
        if symbol is not None:
            frame = frame[frame["symbol"].astype(str) == symbol]
            if len(frame) == 0:
                raise PlotError(f"no rows for symbol {symbol!r} (symbols: {sorted(symbols)[:10]})")
    if "params_id" in frame:
        ids = sorted(int(i) for i in frame["params_id"].unique())
        if params_id is None and len(ids) > 1:
            raise PlotError(f"rows hold parameter sets {ids}: pick one with --params-id")
        if params_id is not None:
            frame = frame[frame["params_id"] == params_id]
            if len(frame) == 0:
                raise PlotError(f"no rows for params_id {params_id} (have {ids})")
    if "provisional" in frame:
        frame = frame[~frame["provisional"].astype(bool)]
    return frame.sort_values("bar_index") if "bar_index" in frame else frame


def _x_axis(frame) -> np.ndarray:
    """Bar times as datetimes when the rows carry real times, else bar indexes."""
    import pandas as pd

    if "time" in frame:
        times = frame["time"]
        if pd.api.types.is_datetime64_any_dtype(times):
            return times.dt.tz_convert(None).to_numpy() if times.dt.tz else times.to_numpy()
        values = times.to_numpy(np.int64)
        if values.size and values.min() >= 10**11:  # epoch ms (after 1973)
            return values.astype("datetime64[ms]")
    if "bar_index" in frame:
        return frame["bar_index"].to_numpy(np.int64)
    return np.arange(len(frame))


#: Up to this many points, lines are drawn with a marker at each (one point draws no line).
FEW_POINTS = 20


def few_points(x: np.ndarray) -> dict:
    """Line options that show each point of a short series."""
    return {"marker": "o", "markersize": 4} if len(x) <= FEW_POINTS else {}


def fit_one_point(x: np.ndarray, ax) -> None:
    """A single point gets an x-range of its own scale around it (matplotlib widens the
    range of one date to years)."""
    if len(x) != 1:
        return
    pad = np.timedelta64(1, "h") if np.issubdtype(x.dtype, np.datetime64) else 1
    ax.set_xlim(x[0] - pad, x[0] + pad)


def _shade_not_ready(ready: np.ndarray, x: np.ndarray, axes) -> None:
    """Grey spans over each run of not-ready rows (one legend entry)."""
    if ready.all():
        return
    edges = np.flatnonzero(np.diff(np.r_[False, ~ready, False].astype(np.int8)))
    for k, (start, stop) in enumerate(zip(edges[::2], edges[1::2], strict=True)):
        right = x[stop] if stop < len(x) else x[stop - 1]
        for ax in axes:
            ax.axvspan(x[start], right, color="0.85", zorder=0,
                       label="not ready" if k == 0 and ax is axes[0] else None)  # fmt: skip

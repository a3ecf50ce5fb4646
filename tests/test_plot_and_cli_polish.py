"""The chart (``atc-stream plot`` and ``plot_signals``), ``--version``, the license
metadata and ``py.typed``."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import atc_stream
from atc_stream import ATCParams, Engine, compute
from atc_stream.app.cli import app
from atc_stream.core.schema import params_metadata
from atc_stream.io.writers import JsonlWriter, ParquetWriter

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402  (matplotlib depends on Pillow)

from atc_stream.app.plot import PlotError, plot_signals  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner(env={"COLUMNS": "240", "NO_COLOR": "1"})
T0 = 1_700_000_040_000


def closes_of(seed: int, n: int = 160) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(100 * np.exp(np.cumsum(rng.normal(0, 0.012, n))), 2)


@pytest.fixture(scope="module")
def signal_files(tmp_path_factory):
    """A Parquet and a JSONL file of two symbols' rows, as ``atc-stream replay`` writes."""
    folder = tmp_path_factory.mktemp("signals")
    eng = Engine(ATCParams(), backend="cpu", outputs="all")
    bars = {"BTCUSDT": closes_of(1), "ETHUSDT": closes_of(2)}
    for s in bars:
        eng.add_symbol(s)
    paths = folder / "signals.parquet", folder / "signals.jsonl"
    with (
        ParquetWriter(paths[0], metadata=params_metadata(eng.param_sets)) as pq,
        JsonlWriter(paths[1]) as js,
    ):
        for i in range(160):
            res = eng.step([(s, T0 + i * 60_000, float(c[i])) for s, c in bars.items()])
            pq.write(res)
            js.write(res)
    return paths


def assert_real_png(path: Path) -> None:
    assert path.stat().st_size > 20_000, path.stat().st_size
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.width >= 800 and img.height >= 400
        pixels = np.asarray(img.convert("RGB"), dtype=np.int16)
    not_white = (pixels < 245).any(axis=2)
    assert not_white.mean() > 0.02  # lines, markers, text and bands drawn
    colours = {tuple(p) for p in pixels.reshape(-1, 3)[::97].tolist()}
    assert len(colours) > 20  # more than a blank or one-colour image
    grey_band = (np.abs(pixels - 217).max(axis=2) <= 2).mean()  # "0.85" not-ready bands
    assert grey_band > 0.01


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_plot_command_renders_a_png(tmp_path, signal_files, kind):
    source = signal_files[0] if kind == "parquet" else signal_files[1]
    out = tmp_path / "chart.png"
    result = runner.invoke(app, ["plot", str(source), "--symbol", "BTCUSDT", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert_real_png(out)


def test_plot_command_errors_are_one_clear_line(tmp_path, signal_files):
    out = tmp_path / "chart.png"
    result = runner.invoke(app, ["plot", str(signal_files[0]), "-o", str(out)])
    assert result.exit_code == 2 and "pick one with --symbol" in result.output
    result = runner.invoke(app, ["plot", str(signal_files[0]), "--symbol", "NOPE", "-o", str(out)])
    assert result.exit_code == 2 and "no rows for symbol 'NOPE'" in result.output
    result = runner.invoke(app, ["plot", str(tmp_path / "missing.parquet"), "-o", str(out)])
    assert result.exit_code == 2 and "no such file" in result.output
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.parametrize("field, value", [("close", '"abc"'), ("time", '"abc"')])
def test_plot_of_rows_with_text_for_numbers_is_one_line(tmp_path, signal_files, field, value):
    lines = signal_files[1].read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(re.sub(f'"{field}":[^,]*', f'"{field}":{value}', x) for x in lines))
    out = tmp_path / "chart.png"
    result = runner.invoke(app, ["plot", str(bad), "--symbol", "BTCUSDT", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "do not hold the output schema's types" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_plot_skips_unreadable_jsonl_lines_and_says_which(tmp_path, signal_files):
    """A stray line and a last line cut short (a writer killed mid-line) are left out and
    counted; the chart is drawn from the other rows."""
    lines = signal_files[1].read_text().splitlines()
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join([*lines[:10], "garbage", *lines[10:], lines[0][:25]]))
    out = tmp_path / "chart.png"
    result = runner.invoke(app, ["plot", str(damaged), "--symbol", "BTCUSDT", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped 2 unreadable line(s): line 11: not JSON" in result.output
    assert "and 1 more" in result.output
    assert_real_png(out)
    from atc_stream.app.plot import load_signals

    frame = load_signals(damaged)
    assert len(frame) == len(lines)
    assert [line for line, _ in frame.attrs["skipped_lines"]] == [11, len(lines) + 2]
    nothing = tmp_path / "nothing.jsonl"
    nothing.write_text("garbage\n[1, 2]\n")
    result = runner.invoke(app, ["plot", str(nothing), "--symbol", "BTCUSDT", "-o", str(out)])
    assert result.exit_code == 2
    assert "no readable signal rows; line 1: not JSON" in result.output


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_plot_of_an_empty_file_says_it_has_no_rows(tmp_path, suffix):
    empty = tmp_path / f"empty{suffix}"
    empty.write_text("")
    out = tmp_path / "chart.png"
    result = runner.invoke(app, ["plot", str(empty), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"atc-stream: error: {empty}: no rows to draw"
    assert not out.exists()


def test_plot_of_one_bar_shows_the_point_on_an_axis_around_it(tmp_path):
    bars = tmp_path / "one.csv"
    bars.write_text(f"symbol,time,close\nAAA,{T0},100\n")
    rows, out = tmp_path / "one.jsonl", tmp_path / "one.png"
    result = runner.invoke(app, ["replay", str(bars), "-o", str(rows), "--no-progress"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["plot", str(rows), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from atc_stream.app.plot import load_signals

    figure = plot_signals(load_signals(rows))
    assert_one_point_shown(figure, pd.Timestamp(T0, unit="ms"))


def test_plot_backtest_of_one_bar_shows_the_point_on_an_axis_around_it():
    import pyarrow as pa

    from atc_stream import Strategy, backtest
    from atc_stream.app.plot_backtest import plot_backtest

    bars = pa.table({"symbol": ["AAA"], "time": [T0], "open": [100.0], "high": [101.0],
                     "low": [99.0], "close": [100.5]})  # fmt: skip
    figure = plot_backtest(backtest(bars, [ATCParams()], [Strategy()]), bars, "AAA")
    assert_one_point_shown(figure, pd.Timestamp(T0, unit="ms"))


def assert_one_point_shown(figure, when: pd.Timestamp) -> None:
    """Each panel's line marks its one point, on an x-axis of hours around it."""
    import matplotlib.dates as mdates

    for ax in figure.axes:
        (line, *_) = [x for x in ax.get_lines() if len(x.get_xdata()) == 1]
        assert line.get_marker() not in (None, "", "None")
        left, right = (mdates.num2date(v).replace(tzinfo=None) for v in ax.get_xlim())
        assert left < when.to_pydatetime() < right
        assert right - left <= pd.Timedelta(hours=2)


def test_plot_signals_function_on_compute_output(tmp_path):
    index = pd.date_range("2024-01-01", periods=160, freq="h", tz="UTC")
    frame = compute(pd.Series(closes_of(3), index=index))
    figure = plot_signals(frame, title="notebook")
    out = tmp_path / "nb.png"
    figure.savefig(out, dpi=110)
    assert_real_png(out)
    plain = plot_signals(compute(closes_of(3)))  # dict of arrays, bar index on the x axis
    assert len(plain.axes) == 2
    with pytest.raises(PlotError, match="lack column"):
        plot_signals({"close": [1.0]})


def test_version_flag():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"atc-stream {atc_stream.__version__}"


def test_license_and_typing_marker_ship():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    meta = pyproject["project"]
    assert meta["license"] == "MIT"
    assert "MIT License" in (REPO / "LICENSE").read_text()
    assert meta["dynamic"] == ["version"]  # read from the one place it is defined
    version_attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert version_attr == "atc_stream.core.version.__version__"
    assert importlib.metadata.version("atc-stream") == atc_stream.__version__
    assert (REPO / "atc_stream" / "py.typed").is_file()
    assert any(d.startswith("matplotlib") for d in meta["optional-dependencies"]["plot"])


@pytest.mark.parametrize("args", [[], ["cluster", "--help"]])
def test_no_command_shows_the_help_and_no_empty_error_line(capsys, args):
    from atc_stream.app.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    assert "Usage:" in out and ("replay" in out if not args else "reshard" in out)
    assert err == "" and info.value.code == (2 if not args else 0)

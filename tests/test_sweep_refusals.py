"""``atc-stream sweep`` on what users get wrong: sets that never traded, an output directory
holding their own files, a directory given as the grid, and ``plot --trades`` given the
wrong table of a sweep."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_sweep import GRID, START, ohlc_frame, run_cli
from typer.testing import CliRunner

from atc_stream.app.cli import app
from atc_stream.app.jobs.sweep_output import TABLES, write_synced
from atc_stream.app.ranking import RANK_METRICS, rank
from atc_stream.core.schema import params_metadata

#: One parameter set that becomes ready on 600 bars, one that never does.
READY_AND_NOT = "[atc]\nema_len = [20, 2000]\n"


@pytest.fixture(scope="module")
def hourly(tmp_path_factory):
    """Two symbols x 600 hourly bars, and a grid of the usual sets."""
    folder = tmp_path_factory.mktemp("hourly")
    table = ohlc_frame(symbols=("AAA", "BBB"), bars=600, seed=5)
    times = pc.add(pc.multiply(pc.subtract(table.column("time"), START), 60), START)
    data = folder / "bars.parquet"
    pq.write_table(table.set_column(1, "time", times), data)
    grid = folder / "grid.toml"
    grid.write_text(GRID)
    return data, grid


def sweep(capsys, data, grid, outdir, *extra):
    return run_cli(
        capsys, ["sweep", str(data), "--grid", str(grid), "-o", str(outdir), "--no-progress",
                 "--backend", "cpu", *extra],
    )  # fmt: skip


def one_line(code, stderr: str, needle: str) -> None:
    assert code == 2, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("atc-stream: error: ") and needle in stderr, stderr


def contents(folder) -> dict:
    """Every path under ``folder`` and the bytes of each file (None: a directory)."""
    return {p: None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


# -- sets that never traded --------------------------------------------------------------


@pytest.mark.parametrize("rank_by", list(RANK_METRICS))
@pytest.mark.parametrize("split", [None, "2024-01-10"])
def test_sets_that_never_traded_rank_after_every_set_that_did(
    capsys, tmp_path, hourly, rank_by, split
):
    """ema_len 2000 never becomes ready: 0 drawdown and 0 return, which would top a
    max_drawdown ranking, and a total_return one where the real set lost (train)."""
    data, _ = hourly
    grid = tmp_path / "grid.toml"
    grid.write_text(READY_AND_NOT)
    extra = ["--rank-by", rank_by, *(["--train-until", split] if split else [])]
    code, stdout, stderr = sweep(capsys, data, grid, tmp_path / "out", *extra)
    assert code == 0, stderr
    ranking = pq.read_table(tmp_path / "out" / "ranking.parquet")
    assert ranking.column("params_id").to_pylist() == [0, 1]
    trades = "train.trades" if split else "trades"
    assert ranking.column(trades).to_pylist()[1] == 0
    assert stdout.splitlines()[1].split()[:4] == ["1", "0", "0", "20"]
    assert (
        "note: 1 of 2 parameter sets never became ready: they need 2006+ bars a symbol and "
        "the longest history has 600, so they made no trades; they rank after every set "
        "that traded"
    ) in stderr
    made = pq.read_table(tmp_path / "out" / "trades.parquet").column("params_id")
    assert 1 not in made.to_pylist()


def test_a_set_holding_a_position_it_never_closed_is_ranked_by_its_metric():
    sets = pa.table({
        "params_id": [0, 1, 2, 3], "strategy_id": [0, 0, 0, 0],
        "total_return": [-0.1, 0.0, 0.05, None], "trades": [3, 0, 0, 0],
        "exposure": [0.8, 0.0, 0.4, None],
    })  # fmt: skip
    assert rank(sets, "total_return").tolist() == [2, 0, 1, 3]
    named = sets.rename_columns(
        [c if c.endswith("_id") else f"train.{c}" for c in sets.column_names]
    )
    assert rank(named, "total_return", "train").tolist() == [2, 0, 1, 3]


def test_the_note_says_no_set_traded_when_none_became_ready(capsys, tmp_path, hourly):
    _, grid = hourly  # ready at bar 66
    short = tmp_path / "short.parquet"
    pq.write_table(ohlc_frame(bars=30), short)
    code, _, stderr = sweep(capsys, short, grid, tmp_path / "out")
    assert code == 0, stderr
    assert "history has 30, so they made no trades\n" in stderr
    assert "partial windows" not in stderr


# -- the output directory ----------------------------------------------------------------


def _foreign_parquet(path):
    pq.write_table(pa.table({"x": [1.0, 2.0]}), path)


def _signal_file(path):  # written by atc-stream, but a replay's signals, not a sweep table
    table = pa.table({"x": [1.0]}).replace_schema_metadata(params_metadata([]))
    pq.write_table(table, path)


def _directory_of_notes(path):
    path.mkdir()
    (path / "notes.txt").write_text("mine")


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("trades.parquet", lambda p: p.write_text("precious")),
        ("metrics.parquet", _foreign_parquet),
        ("trades.parquet", _signal_file),
        ("ranking.parquet", _directory_of_notes),
        ("_SUCCESS", lambda p: p.write_text("")),
    ],
)
def test_sweep_refuses_a_table_file_it_did_not_write_before_reading(
    capsys, tmp_path, hourly, name, make
):
    _, grid = hourly
    project = tmp_path / "myproj"
    project.mkdir()
    make(project / name)
    before = contents(project)
    unreadable = tmp_path / "empty.csv"  # the output's error must come first
    unreadable.write_text("")
    code, _, stderr = sweep(capsys, unreadable, grid, project)
    said = (
        f"-o {project} holds {name}, which a sweep would replace but atc-stream did not "
        "write; give another directory, or move it away"
    )
    one_line(code, stderr, said)
    assert contents(project) == before


def test_sweep_names_how_many_foreign_files_it_found(capsys, tmp_path, hourly):
    data, grid = hourly
    for name in ("metrics", "trades"):
        (tmp_path / f"{name}.parquet").write_text("mine")
    code, _, stderr = sweep(capsys, data, grid, tmp_path)
    said = (
        "holds metrics.parquet and 1 more, which a sweep would replace but atc-stream did "
        "not write; give another directory, or move them away"
    )
    one_line(code, stderr, said)


def test_sweep_replaces_its_own_tables_and_leaves_other_files(capsys, tmp_path, hourly):
    data, grid = hourly
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for _ in range(2):
        code, _, stderr = sweep(capsys, data, grid, out)
        assert code == 0, stderr
    for name in TABLES:  # each says which table it is: how the next sweep knows it
        metadata = pq.read_schema(out / f"{name}.parquet").metadata
        assert metadata[b"atc_stream.sweep_table"] == name.encode()
    assert (out / "notes.txt").read_text() == "mine"


def test_tables_without_the_key_are_replaced_when_the_marker_lists_them(capsys, tmp_path, hourly):
    """An earlier version wrote no key: its complete set is still its own."""
    data, grid = hourly
    out = tmp_path / "out"
    code, _, stderr = sweep(capsys, data, grid, out)
    assert code == 0, stderr
    for name in TABLES:
        path = out / f"{name}.parquet"
        pq.write_table(pq.read_table(path).replace_schema_metadata(None), path)
    code, _, stderr = sweep(capsys, data, grid, out)
    assert code == 0, stderr
    params = out / "params.parquet"
    pq.write_table(pq.read_table(params).replace_schema_metadata(None), params)
    (out / "_SUCCESS").unlink()
    code, _, stderr = sweep(capsys, data, grid, out)
    one_line(code, stderr, "holds params.parquet, which a sweep would replace")


def test_a_ray_trades_dataset_of_a_sweep_is_replaced(capsys, tmp_path, hourly):
    data, grid = hourly
    out = tmp_path / "out"
    (out / "trades.parquet").mkdir(parents=True)
    write_synced(pa.table({"x": [1]}), out / "trades.parquet" / "part-00000.parquet")
    code, _, stderr = sweep(capsys, data, grid, out)
    assert code == 0, stderr
    assert (out / "trades.parquet").is_file()


def test_an_empty_output_path_is_one_line_and_writes_nothing(capsys, tmp_path, hourly, monkeypatch):
    data, grid = hourly
    monkeypatch.chdir(tmp_path)
    code, _, stderr = sweep(capsys, data, grid, "")
    one_line(code, stderr, "-o is an empty path: give the directory of the tables")
    assert list(tmp_path.iterdir()) == []


# -- the grid and the help ---------------------------------------------------------------


def test_a_directory_given_as_the_grid_is_said_first(capsys, tmp_path, hourly):
    data, _ = hourly
    code, _, stderr = sweep(capsys, data, tmp_path, tmp_path / "one")
    one_line(code, stderr, f"--grid: {tmp_path} is a directory, not a TOML grid file")
    assert not (tmp_path / "one").exists()
    code, _, stderr = sweep(capsys, data, tmp_path / "nope.toml", tmp_path / "one")
    one_line(code, stderr, f"cannot read {tmp_path / 'nope.toml'}: No such file or directory")


def test_sweep_help_names_the_output_option_it_has():
    result = CliRunner(env={"COLUMNS": "240", "NO_COLOR": "1"}).invoke(app, ["sweep", "--help"])
    assert result.exit_code == 0, result.output
    assert "OUTDIR" not in result.output
    assert "The -o directory gets metrics.parquet" in " ".join(result.output.split())


# -- plot --trades given the wrong file ---------------------------------------------------


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("", "is a directory: give its trades.parquet ({out}/trades.parquet)"),
        ("metrics.parquet", "is not a sweep's trades table (no column exit_time)"),
        (
            "params.parquet",
            "is not a sweep's trades table (no columns exit_time, symbol, strategy_id)",
        ),
    ],
)
def test_plot_trades_given_another_table_of_a_sweep_is_one_line(
    capsys, tmp_path, hourly, given, says
):
    pytest.importorskip("matplotlib")
    data, grid = hourly
    out = tmp_path / "out"
    code, _, stderr = sweep(capsys, data, grid, out)
    assert code == 0, stderr
    trades = out / given if given else out
    chart = tmp_path / "t.png"
    code, _, stderr = run_cli(
        capsys, ["plot", "--trades", str(trades), "--bars", str(data), "--symbol", "AAA",
                 "-o", str(chart)],
    )  # fmt: skip
    one_line(code, stderr, f"--trades {trades} " + says.format(out=out))
    assert not chart.exists()


def test_a_train_until_outside_the_bars_names_their_span_as_dates(capsys, tmp_path, hourly):
    data, grid = hourly
    code, _, stderr = sweep(capsys, data, grid, tmp_path / "out", "--train-until", "2030-01-01")
    one_line(code, stderr, "'2030-01-01' leaves no bars on one side")
    span = "bars span 2024-01-01T00:00:00.000Z to 2024-01-25T23:00:00.000Z"  # 600 hours
    assert span in stderr, stderr

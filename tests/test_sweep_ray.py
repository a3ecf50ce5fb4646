"""``atc-stream sweep --ray``: the blocks on a local Ray instance give the one-process
sweep's tables row for row; a bad or unreachable ``--ray-address`` is one line and exit 2;
a plain sweep never imports ray."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sweep import GRID, ohlc_frame, run_cli

from atc_stream.app.jobs.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("metrics", "ranking", "params", "strategies")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep_ray")
    data = folder / "bars.parquet"
    pq.write_table(ohlc_frame(symbols=("AAA", "BBB", "CCC", "DDD"), bars=200), data)
    grid = folder / "grid.toml"
    grid.write_text(GRID)
    return data, grid


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    # "local": a new instance even where a cluster of another run is found (its address
    # file), which ray.init would otherwise join, refusing num_cpus
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def sweep(data, grid, outdir, **options) -> None:
    assert run_sweep(
        data=data, grid=grid, outdir=outdir, train_until=options.pop("train_until", None),
        top=3, rank_by="total_return", backend="cpu", progress=False, **options,
    ) == 0  # fmt: skip


@pytest.mark.ray
@pytest.mark.parametrize("train_until", [None, "2024-01-01T02:00:00Z"])
@pytest.mark.parametrize("chunk_streams", [4096, 5, 1])
def test_ray_sweep_equals_the_one_process_sweep(
    local_ray, files, tmp_path, capsys, train_until, chunk_streams
):
    data, grid = files
    # chunks of symbols as the one-process sweep runs them; with 1, Ray also cuts each
    # symbol's parameter sets and strategies into blocks of one stream
    sweep(data, grid, tmp_path / "one", train_until=train_until, chunk_streams=chunk_streams)
    sweep(
        data, grid, tmp_path / "ray", train_until=train_until, ray=True,
        chunk_streams=chunk_streams,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "rank" in out
    parts = sorted((tmp_path / "ray" / "trades.parquet").iterdir())
    assert parts and all(p.name.startswith("part-") for p in parts)
    one = pq.read_table(tmp_path / "one" / "trades.parquet")
    assert one.num_rows > 0
    assert pq.read_table(tmp_path / "ray" / "trades.parquet").equals(one)
    for name in TABLES:
        mine = pq.read_table(tmp_path / "ray" / f"{name}.parquet")
        assert mine.equals(pq.read_table(tmp_path / "one" / f"{name}.parquet")), name


@pytest.mark.ray
def test_ray_sweep_replaces_a_one_process_trades_file(local_ray, files, tmp_path, capsys):
    data, grid = files
    sweep(data, grid, tmp_path)
    one = pq.read_table(tmp_path / "trades.parquet")
    sweep(data, grid, tmp_path, ray=True)
    sweep(data, grid, tmp_path, ray=True, chunk_streams=1)  # more parts, none left over
    assert (tmp_path / "trades.parquet").is_dir()
    assert pq.read_table(tmp_path / "trades.parquet").equals(one)
    whole_set = sorted(["_SUCCESS", *(f"{t}.parquet" for t in (*TABLES, "trades"))])
    assert sorted(p.name for p in tmp_path.iterdir()) == whole_set  # nothing staged is left
    sweep(data, grid, tmp_path)  # and a one-process table replaces the dataset
    assert (tmp_path / "trades.parquet").is_file()
    assert pq.read_table(tmp_path / "trades.parquet").equals(one)
    assert sorted(p.name for p in tmp_path.iterdir()) == whole_set


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("127.0.0.1:1", "cannot reach the Ray cluster at '127.0.0.1:1'"),
        ("no-port", "is not HOST:PORT"),
        ("host:99999", "is not HOST:PORT"),
    ],
)
def test_a_bad_or_unreachable_ray_address_is_one_line(capsys, tmp_path, files, address, says):
    pytest.importorskip("ray")
    data, grid = files
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path), "--no-progress"]
    code, _, err = run_cli(capsys, [*args, "--ray", "--ray-address", address])
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1


def test_an_address_where_no_ray_head_answers_is_one_line(capsys, tmp_path, files):
    """A server that accepts the connection but does not speak gRPC (Ray would retry it
    for minutes)."""
    pytest.importorskip("ray")
    server = socket.create_server(("127.0.0.1", 0))

    def answer_like_http_1():
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer_like_http_1, daemon=True).start()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    data, grid = files
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path), "--no-progress"]
    try:
        code, _, err = run_cli(capsys, [*args, "--ray", "--ray-address", address])
    finally:
        server.close()
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "does not answer like a Ray head" in err


def test_ray_address_needs_ray(capsys, tmp_path, files):
    data, grid = files
    args = ["sweep", str(data), "--grid", str(grid), "-o", str(tmp_path), "--no-progress"]
    code, _, err = run_cli(capsys, [*args, "--ray-address", "127.0.0.1:1"])
    assert code == 2 and "--ray-address needs --ray" in err


def test_a_plain_sweep_does_not_import_ray(tmp_path, files):
    data, grid = files
    script = textwrap.dedent(f"""
        import sys
        from atc_stream.app.cli import main
        try:
            main(["sweep", {str(data)!r}, "--grid", {str(grid)!r}, "-o", {str(tmp_path)!r},
                  "--no-progress", "--backend", "cpu"])
        except SystemExit as exc:
            assert not exc.code, exc.code
        assert "ray" not in sys.modules, "a plain sweep imported ray"
        print("no ray")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no ray" in done.stdout


@pytest.mark.ray
def test_ray_sweep_reads_a_dataset_directory(local_ray, files, tmp_path, capsys):
    """DATA as a dataset: a directory of Parquet and CSV parts, symbols spread over them."""
    from pyarrow import csv

    data, grid = files
    table = pq.read_table(data)
    parts = tmp_path / "dataset"
    parts.mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), parts / "part-0.parquet")
    csv.write_csv(table.slice(half), parts / "part-1.csv")
    sweep(data, grid, tmp_path / "one")
    sweep(parts, grid, tmp_path / "ray", ray=True)
    capsys.readouterr()
    one = pq.read_table(tmp_path / "one" / "trades.parquet")
    assert pq.read_table(tmp_path / "ray" / "trades.parquet").equals(one)
    for name in TABLES:
        mine = pq.read_table(tmp_path / "ray" / f"{name}.parquet")
        assert mine.equals(pq.read_table(tmp_path / "one" / f"{name}.parquet")), name

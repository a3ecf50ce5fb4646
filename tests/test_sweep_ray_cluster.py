"""``atc-stream sweep --ray --ray-address ADDR`` on a two-node Ray cluster (one CPU each,
``ray.cluster_utils.Cluster``): the tables equal the one-process sweep's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_sweep import GRID, ohlc_frame, run_cli

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    two = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    two.add_node(num_cpus=1)
    two.wait_for_nodes()
    yield two
    two.shutdown()


def test_sweep_on_two_nodes_equals_one_process(cluster, tmp_path, capsys):
    import ray

    data = tmp_path / "bars.parquet"
    pq.write_table(ohlc_frame(symbols=("AAA", "BBB", "CCC"), bars=150), data)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    args = ["sweep", str(data), "--grid", str(grid), "--no-progress", "--backend", "cpu",
            "--train-until", "2024-01-01T01:30:00Z"]  # fmt: skip
    code, _, err = run_cli(capsys, [*args, "-o", str(tmp_path / "one")])
    assert code == 0, err
    code, _, err = run_cli(
        capsys, [*args, "-o", str(tmp_path / "ray"), "--ray", "--ray-address", cluster.address]
    )
    assert code == 0, err
    assert not ray.is_initialized()  # the run joined the cluster and left it
    for name in ("trades", "metrics", "ranking"):
        ray_table = pq.read_table(tmp_path / "ray" / f"{name}.parquet")
        assert same(ray_table, pq.read_table(tmp_path / "one" / f"{name}.parquet")), name


def same(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and columns, NaN equal to NaN (a set without train trades has a NaN
    win rate)."""
    if a.schema != b.schema:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        if pa.types.is_floating(x.type):
            if not np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True):
                return False
        elif x.to_pylist() != y.to_pylist():
            return False
    return True

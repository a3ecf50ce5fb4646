"""``replay --shard-snapshots N --snapshot-to TARGET``: a backfill that leaves one snapshot
per shard, each restorable and equal to replaying that shard's symbols alone."""

from __future__ import annotations

import numpy as np
import pytest
from parts_helpers import canonical, play
from redis_fixtures import redis_server, redis_url  # noqa: F401

from atc_stream import Engine
from atc_stream.app.cli import main
from atc_stream.app.durability import open_snapshot_store
from atc_stream.core.shards import shard_namespace, shard_of
from atc_stream.state.snapshot import read_header

MINUTE = 60_000
SYMBOLS = [f"SYM{i}" for i in range(7)]
PARAMS_JSON = (
    '[{"ema_len": 9, "hma_len": 9, "wma_len": 9, "dema_len": 9, "lsma_len": 9, "kama_len": 9},'
    ' {"ema_len": 12}]'
)


def walks(symbols, bars: int, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s: 100 * np.exp(np.cumsum(rng.normal(0, 0.01, bars))) for s in symbols}


def write_csv(path, closes: dict[str, np.ndarray], start: int = 0) -> None:
    lines = ["symbol,time,close"]
    for s, c in closes.items():
        # symbols start at different times, so warmups and steps interleave
        offset = int(s.removeprefix("SYM")) % 3
        lines += [f"{s},{(i + start) * MINUTE},{float(c[i])!r}" for i in range(offset, len(c))]
    path.write_text("\n".join(lines) + "\n")


def replay(capsys, tmp_path, data, *extra: str) -> tuple[int, str]:
    params = tmp_path / "params.json"
    params.write_text(PARAMS_JSON)
    args = ["replay", str(data), "--params", str(params), "-o", str(tmp_path / "out.jsonl"),
            "--warmup", "20", "--no-progress", "--backend", "cpu", "--interval", "1m"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main([*args, *extra])
    return info.value.code or 0, capsys.readouterr().err


def latest(target, shard: int) -> bytes:
    blob = open_snapshot_store(target, namespace=shard_namespace(shard)).load_latest()
    assert blob is not None
    return blob


def test_each_shard_snapshot_equals_replaying_its_symbols_alone(capsys, tmp_path):
    closes = walks(SYMBOLS, 60)
    write_csv(tmp_path / "all.csv", closes)
    shards = 3
    target = tmp_path / "shards"
    code, err = replay(capsys, tmp_path, tmp_path / "all.csv",
                       "--shard-snapshots", str(shards), "--snapshot-to", str(target))  # fmt: skip
    assert code == 0, err
    assert "shard-2:" in err
    more = walks(SYMBOLS, 70, seed=9)
    for s in SYMBOLS:
        more[s][:60] = closes[s]
    for shard in range(shards):
        mine = [s for s in SYMBOLS if shard_of(s, shards) == shard]
        blob = latest(target, shard)
        assert read_header(blob).source_offsets["backfill"]["shard"] == shard
        restored = Engine.restore(blob, backend="cpu", outputs="all")
        assert restored.symbols == sorted(mine)
        alone_dir = tmp_path / f"alone{shard}"
        alone_dir.mkdir()
        write_csv(alone_dir / "part.csv", {s: closes[s] for s in mine})
        alone_options = ["--shard-snapshots", "1", "--snapshot-to", str(alone_dir / "snap")]
        code, err = replay(capsys, alone_dir, alone_dir / "part.csv", *alone_options)
        assert code == 0, err
        alone = Engine.restore(latest(alone_dir / "snap", 0), backend="cpu", outputs="all")
        assert alone.streams == restored.streams
        for key in alone.streams:
            assert alone.stream_state(key) == restored.stream_state(key)
        if mine:  # both go on alike, bit for bit
            assert canonical(play(restored, more, 60, 10, False)) == canonical(
                play(alone, more, 60, 10, False)
            )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--shard-snapshots", "2"], "--shard-snapshots needs --snapshot-to"),
        (["--snapshot-to", "x"], "--snapshot-to needs --shard-snapshots"),
        (["--shard-snapshots", "0", "--snapshot-to", "x"], "must be at least 1"),
    ],
)
def test_shard_options_are_checked_before_any_work(capsys, tmp_path, extra, says):
    write_csv(tmp_path / "all.csv", walks(SYMBOLS[:2], 30))
    code, err = replay(capsys, tmp_path, tmp_path / "all.csv", *extra)
    assert code == 2 and says in err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.redis
def test_shard_snapshots_in_redis_under_each_namespace(capsys, tmp_path, redis_url):  # noqa: F811
    closes = walks(SYMBOLS, 40)
    write_csv(tmp_path / "all.csv", closes)
    code, err = replay(capsys, tmp_path, tmp_path / "all.csv",
                       "--shard-snapshots", "2", "--snapshot-to", redis_url)  # fmt: skip
    assert code == 0, err
    local = tmp_path / "local"
    code, err = replay(capsys, tmp_path, tmp_path / "all.csv",
                       "--shard-snapshots", "2", "--snapshot-to", str(local))  # fmt: skip
    assert code == 0, err
    for shard in range(2):
        in_redis = Engine.restore(latest(redis_url, shard), backend="cpu")
        on_disk = Engine.restore(latest(local, shard), backend="cpu")
        assert in_redis.streams == on_disk.streams
        assert in_redis.symbols == sorted(s for s in SYMBOLS if shard_of(s, 2) == shard)
        for key in in_redis.streams:
            assert in_redis.stream_state(key) == on_disk.stream_state(key)

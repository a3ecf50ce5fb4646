"""``atc-stream run-stream``: its refusals, summary counts and messages (real redis-server)."""

from __future__ import annotations

import re

import pytest
from redis_fixtures import redis_server, redis_url  # noqa: F401
from test_cli_redis import add_bars, one_error_line

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

T0 = 1_700_000_000_000
MINUTE = 60_000


def client_of(url: str):
    import redis

    return redis.Redis.from_url(url)


def run_stream(url: str, *args: str) -> list[str]:
    return ["run-stream", "--redis", url, "--input-stream", "bars", "--backend", "cpu", *args]


@pytest.mark.parametrize("extra", [[], ["--snapshot-every", "10"], ["--strategy", "stop=0.02"]])
def test_a_run_without_an_output_is_refused_before_reading(extra, redis_url, run_main):  # noqa: F811
    """Neither --output-stream nor --publish: every entry would be applied and acknowledged
    with its rows written nowhere. Refused before the group is made or a snapshot taken."""
    client = client_of(redis_url)
    add_bars(client, "bars")
    args = run_stream(redis_url, "--group", "nog", "--stop-when-idle", "1", *extra)
    code, stderr = run_main(args)
    assert code == 2
    line = one_error_line(stderr)
    assert stderr.strip().splitlines() == [line]
    assert "--output-stream" in line and "--publish" in line and "go nowhere" in line
    assert client.xinfo_groups("bars") == [] and client.keys("*") == [b"bars"]
    client.close()


def summary_value(stderr: str, name: str) -> str:
    """The value of one line of the closing summary (``  bars applied     5 (...)``)."""
    (value,) = re.findall(rf"^  {name} +(.*)$", stderr, re.MULTILINE)
    return value


@pytest.mark.parametrize("param_sets", [1, 2])
def test_bars_applied_leaves_out_the_bars_the_engine_rejected(
    param_sets,
    tmp_path,
    redis_url,  # noqa: F811
    run_main,
):
    """Read = applied + malformed + rejected; a bar fanned out to two parameter sets is
    rejected (and counted) once, and gives one row per set."""
    client = client_of(redis_url)
    entries = [
        (T0, "100"), (T0 + MINUTE, "inf"), (T0 + MINUTE, "-5"), (T0 + MINUTE, "nan"),
        (T0, "101"), (T0 - MINUTE, "99"), (T0 + MINUTE, "101"), (T0 + 2 * MINUTE, "102"),
        (T0 + MINUTE, "100"), (T0 + 3 * MINUTE, "abc"), (T0 + 3 * MINUTE, "103"),
        (T0 + 4 * MINUTE, "104"),
    ]  # fmt: skip
    for time_, close in entries:
        client.xadd("bars", {"symbol": "A", "time": time_, "close": close})
    params = tmp_path / "params.json"
    params.write_text('[{}, {"ema_len": 20}]' if param_sets == 2 else "[{}]")
    args = run_stream(redis_url, "--output-stream", "sig", "--stop-when-idle", "0.3")
    code, stderr = run_main([*args, "--params", str(params)])
    assert code == 0, stderr
    assert summary_value(stderr, "entries read") == "12 in 1 batches"
    assert summary_value(stderr, "bars applied").startswith("5 (")
    assert summary_value(stderr, "rows out").startswith(f"{5 * param_sets} (")
    assert summary_value(stderr, "malformed") == "bad_close=1"
    assert summary_value(stderr, "rejected bars") == (
        "duplicate_bar=1, non_finite_close=2, non_positive_close=1, out_of_order_bar=2"
    )
    assert client.xlen("sig") == 5 * param_sets
    client.close()


def test_paper_trading_bars_applied_leaves_out_bad_ohlc(redis_url, run_main):  # noqa: F811
    client = client_of(redis_url)
    prices = [(100, 101, 99), (100, 90, 95), (101, 102, 100), (101, 99, 100), (102, 103, 101)]
    for i, (open_, high, low) in enumerate(prices):
        client.xadd("bars", {"symbol": "A", "time": T0 + i * MINUTE, "open": open_,
                             "high": high, "low": low, "close": open_})  # fmt: skip
    args = run_stream(redis_url, "--output-stream", "sig", "--stop-when-idle", "0.3")
    code, stderr = run_main([*args, "--strategy", "stop=0.02"])
    assert code == 0, stderr
    assert summary_value(stderr, "bars applied").startswith("3 (")
    assert summary_value(stderr, "rows out").startswith("3 (")
    assert summary_value(stderr, "rejected bars") == "bad_ohlc=2"
    client.close()


def test_the_publish_summary_counts_the_rows_delivered(redis_url, run_main):  # noqa: F811
    client = client_of(redis_url)
    total = add_bars(client, "bars")
    code, stderr = run_main(run_stream(redis_url, "--publish", "--stop-when-idle", "0.3"))
    assert code == 0, stderr
    assert re.search(rf"steps delivered, 0 dropped \({total} rows delivered, 0 dropped\)", stderr)
    assert summary_value(stderr, "rows out").startswith(f"{total} (")
    client.close()


@pytest.mark.parametrize(
    "store, fresh",
    [([], "another --namespace"), (["--snapshot-dir"], "another --snapshot-dir or --namespace")],
)
def test_a_resume_that_differs_from_the_snapshot_names_the_option_to_start_fresh(
    store,
    fresh,
    tmp_path,
    redis_url,  # noqa: F811
    run_main,
):
    """Snapshots in Redis (no --snapshot-dir) are kept apart by --namespace: the refusal
    names that, not a --snapshot-dir the run was not given."""
    client = client_of(redis_url)
    add_bars(client, "bars")
    options = ["--output-stream", "sig", "--snapshot-every", "100000", "--stop-when-idle", "0.3"]
    options += [*store, str(tmp_path / "snaps")] if store else []
    code, stderr = run_main(run_stream(redis_url, *options))
    assert code == 0 and "final snapshot" in stderr, stderr
    params = tmp_path / "params.json"
    params.write_text('[{"ema_len": 20}]')
    for differing in (["--interval", "5m"], ["--params", str(params)], ["--strategy", "stop=0.02"]):
        code, stderr = run_main(run_stream(redis_url, *options, "--resume", *differing))
        assert code == 2
        line = one_error_line(stderr)
        assert "differ" in line and line.endswith(f"start fresh with {fresh}"), line
        assert ("--snapshot-dir" in line) == bool(store)
    client.close()


HOUR = 60 * MINUTE


def hourly_bars(client, key: str = "bars", n: int = 30) -> None:
    for i in range(n):
        for symbol in ("A", "B"):
            client.xadd(key, {"symbol": symbol, "time": T0 + i * HOUR, "close": 100 + i % 7})


def output_intervals(client, key: str) -> set[bytes]:
    return {fields[b"key"].split(b":")[1] for _, fields in client.xrange(key)}


def test_the_interval_is_inferred_from_the_bars_the_stream_holds(redis_url, run_main):  # noqa: F811
    """Entries carry no interval: hourly bars are labelled 1h, not the 1m default."""
    client = client_of(redis_url)
    hourly_bars(client)
    code, stderr = run_main(run_stream(redis_url, "--output-stream", "sig", "--stop-when-idle",
                                       "0.3"))  # fmt: skip
    assert code == 0, stderr
    assert "interval 1h, inferred from the spacing of the bars it holds" in stderr
    assert output_intervals(client, "sig") == {b"1h"}
    client.close()


def test_an_interval_the_bars_contradict_is_refused_before_reading(redis_url, run_main):  # noqa: F811
    client = client_of(redis_url)
    hourly_bars(client)
    args = run_stream(redis_url, "--output-stream", "sig", "--stop-when-idle", "0.3")
    code, stderr = run_main([*args, "--interval", "1m"])
    assert code == 2
    line = one_error_line(stderr)
    assert "--interval 1m does not match the bars of bars, which are 1h apart" in line, line
    assert not client.exists("sig") and client.xinfo_groups("bars") == []
    code, stderr = run_main([*args, "--interval", "1h"])
    assert code == 0 and "interval 1h, from --interval" in stderr, stderr
    client.close()


def test_an_empty_stream_is_labelled_with_the_default_said_on_the_start_line(
    redis_url,  # noqa: F811
    run_main,
):
    client = client_of(redis_url)
    code, stderr = run_main(run_stream(redis_url, "--output-stream", "sig", "--stop-when-idle",
                                       "0.3"))  # fmt: skip
    assert code == 0, stderr
    assert "interval 1m, the default: bars holds no two bars of a symbol" in stderr
    assert "give --interval" in stderr
    client.close()


def test_a_resumed_run_keeps_the_snapshots_interval(tmp_path, redis_url, run_main):  # noqa: F811
    client = client_of(redis_url)
    hourly_bars(client, n=10)
    options = ["--output-stream", "sig", "--snapshot-dir", str(tmp_path / "s"), "--resume",
               "--stop-when-idle", "0.3"]  # fmt: skip
    code, stderr = run_main(run_stream(redis_url, *options))
    assert code == 0 and "interval 1h, inferred" in stderr, stderr
    client.xadd("bars", {"symbol": "A", "time": T0 + 10 * HOUR, "close": 100})
    code, stderr = run_main(run_stream(redis_url, *options))
    assert code == 0 and "interval 1h, the snapshot's" in stderr, stderr
    assert summary_value(stderr, "bars applied").startswith("1 (")
    assert output_intervals(client, "sig") == {b"1h"}
    client.close()


def test_a_bad_interval_names_the_option(redis_url, run_main):  # noqa: F811
    code, stderr = run_main(run_stream(redis_url, "--output-stream", "sig", "--interval", "1min"))
    assert code == 2
    assert "Invalid value for --interval:" in one_error_line(stderr) and "got '1min'" in stderr


def test_the_stream_is_read_in_pages_up_to_the_sample(redis_url):  # noqa: F811
    from atc_stream.connectors.redis.stream_spacing import stream_interval

    client = client_of(redis_url)
    for i in range(10):  # A every 5 minutes, then B every hour after entry 10
        client.xadd("bars", {"symbol": "A", "time": T0 + i * 5 * MINUTE, "close": 1})
    client.xadd("bars", {"symbol": "A", "time": "yesterday", "close": 1})  # left out
    for i in range(30):
        client.xadd("bars", {"symbol": "B", "time": T0 + i * HOUR, "close": 1})
    assert stream_interval(client, "bars", page=3, sample=11) == "5m"
    assert stream_interval(client, "bars", page=4) == "1h"  # 29 gaps of 1h, 9 of 5m
    assert stream_interval(client, "missing") is None
    client.close()

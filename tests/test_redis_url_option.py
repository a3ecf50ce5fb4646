"""``--redis`` takes only a URL redis-py can connect to: anything else is refused in one
line before the command does anything, on every command that has the option and in a
``--config`` file."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("url", ["notaurl", "http://127.0.0.1:6379", "localhost:6379"])
@pytest.mark.parametrize(
    "command",
    [
        ["live", "--symbols", "BTCUSDT"],
        ["replay", "bars.csv"],
        ["subscribe"],
        ["run-stream", "--input-stream", "bars"],
        ["cluster", "status"],
    ],
)
def test_a_value_that_is_no_redis_url_is_one_line(command, url, run_main):
    code, stderr = run_main([*command, "--redis", url])
    (line,) = stderr.strip().splitlines()
    assert code == 2
    assert line.startswith("atc-stream: error: Invalid value for --redis: ")
    assert f"{url!r} is not a Redis URL; give redis://HOST:PORT" in line


def test_a_config_file_redis_value_is_checked_too(tmp_path, run_main):
    config = tmp_path / "live.toml"
    config.write_text('symbols = "BTCUSDT"\nredis = "localhost:6379"\n')
    code, stderr = run_main(["live", "--config", str(config)])
    (line,) = stderr.strip().splitlines()
    assert code == 2 and "key 'redis': 'localhost:6379' is not a Redis URL" in line


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "rediss://h:6380", "unix:///tmp/r.sock"])
def test_the_redis_schemes_pass_the_check(url):
    from atc_stream.app.options import check_redis_url

    assert check_redis_url(url) == url


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/prod", "rediss://h:6380/1/2", "redis://h/٣"]
)
def test_a_database_that_is_not_a_number_is_one_line(url, run_main):
    """redis-py would connect to database 0 without a word: refused before anything runs."""
    code, stderr = run_main(["subscribe", "--redis", url])
    (line,) = stderr.strip().splitlines()
    assert code == 2 and "is not a number" in line


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379", "redis://127.0.0.1:6379/", "redis://h:1/15", "unix:///s?db=2"]
)
def test_a_numbered_or_absent_database_passes_the_check(url):
    from atc_stream.app.options import check_redis_url

    assert check_redis_url(url) == url

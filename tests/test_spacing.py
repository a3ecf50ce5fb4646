"""The interval of bars from their spacing, calendar months included."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from atc_stream.core.spacing import common_interval


def ms(*date) -> int:
    return int(dt.datetime(*date, tzinfo=dt.timezone.utc).timestamp() * 1000)


def label(times: list[int]) -> str | None:
    t = np.array(times, np.int64)
    return common_interval(t[:-1], np.diff(t))


def test_bars_opening_on_the_first_of_each_month_are_1M_not_31d():
    firsts = [ms(2023 + (m // 12), m % 12 + 1, 1) for m in range(30)]
    assert label(firsts) == "1M"
    mid_month = [ms(2023 + (m // 12), m % 12 + 1, 15, 9, 30) for m in range(30)]
    assert label(mid_month) == "1M"


@pytest.mark.parametrize(
    "step, expected", [(60_000, "1m"), (86_400_000, "1d"), (30 * 86_400_000, "30d")]
)
def test_fixed_gaps_keep_their_label(step, expected):
    assert label([ms(2024, 1, 1) + i * step for i in range(40)]) == expected


def test_31_day_gaps_that_are_not_months_stay_31d():
    assert label([ms(2024, 1, 1) + i * 31 * 86_400_000 for i in range(40)]) == "31d"


def test_no_gaps_no_label():
    assert common_interval(np.zeros(0, np.int64), np.zeros(0, np.int64)) is None


def test_replay_labels_monthly_bars_1M(tmp_path, run_main):
    bars = tmp_path / "monthly.csv"
    firsts = [ms(2020 + (m // 12), m % 12 + 1, 1) for m in range(80)]
    rows = [f"SPX,{t},{3000 + 10 * i}" for i, t in enumerate(firsts)]
    bars.write_text("symbol,time,close\n" + "\n".join(rows) + "\n")
    out = tmp_path / "o.jsonl"
    code, err = run_main(["replay", str(bars), "-o", str(out), "--no-progress"])
    assert code == 0, err
    assert '"interval":"1M"' in out.read_text().splitlines()[-1]
    code, err = run_main(["replay", str(bars), "--interval", "31d", "-o", str(out)])
    assert code == 2 and "which are 1M apart" in err, err

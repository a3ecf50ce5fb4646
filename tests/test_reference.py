"""Tests for the full-history reference ATC (atc_stream/reference.py).

Two kinds: the reference must reproduce every golden vector (continuous columns to
1e-9, NaN positions identical, discrete columns exactly), and small hand-checkable
unit tests of each building block against hand values or independent numpy formulas.
"""

from __future__ import annotations

import functools
import math
import operator

import numpy as np
import pytest
from golden_data import golden_dir, load_golden_cases

from atc_stream.core.params import FAMILIES, N_MAS, ATCParams
from atc_stream.core.reference import (
    OUTPUT_COLUMNS,
    Equity,
    compute_reference,
    cut,
    dema_series,
    ema_series,
    kama_series,
    lsma_series,
    round2,
    signal_series,
    sma_series,
    wma_series,
)

ATOL = 1e-9

# ---------------------------------------------------------------------------
# Golden vectors
# ---------------------------------------------------------------------------

CASES = {case[0]: case for case in load_golden_cases()}
DISCRETE = ("long", "short")
CONTINUOUS = tuple(c for c in OUTPUT_COLUMNS if c not in DISCRETE)


def test_golden_cases_present() -> None:
    assert CASES, f"no golden cases found in {golden_dir()}"


def test_output_columns_match_golden_header() -> None:
    for _name, _params, _closes, expected in CASES.values():
        assert list(expected) == ["bar_index", *OUTPUT_COLUMNS]


@pytest.fixture(scope="module")
def golden_results() -> dict[str, dict[str, np.ndarray]]:
    return {name: compute_reference(c[2], c[1]) for name, c in CASES.items()}


def _assert_close_with_nans(name: str, col: str, got: np.ndarray, exp: np.ndarray) -> None:
    got_nan, exp_nan = np.isnan(got), np.isnan(exp)
    mism = np.flatnonzero(got_nan != exp_nan)
    assert mism.size == 0, (
        f"{name}/{col}: NaN positions differ, first at bar {mism[0]} "
        f"(got {got[mism[0]]!r}, expected {exp[mism[0]]!r})"
    )
    diff = np.abs(np.where(got_nan, 0.0, got) - np.where(exp_nan, 0.0, exp))
    bad = np.flatnonzero(diff > ATOL)
    assert bad.size == 0, (
        f"{name}/{col}: {bad.size} bars differ by > {ATOL}, first at bar {bad[0]} "
        f"(got {got[bad[0]]!r}, expected {exp[bad[0]]!r})"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_continuous(name: str, golden_results) -> None:
    _, _params, closes, expected = CASES[name]
    got = golden_results[name]
    assert len(got["close"]) == len(closes)
    np.testing.assert_array_equal(got["bar_index"], expected["bar_index"])
    np.testing.assert_array_equal(got["close"], closes)
    for col in CONTINUOUS:
        _assert_close_with_nans(name, col, got[col], expected[col])


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_discrete(name: str, golden_results) -> None:
    _, params, _closes, expected = CASES[name]
    got = golden_results[name]
    for col in DISCRETE:
        bad = np.flatnonzero(got[col] != expected[col])
        assert bad.size == 0, f"{name}/{col}: differs at bars {bad[:10].tolist()}"
    for family in FAMILIES:
        col = f"{family}_Signal"
        got_cut = np.array([cut(x, params.cut) for x in got[col]])
        exp_cut = np.array([cut(x, params.cut) for x in expected[col]])
        bad = np.flatnonzero(got_cut != exp_cut)
        assert bad.size == 0, f"{name}/Cut({col}): differs at bars {bad[:10].tolist()}"


# ---------------------------------------------------------------------------
# Moving averages on tiny series
# ---------------------------------------------------------------------------

TINY = [2.0, 4.0, 3.0, 5.0, 7.0, 6.0, 8.0]


def _random_closes(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n)))


def _assert_series(got: list[float], expected: list[float], atol: float = 1e-12) -> None:
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=0, atol=atol)


def test_sma_by_hand() -> None:
    _assert_series(sma_series(TINY, 3), [math.nan, math.nan, 3.0, 4.0, 5.0, 6.0, 7.0])


def test_sma_matches_numpy() -> None:
    c = _random_closes(50)
    got = np.array(sma_series(list(c), 7))
    exp = np.convolve(c, np.ones(7) / 7, mode="valid")
    np.testing.assert_allclose(got[6:], exp, rtol=0, atol=1e-9)


def test_ema_by_hand() -> None:
    # L = 3 -> alpha = 0.5, seeded with SMA(3) = 3 at bar 2.
    _assert_series(ema_series(TINY, 3), [math.nan, math.nan, 3.0, 4.0, 5.5, 5.75, 6.875])


def test_wma_by_hand() -> None:
    exp = [math.nan, math.nan, 19 / 6, 25 / 6, 34 / 6, 37 / 6, 43 / 6]
    _assert_series(wma_series(TINY, 3), exp)


def test_wma_matches_numpy() -> None:
    c = _random_closes(40, seed=1)
    L = 6
    w = np.arange(1, L + 1, dtype=float)
    got = np.array(wma_series(list(c), L))
    exp = [np.dot(w, c[i - L + 1 : i + 1]) / w.sum() for i in range(L - 1, len(c))]
    np.testing.assert_allclose(got[L - 1 :], exp, rtol=0, atol=1e-9)


def test_dema_by_hand() -> None:
    # L = 2 -> alpha = 2/3. e1 = [na, 3, 3, 13/3, 55/9]; e2 seeded at bar 2 with
    # (3 + 3) / 2 = 3, then 35/9, 145/27.  DEMA = 2*e1 - e2.
    got = dema_series([2.0, 4.0, 3.0, 5.0, 7.0], 2)
    _assert_series(got, [math.nan, math.nan, 3.0, 43 / 9, 185 / 27])


def test_dema_matches_independent_formula() -> None:
    c = _random_closes(60, seed=2)
    L = 5
    alpha = 2 / (L + 1)
    e1 = np.full(len(c), np.nan)
    e1[L - 1] = c[:L].mean()
    for i in range(L, len(c)):
        e1[i] = alpha * c[i] + (1 - alpha) * e1[i - 1]
    e2 = np.full(len(c), np.nan)
    e2[2 * L - 2] = e1[L - 1 : 2 * L - 1].mean()
    for i in range(2 * L - 1, len(c)):
        e2[i] = alpha * e1[i] + (1 - alpha) * e2[i - 1]
    exp = 2 * e1 - e2
    np.testing.assert_allclose(np.array(dema_series(list(c), L)), exp, rtol=0, atol=1e-9)


def test_lsma_matches_polyfit() -> None:
    c = _random_closes(40, seed=3)
    for L in (2, 3, 7, 15):
        got = np.array(lsma_series(list(c), L))
        x = np.arange(L, dtype=float)
        for i in range(L - 1, len(c)):
            slope, intercept = np.polyfit(x, c[i - L + 1 : i + 1], 1)
            assert abs(got[i] - (intercept + slope * (L - 1))) < 1e-9, (L, i)


def test_lsma_of_a_line_is_its_last_point() -> None:
    line = [10.0 + 0.5 * k for k in range(8)]
    _assert_series(lsma_series(line, 4)[3:], line[3:])


def test_lsma_length_one_is_nan() -> None:
    # L = 1: the denominator L*sxx - sx*sx is 0 -> na, never ZeroDivisionError.
    assert all(math.isnan(v) for v in lsma_series(TINY, 1))


def test_kama_by_hand() -> None:
    c = [2.0, 4.0, 3.0, 5.0]
    s0 = 0.064**2  # ratio 0 while i < L
    k0 = 0.0 + s0 * (2.0 - 0.0)  # starts from 0, not from the first close
    k1 = k0 + s0 * (4.0 - k0)
    t2 = (1.0 / 3.0) * (0.666 - 0.064) + 0.064  # signal |3-2| = 1, noise 2 + 1 = 3
    k2 = k1 + t2 * t2 * (3.0 - k1)
    t3 = (1.0 / 3.0) * (0.666 - 0.064) + 0.064  # signal |5-4| = 1, noise 1 + 2 = 3
    k3 = k2 + t3 * t3 * (5.0 - k2)
    _assert_series(kama_series(c, 2), [k0, k1, k2, k3], atol=1e-15)


def test_kama_zero_noise_uses_slow_constant() -> None:
    # Constant series: noise == 0 -> ratio 0 -> smooth = slow^2 on every bar.
    s = 0.064**2
    got = kama_series([5.0] * 10, 3)
    exp = [5.0 * (1.0 - (1.0 - s) ** (i + 1)) for i in range(10)]
    _assert_series(got, exp, atol=1e-12)


def test_kama_matches_independent_formula() -> None:
    c = _random_closes(50, seed=4)
    L = 6
    k = np.zeros(len(c))
    prev = 0.0
    for i in range(len(c)):
        ratio = 0.0
        if i >= L:
            noise = np.abs(np.diff(c[i - L : i + 1])).sum()
            ratio = abs(c[i] - c[i - L]) / noise if noise != 0 else 0.0
        sm = (ratio * (0.666 - 0.064) + 0.064) ** 2
        prev = prev + sm * (c[i] - prev)
        k[i] = prev
    np.testing.assert_allclose(np.array(kama_series(list(c), L)), k, rtol=0, atol=1e-9)


# Canonical arithmetic: sequential sums from 0.0, oldest first, bit for bit. The
# expected values below are spelled independently with functools.reduce.


def _seq_sum(values) -> float:
    return functools.reduce(operator.add, values, 0.0)


CANON_L = 28
CANON_CLOSES = _random_closes(120, seed=11)


def test_canonical_data_distinguishes_summation_orders() -> None:
    # Sanity check that the bit-exact tests below can fail: numpy's pairwise/unrolled
    # sum lands on a different double than the sequential sum on some windows.
    c, L = CANON_CLOSES, CANON_L
    differs = [
        np.sum(c[i - L + 1 : i + 1]) != _seq_sum(c[i - L + 1 : i + 1]) for i in range(L - 1, len(c))
    ]
    assert any(differs)


def test_canonical_sma_and_ema_seed_bit_exact() -> None:
    c, L = list(CANON_CLOSES), CANON_L
    sma = sma_series(c, L)
    for i in range(L - 1, len(c)):
        assert sma[i] == _seq_sum(c[i - L + 1 : i + 1]) / L, i
    ema = ema_series(c, L)
    assert ema[L - 1] == sma[L - 1]
    alpha = 2.0 / (L + 1)
    assert ema[L] == alpha * c[L] + (1.0 - alpha) * ema[L - 1]


def test_canonical_dema_seed_bit_exact() -> None:
    c, L = list(CANON_CLOSES), CANON_L
    e1 = ema_series(c, L)
    e2_seed = _seq_sum(e1[L - 1 : 2 * L - 1]) / L
    assert dema_series(c, L)[2 * L - 2] == 2.0 * e1[2 * L - 2] - e2_seed


def test_canonical_wma_bit_exact() -> None:
    c, L = list(CANON_CLOSES), CANON_L
    wma = wma_series(c, L)
    for i in range(L - 1, len(c)):
        window = c[i - L + 1 : i + 1]
        acc = _seq_sum(j * y for j, y in enumerate(window, start=1))
        assert wma[i] == acc / (L * (L + 1) / 2), i


def test_canonical_lsma_bit_exact() -> None:
    c, L = list(CANON_CLOSES), CANON_L
    lsma = lsma_series(c, L)
    sx, sxx = L * (L - 1) / 2, (L - 1) * L * (2 * L - 1) / 6
    for i in range(L - 1, len(c)):
        window = c[i - L + 1 : i + 1]
        sy = _seq_sum(window)
        sxy = _seq_sum(j * y for j, y in enumerate(window))
        slope = (L * sxy - sx * sy) / (L * sxx - sx * sx)
        intercept = (sy - slope * sx) / L
        assert lsma[i] == intercept + slope * (L - 1), i


def test_canonical_kama_bit_exact() -> None:
    c, L = list(CANON_CLOSES), CANON_L
    kama = kama_series(c, L)
    prev = 0.0
    for i in range(len(c)):
        ratio = 0.0
        if i >= L:
            noise = _seq_sum(abs(c[m + 1] - c[m]) for m in range(i - L, i))  # oldest pair first
            ratio = abs(c[i] - c[i - L]) / noise if noise != 0 else 0.0
        t = ratio * (0.666 - 0.064) + 0.064
        prev = prev + (t * t) * (c[i] - prev)
        assert kama[i] == prev, i


@pytest.mark.parametrize(
    "fn, first_defined",
    [
        (sma_series, lambda L: L - 1),
        (ema_series, lambda L: L - 1),
        (wma_series, lambda L: L - 1),
        (lsma_series, lambda L: L - 1),
        (dema_series, lambda L: 2 * L - 2),
        (kama_series, lambda L: 0),
    ],
    ids=["SMA", "EMA", "WMA", "LSMA", "DEMA", "KAMA"],
)
@pytest.mark.parametrize("L", [2, 5, 9])
def test_warmup_lengths(fn, first_defined, L: int) -> None:
    got = np.array(fn(list(_random_closes(30, seed=L)), L))
    first = first_defined(L)
    assert np.all(np.isnan(got[:first])), f"na expected while i < {first}"
    assert not np.any(np.isnan(got[first:])), f"defined expected from bar {first}"


def test_compute_reference_ma_columns_use_canonical_order() -> None:
    params = ATCParams(
        robustness="Narrow", ema_len=5, hma_len=6, wma_len=7, dema_len=8, lsma_len=9, kama_len=10
    )
    c = _random_closes(40, seed=5)
    out = compute_reference(c, params)
    j = 0
    fns = {
        "EMA": ema_series,
        "HMA": sma_series,
        "WMA": wma_series,
        "DEMA": dema_series,
        "LSMA": lsma_series,
        "KAMA": kama_series,
    }
    for family in FAMILIES:
        for L in params.family_lengths(family):
            exp = np.array(fns[family](list(c), L))
            np.testing.assert_array_equal(out["ma"][:, j], exp, err_msg=f"{family}({L})")
            np.testing.assert_array_equal(out["sig"][:, j], signal_series(list(c), list(exp)))
            j += 1
    assert j == N_MAS


# ---------------------------------------------------------------------------
# Signal, equity, layers
# ---------------------------------------------------------------------------


def test_signal_crossings_are_persistent() -> None:
    closes = [1.0, 1.0, 3.0, 3.0, 1.0, 1.0, 2.0]
    ma = [math.nan, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    # bar 1: c1/m1 na -> no change; bar 2: up-cross -> 1; bar 4: down-cross -> -1;
    # bar 6: c == m is no cross -> stays -1.
    assert signal_series(closes, ma) == [0.0, 0.0, 1.0, 1.0, -1.0, -1.0, -1.0]


def test_signal_touch_then_cross_counts() -> None:
    # c[1] == m[1] counts as "at or below", so leaving a tie upwards is an up-cross.
    assert signal_series([2.0, 3.0], [2.0, 2.0]) == [0.0, 1.0]
    assert signal_series([2.0, 1.0], [2.0, 2.0]) == [0.0, -1.0]


def test_round2_and_cut() -> None:
    assert round2(0.125) == 0.13
    assert round2(-0.125) == -0.12  # floor(x + 0.5), not round-half-away
    assert round2(1.0 / 3.0) == 0.33
    assert cut(0.5, 0.49) == 1.0
    assert cut(0.49, 0.49) == 0.0
    assert cut(-0.5, 0.49) == -1.0
    assert cut(math.nan, 0.49) == 0.0


def test_equity_by_hand() -> None:
    params = ATCParams(La=0.02, De=0.03)
    lam, d = params.lam, params.decay
    eq = Equity(2.0, params)
    assert eq.step(0, math.nan, math.nan) == 2.0  # first active bar: e = start
    # s[1] = 1 -> a = r = R * exp(lam * 1)
    r1 = 0.01 * math.exp(lam * 1)
    assert eq.step(1, 1.0, 0.01) == (2.0 * d) * (1.0 + r1)
    e1 = (2.0 * d) * (1.0 + r1)
    # s[1] = 0 -> a keeps its previous value (does not reset to 0)
    assert eq.step(2, 0.0, 0.05) == (e1 * d) * (1.0 + r1)
    e2 = (e1 * d) * (1.0 + r1)
    # s[1] = -1 -> a = -r
    r3 = 0.02 * math.exp(lam * 3)
    assert eq.step(3, -1.0, 0.02) == (e2 * d) * (1.0 - r3)


def test_equity_floor() -> None:
    eq = Equity(1.0, ATCParams())
    values = [eq.step(0, math.nan, math.nan)]
    for i in range(1, 6):
        values.append(eq.step(i, 1.0, -0.5))  # long into a 50% drop every bar
    assert values[0] == 1.0
    assert 0.25 < values[1] < 0.5
    assert values[2:] == [0.25] * 4
    # Recovery from the floor uses e[1] = 0.25.
    assert eq.step(6, 1.0, 0.1) == (0.25 * ATCParams().decay) * (1.0 + 0.1 * math.exp(6 * 2e-5))


def test_equity_cutout_semantics() -> None:
    params = ATCParams(cutout=3)
    lam, d = params.lam, params.decay
    eq = Equity(1.5, params)
    # Inactive bars return na and change nothing, even with a signal present.
    assert all(math.isnan(eq.step(i, 1.0, 0.1)) for i in range(3))
    assert eq.a == 0.0 and math.isnan(eq.e)
    # First active bar: a is updated from s[1] (here 1 -> a = R * exp(0)), e = start.
    assert eq.step(3, 1.0, 0.1) == 1.5
    assert eq.a == 0.1
    # Next bar with s[1] = 0: a keeps the value set on the first active bar.
    assert eq.step(4, 0.0, 0.2) == (1.5 * d) * (1.0 + 0.1)
    r5 = 0.3 * math.exp(lam * 2)
    assert eq.step(5, -1.0, 0.3) == ((1.5 * d) * 1.1 * d) * (1.0 - r5)


def test_compute_reference_equity_floor_reached() -> None:
    # Dip (so the fast MAs cross up), rise, then a crash: long layer-1 equities hit 0.25.
    closes = [100.0 - k for k in range(10)] + [91.0 + 2 * k for k in range(15)] + [20.0] * 5
    params = ATCParams(
        robustness="Narrow", ema_len=5, hma_len=5, wma_len=5, dema_len=5, lsma_len=5, kama_len=5
    )
    out = compute_reference(closes, params)
    eq = out["equity"]
    assert np.nanmin(eq) == 0.25
    assert np.all(eq[~np.isnan(eq)] >= 0.25)
    for family in FAMILIES:
        assert np.all(out[f"{family}_S"] >= 0.25)


def test_compute_reference_cutout() -> None:
    c = _random_closes(120, seed=6)
    base = dict(
        robustness="Narrow",
        ema_len=10,
        hma_len=12,
        wma_len=14,
        dema_len=9,
        lsma_len=20,
        kama_len=8,
        hma_w=0.5,
        wma_w=2.0,
    )
    k = 30
    p0 = ATCParams(**base)
    pk = ATCParams(**base, cutout=k)
    out0, outk = compute_reference(c, p0), compute_reference(c, pk)
    # MAs and per-MA signals do not depend on cutout.
    np.testing.assert_array_equal(out0["ma"], outk["ma"])
    np.testing.assert_array_equal(out0["sig"], outk["sig"])
    # Everything equity-based is na before cutout and defined from it.
    assert np.all(np.isnan(outk["growth"][:k])) and outk["growth"][k] == 1.0
    # math.exp, not np.exp: numpy's vectorised exp can differ from libm by an ulp.
    exp_growth = [math.exp(pk.lam * (i - k)) for i in range(k, 120)]
    np.testing.assert_array_equal(outk["growth"][k:], exp_growth)
    assert np.all(np.isnan(outk["equity"][:k])) and np.all(outk["equity"][k] == 1.0)
    assert not np.any(np.isnan(outk["equity"][k:]))
    for col in OUTPUT_COLUMNS:
        if col in ("long", "short"):
            assert np.all(outk[col][:k] == 0)
        else:
            assert np.all(np.isnan(outk[col][:k])), col
            assert not np.any(np.isnan(outk[col][k:])), col
    # First active bar: layer-1 signal is the plain mean of the sigs, S_f = w_f.
    sig_k = outk["sig"][k].reshape(len(FAMILIES), -1)
    for f, family in enumerate(FAMILIES):
        assert outk[f"{family}_Signal"][k] == round2(sig_k[f].sum() / sig_k.shape[1])
        assert outk[f"{family}_S"][k] == pk.weights[f]
    num = sum(
        cut(outk[f"{f}_Signal"][k], pk.cut) * w for f, w in zip(FAMILIES, pk.weights, strict=True)
    )
    assert outk["Average_Signal"][k] == pytest.approx(num / sum(pk.weights), abs=1e-15)
    # Without cutout, growth starts at bar 0.
    assert out0["growth"][0] == 1.0 and not np.any(np.isnan(out0["Average_Signal"]))


def test_compute_reference_shapes_and_dtypes() -> None:
    T = 35
    out = compute_reference(_random_closes(T, seed=7))
    assert out["bar_index"].dtype == np.int64
    np.testing.assert_array_equal(out["bar_index"], np.arange(T))
    for col in ("long", "short"):
        assert out[col].dtype == np.int64 and set(np.unique(out[col])) <= {0, 1}
    for col in ("close", "growth", *CONTINUOUS):
        assert out[col].shape == (T,) and out[col].dtype == np.float64, col
    for key in ("ma", "sig", "equity"):
        assert out[key].shape == (T, N_MAS) and out[key].dtype == np.float64, key
    assert set(np.unique(out["sig"])) <= {-1.0, 0.0, 1.0}
    assert compute_reference([])["ma"].shape == (0, N_MAS)


def test_events_need_opposite_prior_direction() -> None:
    out = compute_reference(_random_closes(400, seed=8))
    avg, lt, st = out["Average_Signal"], 0.1, -0.1
    direction = math.nan
    for i in range(len(avg)):
        prev = avg[i - 1] if i else math.nan
        up = avg[i] > lt and prev <= lt
        down = avg[i] < st and prev >= st
        assert out["long"][i] == int(up and direction == -1)
        assert out["short"][i] == int(down and direction == 1)
        direction = 1 if up else (-1 if down else direction)
    assert out["long"].sum() + out["short"].sum() > 0  # the walk actually has events


@pytest.mark.parametrize(
    "bad",
    [
        [[100.0, 101.0], [102.0, 103.0]],  # 2-D
        [100.0, math.nan, 101.0],
        [100.0, math.inf],
        [100.0, 0.0, 101.0],
        [100.0, -1.0],
        ["a", "b"],
    ],
    ids=["2d", "nan", "inf", "zero", "negative", "strings"],
)
def test_invalid_closes_raise(bad) -> None:
    with pytest.raises(ValueError, match="closes"):
        compute_reference(bad)

"""A shared run for the requested-outputs tests (CPU in test_requested_outputs.py, CUDA
under the simulator in test_cuda_sim.py): one engine per output subset, driven through
warmup, one-update steps, a repeated shuffled slot set, two-round steps with rejected
updates, and previews (one of a slot twice); every column it returns must equal the
same column of an engine that returns all outputs, bit for bit and in the narrow type."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from short_params import SHORT, SHORT_UNCUT

from atc_stream.core import schema
from atc_stream.engine.engine import Engine

#: ``SHORT`` with weights, cut and thresholds off their defaults
SHORT_WEIGHTED = replace(
    SHORT, ema_w=1.5, kama_w=0.5, cut=0.3, long_threshold=0.02, short_threshold=-0.02
)

#: subsets checked: the default, each group alone, mixes, none, and all
SUBSETS = [
    None, ("signal",), ("events",), ("layers",), ("equities",), ("growth",),
    ("signal", "layers"), ("events", "equities", "growth"), (), "all",
]  # fmt: skip

T0, BAR = 1_700_000_000_000, 60_000
N_STREAMS, N_BARS, WARM = 4, 48, 24


def _closes() -> np.ndarray:
    rng = np.random.default_rng(17)
    walk = np.exp(np.cumsum(rng.normal(0, 0.02, (N_STREAMS, N_BARS)), 1))
    return np.round(rng.uniform(50, 150, N_STREAMS)[:, None] * walk, 2)


def drive(backend: str, outputs) -> list:
    """The results of one engine with ``outputs`` over the whole scenario."""
    closes = _closes()
    t = T0 + BAR * np.arange(N_BARS, dtype=np.int64)
    names = [f"S{i}" for i in range(N_STREAMS)]
    eng = Engine([SHORT_WEIGHTED, SHORT_UNCUT], backend=backend, capacity=2, outputs=outputs)
    results = [eng.warmup({s: (t[:WARM], closes[i, :WARM]) for i, s in enumerate(names)})]
    nxt = [WARM] * N_STREAMS  # the next bar of each stream

    def bar(i, price=None):
        j = nxt[i]
        nxt[i] += 1
        return names[i], int(t[j]), float(closes[i, j] if price is None else price)

    for _ in range(3):  # one bar of one symbol: m = 2 updates (two parameter sets)
        results.append(eng.step([bar(0)]))
    slots = np.array([eng.slot_of(eng.streams[k]) for k in (0,)], np.int64)
    for _ in range(2):  # m = 1: one stream, array path
        j = nxt[0]
        nxt[0] += 1
        results.append(eng.step_arrays(slots, np.array([t[j]]), np.array([closes[0, j]])))
    shuffled = [5, 1, 6, 0, 2, 7, 3]  # stream indices: each once, not in slot order
    keys = eng.streams
    for _ in range(4):  # a repeated, out-of-order slot set (the cached plan on CUDA)
        rows = [keys[k] for k in shuffled]
        slot_list = np.array([eng.slot_of(k) for k in rows], np.int64)
        sym = [int(k.symbol[1:]) for k in rows]
        j = [nxt[i] for i in sym]
        # a symbol's two parameter sets get the same bar
        ts = np.array([t[x] for x in j], np.int64)
        cs = np.array([closes[i, x] for i, x in zip(sym, j, strict=True)])
        results.append(eng.step_arrays(slot_list, ts, cs))
        for i in set(sym):
            nxt[i] += 1
    # two rounds per symbol, a duplicate, an unknown symbol and a bad close
    two = [bar(1), bar(2), bar(1), bar(3), bar(2), bar(0)]
    two += [(names[3], two[3][1], 99.0), ("NOPE", int(t[0]), 1.0), (names[0], int(t[-1]), -1.0)]
    results.append(eng.step(two))
    j = nxt[2]
    results.append(eng.preview([(names[2], int(t[j]), 77.0), (names[2], int(t[j]), 78.5)]))
    results.append(eng.preview([bar(1, 0.0)]))  # rejected: nothing applies
    results.append(eng.step([bar(i) for i in range(N_STREAMS)]))
    return results


def assert_subset_matches(subset_results: list, full_results: list, outputs) -> None:
    """Each subset result carries exactly its columns, equal to the full result's."""
    groups = schema.resolve_outputs(outputs)
    names = schema.columns_for(groups)
    assert len(subset_results) == len(full_results)
    for k, (sub, full) in enumerate(zip(subset_results, full_results, strict=True)):
        assert sub.column_names == names, (k, sub.column_names)
        assert np.array_equal(sub.slots, full.slots), k
        got, want = sub.columns(), full.columns()
        assert tuple(got) == names
        for name in names:
            assert got[name].dtype == want[name].dtype, (k, name, got[name].dtype)
            same = np.array_equal(got[name], want[name], equal_nan=got[name].dtype.kind == "f")
            assert same, f"result {k} column {name}: {got[name]!r} != {want[name]!r}"
            if got[name].dtype.kind == "f":  # bit for bit, not only ==
                assert np.array_equal(got[name].view(np.int64), want[name].view(np.int64)), name
        for field, values in sub.fields.items():
            assert values.dtype == schema.FIELD_DTYPES[field], (field, values.dtype)
        assert set(sub.fields) == set(schema.fields_for(groups))
